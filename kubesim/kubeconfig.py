"""A kubeconfig that points any Kubernetes client at a running simulator."""

from __future__ import annotations

from pathlib import Path

import yaml


def kubeconfig_dict(base_url: str, name: str = "taugrid-sim", namespace: str = "default",
                    token: str | None = None, ca_file: str | None = None) -> dict[str, object]:
    """Kubeconfig content: one cluster (server URL; its CA, or no verification), one user (the
    simulator's admin, or the user of `token`: kubesim/rbac.py), one current context."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": base_url, **(
            {"certificate-authority": ca_file} if ca_file else {"insecure-skip-tls-verify": True})}}],
        "users": [{"name": name, "user": {"token": token} if token else {}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": namespace}}],
        "current-context": name,
        "preferences": {},
    }


def write_kubeconfig(path: Path, base_url: str, name: str = "taugrid-sim", *, namespace: str = "default",
                     token: str | None = None, ca_file: str | None = None) -> Path:
    """Write a kubeconfig for `base_url` to `path` (parents created, mode 0600); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(kubeconfig_dict(base_url, name, namespace, token, ca_file), sort_keys=False))
    path.chmod(0o600)
    return path
