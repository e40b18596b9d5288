"""A kubeconfig that points any Kubernetes client at a running simulator."""

from __future__ import annotations

from pathlib import Path

import yaml


def kubeconfig_dict(base_url: str, name: str = "taugrid-sim", namespace: str = "default") -> dict[str, object]:
    """Kubeconfig content: one cluster (server URL, no TLS, no auth), one user, one current context."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": base_url, "insecure-skip-tls-verify": True}}],
        "users": [{"name": name, "user": {}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": namespace}}],
        "current-context": name,
        "preferences": {},
    }


def write_kubeconfig(path: Path, base_url: str, name: str = "taugrid-sim") -> Path:
    """Write a kubeconfig for `base_url` to `path` (parents created, mode 0600); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(kubeconfig_dict(base_url, name), sort_keys=False))
    path.chmod(0o600)
    return path
