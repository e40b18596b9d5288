"""`taugrid-evidence agent`: the click command, importing only the agent (no controller, no kubernetes)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import click

from collector.logfmt import setup_json_logging
from collector.malloc import fix_mmap_threshold

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def in_cluster_api(env: Mapping[str, str], account: Path = SERVICE_ACCOUNT) -> tuple[str, Path, Path] | None:
    """(API server URL, token file, CA bundle) of the pod's service account; None outside a cluster."""
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port.isdigit():
        return None
    if ":" in host:  # IPv6
        host = f"[{host}]"
    return f"https://{host}:{port}", account / "token", account / "ca.crt"


@click.command()
@click.option("--address", default="127.0.0.1:9402", show_default=True, help="HOST:PORT for /metrics, /evidence, "
              "/healthz, /readyz (beyond loopback: with --token-file).")
@click.option("--token-file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="/metrics and /evidence require `Authorization: Bearer <the token in this file>` "
              "(re-read on change).")
@click.option("--tls-cert-file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Serve HTTPS with this certificate (PEM; with --tls-private-key-file).")
@click.option("--tls-private-key-file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="The certificate's private key (PEM).")
@click.option("--allow-unauthenticated", is_flag=True, default=False,
              help="Serve beyond loopback without --token-file (only where a NetworkPolicy guards the port).")
@click.option("--node", default="", help="This node's name (the DaemonSet passes spec.nodeName).")
@click.option("--pod-resources-socket", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("/var/lib/kubelet/pod-resources/kubelet.sock"), show_default=True)
@click.option("--log-root", type=click.Path(file_okay=False, path_type=Path), default=Path("/var/log/pods"),
              show_default=True, help="The kubelet's pod log directory.")
@click.option("--log-scope", type=click.Choice(["gpu", "all"]), default="gpu", show_default=True,
              help="Follow containers of pods holding GPUs, or of every pod.")
@click.option("--namespace", "namespaces", multiple=True, help="Only follow logs in these namespaces (repeatable).")
@click.option("--kmsg", default="/dev/kmsg", show_default=True, help="Kernel log to follow for XIDs ('' to turn off).")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where log offsets persist across restarts (a hostPath).")
@click.option("--sample-interval", type=float, default=1.0, show_default=True, help="Seconds between NVML samples.")
@click.option("--dra-driver", "dra_drivers", multiple=True,
              help="A DRA driver whose ResourceClaim devices are GPUs (repeatable; default: the NVIDIA driver's "
              "names, gpu.nvidia.com and gpu.resource.nvidia.com).")
@click.option("--resource-slices/--no-resource-slices", default=False, show_default=True,
              help="Read this node's ResourceSlices from the API server (in-cluster service account; needs get/list "
              "on resource.k8s.io resourceslices) to name the GPU behind each DRA device, MIG instances included.")
def agent(address: str, token_file: Path | None, tls_cert_file: Path | None, tls_private_key_file: Path | None,
          allow_unauthenticated: bool, node: str, pod_resources_socket: Path, log_root: Path, log_scope: str,
          namespaces: tuple[str, ...], kmsg: str, state_dir: Path | None, sample_interval: float,
          dra_drivers: tuple[str, ...], resource_slices: bool) -> None:
    """The node agent: GPU readings with pod attribution, XIDs and node-local log evidence."""
    # here, not at the top: `taugrid-evidence controller` registers this command, and the agent's
    # modules (pod-resources gRPC, protobuf, h2, NVML) would cost the controller ~4.5 MiB of RSS
    from collector.agent.agent import exposure_problem, run_agent
    from collector.agent.settings import AgentSettings, LogSettings

    api = in_cluster_api(os.environ) if resource_slices else None
    if resource_slices and (api is None or not node):
        raise click.UsageError("--resource-slices needs --node and the in-cluster API server "
                               "(KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT)")
    setup_json_logging()
    settings = AgentSettings(
        node=node, address=address, sample_interval_s=sample_interval, podresources_socket=pod_resources_socket,
        kmsg_path=Path(kmsg) if kmsg else None, state_dir=state_dir,
        logs=LogSettings(root=log_root, scope=log_scope, namespaces=frozenset(namespaces)),
        token_file=token_file, tls_cert_file=tls_cert_file, tls_key_file=tls_private_key_file,
        allow_unauthenticated=allow_unauthenticated,
    )
    if dra_drivers:
        settings = replace(settings, dra_drivers=dra_drivers)
    if api is not None:
        settings = replace(settings, api_server=api[0], api_token_file=api[1], api_ca_file=api[2])
    problem = exposure_problem(settings)
    if problem:
        raise click.UsageError(problem)
    # before any thread starts: each /evidence document (~1 MiB of JSON at 50 containers) is built on
    # an HTTP worker thread, whose freed blocks otherwise sat in that thread's malloc arena
    fix_mmap_threshold()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        code = run_agent(settings, stop)
    except (OSError, ValueError) as e:  # busy port, bad certificate or key, empty token file
        raise click.ClickException(f"cannot serve on {address}: {e}") from e
    sys.exit(code)
