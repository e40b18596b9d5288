"""The official Kubernetes client, imported for the parts the collector uses.

`import kubernetes.client` first runs `kubernetes/__init__.py`, which imports every subpackage:
`dynamic` (kubernetes_validate, jsonschema, referencing), `config` and its `kube_config`
(google-auth, oauthlib, requests, cryptography), `stream`, `watch`, `leaderelection`, `informer`.
The collector uses the `ApiClient` transport, its `Configuration`, `ApiException` and the two
config loaders; the rest cost about 20 MiB of RSS in every controller (docs/benchmarks.md;
the node agent imports no Kubernetes client at all). So the `kubernetes` and `kubernetes.config`
packages are registered with their `__init__` deferred: submodules import as usual, and the first
attribute asked of either package that is not yet there runs its own `__init__`, so code that uses
the package whole (tests, a user's plugin) sees it exactly as a plain import would have made it.
`kube_config` itself is imported only when a kubeconfig file is loaded; in a cluster it never is.

Where `kubernetes` was imported before this module, nothing is deferred.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from typing import Any

_lock = threading.RLock()


def _defer_package_init(name: str) -> None:
    """Register package `name` with its `__init__` run on the first attribute it lacks."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return  # not an importable package: the import below fails with the usual error
    module = importlib.util.module_from_spec(spec)
    loader = spec.loader
    started = False

    def complete(attr: str) -> Any:
        # Held while __init__ runs: another thread asking for a name it has not set yet waits for
        # it here. The thread running it comes back in (its `from . import x`) and must not restart it.
        nonlocal started
        with _lock:
            if not started:
                started = True
                loader.exec_module(module)  # what `import name` would have run, once
                if module.__dict__.get("__getattr__") is complete:
                    del module.__dict__["__getattr__"]
        try:
            return module.__dict__[attr]
        except KeyError:
            raise AttributeError(f"module {name!r} has no attribute {attr!r}") from None

    module.__dict__["__getattr__"] = complete
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)  # as the import system binds a loaded submodule


with _lock:
    _defer_package_init("kubernetes")
    _defer_package_init("kubernetes.config")

# These must follow the registration above (they would otherwise run the packages' __init__).
from kubernetes.client.api_client import ApiClient  # noqa: E402
from kubernetes.client.configuration import Configuration  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402
from kubernetes.config.config_exception import ConfigException  # noqa: E402
from kubernetes.config.incluster_config import load_incluster_config  # noqa: E402


def load_kube_config(config_file: str, context: str | None, client_configuration: Configuration) -> None:
    """`kubernetes.config.load_kube_config`, imported on first use (it brings the auth plugins)."""
    from kubernetes.config.kube_config import load_kube_config as load

    load(config_file=config_file, context=context,  # type: ignore[no-untyped-call]  # unannotated upstream
         client_configuration=client_configuration)


__all__ = ["ApiClient", "ApiException", "ConfigException", "Configuration", "load_incluster_config",
           "load_kube_config"]
