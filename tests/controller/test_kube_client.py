"""The official client imported for what the collector uses (collector/sources/kube_client.py):
the controller's modules leave the client's unused subpackages unimported, and the `kubernetes`
package still works whole for anything that asks for it. Each check runs in a fresh interpreter:
this test process imported `kubernetes` long ago."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

UNUSED = ("kubernetes.dynamic", "kubernetes.config.kube_config", "kubernetes.stream", "kubernetes.watch",
          "kubernetes.leaderelection", "kubernetes.informer", "google.auth", "kubernetes_validate", "jsonschema")


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_controller_does_not_import_the_clients_unused_parts() -> None:
    loaded = _run(f"""
        import sys
        import collector.cli, collector.controller
        print(sorted(m for m in {UNUSED!r} if m in sys.modules))
        """)
    assert loaded == "[]"


def test_the_package_is_whole_for_whoever_asks() -> None:
    """Attributes of the deferred packages run their own __init__: the names a plain import gives,
    the same classes the collector holds, from several threads at once."""
    out = _run("""
        import threading
        import collector.sources.kube_client as kc
        import kubernetes
        seen = []
        def ask():
            seen.append((kubernetes.__version__, kubernetes.config.load_kube_config.__module__,
                         kubernetes.client.V1Pod.__name__, kubernetes.watch.Watch.__name__,
                         kubernetes.dynamic.DynamicClient.__name__))
        threads = [threading.Thread(target=ask) for _ in range(8)]
        for t in threads: t.start()
        for t in threads: t.join()
        from kubernetes import client, config
        assert len(set(seen)) == 1 and len(seen) == 8, seen
        assert client.ApiClient is kc.ApiClient and config.ConfigException is kc.ConfigException
        assert config.load_incluster_config is kc.load_incluster_config
        print(seen[0][1:])
        try:
            kubernetes.no_such_thing
        except AttributeError as e:
            print(e)
        """)
    lines = out.splitlines()
    assert lines[0] == "('kubernetes.config.kube_config', 'V1Pod', 'Watch', 'DynamicClient')"
    assert lines[1] == "module 'kubernetes' has no attribute 'no_such_thing'"


def test_a_kubeconfig_loads_its_loader_on_first_use(tmp_path: Path) -> None:
    kc = tmp_path / "kubeconfig"
    kc.write_text(textwrap.dedent("""
        apiVersion: v1
        kind: Config
        clusters: [{name: c, cluster: {server: "https://10.1.2.3:6443", insecure-skip-tls-verify: true}}]
        users: [{name: u, user: {token: abc}}]
        contexts: [{name: x, context: {cluster: c, user: u}}]
        current-context: x
        """))
    out = _run(f"""
        import sys
        from collector.sources.kube_api import load_api_client
        before = "kubernetes.config.kube_config" in sys.modules
        api = load_api_client({str(kc)!r})
        print(before, "kubernetes.config.kube_config" in sys.modules, api.configuration.host)
        """)
    assert out == "False True https://10.1.2.3:6443"
