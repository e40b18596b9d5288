"""A stalled two-worker run with planted secrets and NCCL flight-recorder dumps, as a cluster dump.

Flight-recorder dumps use PyTorch's real dump fields (torch/csrc/distributed/c10d/FlightRecorder.hpp:
version, pg_config, pg_status, entries with record_id, pg_id, process_group, collective_seq_id,
p2p_seq_id, op_id, profiling_name, time_created_ns, input/output sizes and dtypes, state,
time_discovered_started_ns, time_discovered_completed_ns, retired, timeout_ms, is_p2p); the
pickled form is what `pickle_str` writes for a dict of plain values.
"""

from __future__ import annotations

import json
import pickle
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tests.dumpkit import event, pod, write_dump
from tests.test_explain_fixtures import taurun

NOW = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
RUN, NS = "llm-pretrain", "research"
RANKS_PER_POD = 8
HUNG_SEQ = 1580
LATE_RANK = 13  # never reaches collective 1580: the suspect

# Every shape the redactor knows, planted in env, annotations and logs. None may survive.
SECRETS = {
    "env-password": "Tr0ub4dor-and-3-horses",
    "env-hf-token": "hf_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7",
    "env-account-key": "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==",
    "annotation-token": "annot-9f8e7d6c5b4a39281706",
    "applied-config-secret": "applied-Zx9Yw8Vu7Ts6",
    "log-wandb": "wandb-4c3b2a1908f7e6d5c4b3a291",
    "log-bearer": "eyJhbGciOiJIUzI1NiJ9zzqq.bearertokenvalue0123456789",
    "log-sas": "sv2024xSIGabcdef0123456789ABCDEF%2Bxyz%3D",
    "log-github": "ghp_" + "0123456789abcdefghijABCDEFGHIJ012345",
    "log-aws": "AKIA" + "IOSFODNN7EXAMPLE",
    "log-pem-body": "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7",
    "log-url-password": "s3cr3t-url-pass",
    "log-openai": "sk-" + "proj0123456789abcdefghijklmnop",
}


def _ts(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")


def train_log(pod_index: int, *, steps: int = 40, stall_at: datetime | None = None) -> str:
    """kubectl logs --timestamps of a Megatron trainer that stops advancing, then the NCCL watchdog fires."""
    start = NOW - timedelta(minutes=50)
    lines = [f"{_ts(start)} export WANDB_API_KEY={SECRETS['log-wandb']}",
             f"{_ts(start)} curl -H 'Authorization: Bearer {SECRETS['log-bearer']}' https://example.invalid/x",
             f"{_ts(start)} reading https://acct.blob.core.windows.net/data/shard-0?sv=2024-05-04&sig="
             f"{SECRETS['log-sas']}",
             f"{_ts(start)} git clone https://{SECRETS['log-github']}@github.com/org/repo",
             f"{_ts(start)} AWS_ACCESS_KEY_ID={SECRETS['log-aws']}",
             f"{_ts(start)} mongodb://trainer:{SECRETS['log-url-password']}@db.example.invalid:27017/runs",
             f"{_ts(start)} OPENAI key {SECRETS['log-openai']}",
             f"{_ts(start)} -----BEGIN PRIVATE KEY-----",
             f"{_ts(start)} {SECRETS['log-pem-body']}",
             f"{_ts(start)} -----END PRIVATE KEY-----"]
    for i in range(steps):
        t = start + timedelta(seconds=30 * i)
        lines.append(f"{_ts(t)}  iteration {i + 1:>8}/  250000 | consumed samples: {1024 * (i + 1):>12} | "
                     f"elapsed time per iteration (ms): 30000.0 | learning rate: 9.150E-06 | global batch size:  1024 "
                     f"| lm loss: {2.5 - i * 0.001:.6E} | loss scale: 1.0 | grad norm: 0.231 | "
                     f"number of skipped iterations:   0 | number of nan iterations:   0 |")
    hang = stall_at or NOW - timedelta(minutes=10)
    for r in range(pod_index * RANKS_PER_POD, pod_index * RANKS_PER_POD + 2):
        lines.append(f"{_ts(hang)} [rank{r}]:[E321 11:50:00.408271257 ProcessGroupNCCL.cpp:607] [Rank {r}] "
                     f"Watchdog caught collective operation timeout: WorkNCCL(SeqNum={HUNG_SEQ}, OpType=ALLREDUCE, "
                     f"NumelIn=466119168, NumelOut=466119168, Timeout(ms)=600000) ran for 600060 milliseconds "
                     f"before timing out.")
    return "\n".join(lines) + "\n"


def fr_dump(rank: int, world: int, *, last_enqueued: int, last_completed: int, entries: int = 6,
            op: str = "nccl:all_reduce", sizes: list[list[int]] | None = None) -> dict[str, Any]:
    """One rank's flight-recorder dump (dict form shared by the JSON and pickle writers)."""
    base_ns = int((NOW - timedelta(minutes=20)).timestamp() * 1e9)
    ents = []
    first = last_enqueued - entries + 1
    for i, seq in enumerate(range(first, last_enqueued + 1)):
        done = seq <= last_completed
        started = done or seq == last_completed + 1
        ents.append({
            "record_id": 9000 + i, "pg_id": 0, "process_group": ["0", "default_pg"],
            "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq,
            "profiling_name": op, "time_created_ns": base_ns + i * 30_000_000_000,
            "duration_ms": 41.5 if done else None,
            "input_sizes": sizes or [[466119168]], "input_dtypes": ["BFloat16"],
            "output_sizes": sizes or [[466119168]], "output_dtypes": ["BFloat16"],
            "state": "completed" if done else ("started" if started else "scheduled"),
            "time_discovered_started_ns": base_ns + i * 30_000_000_000 + 1000 if started else 0,
            "time_discovered_completed_ns": base_ns + i * 30_000_000_000 + 42_000_000 if done else 0,
            "retired": done, "timeout_ms": 600000, "is_p2p": False,
            "frames": [{"name": "all_reduce", "filename": "torch/distributed/distributed_c10d.py", "line": 2696},
                       {"name": "train_step", "filename": "/workspace/pretrain_gpt.py", "line": 412}],
        })
    for e in ents:
        if e["duration_ms"] is None:
            del e["duration_ms"]
    return {
        "version": "2.4",
        "comm_lib_version": "2.21.5",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))}},
        "pg_status": {"0": {"last_enqueued_collective": last_enqueued, "last_started_collective":
                            min(last_enqueued, last_completed + 1), "last_completed_collective": last_completed}},
        "entries": ents,
    }


def as_json_dump(d: dict[str, Any]) -> bytes:
    """The JSON form writes pg_status values as strings and absent times as 0, like dump_json does."""
    j = json.loads(json.dumps(d))
    for s in j["pg_status"].values():
        for k in list(s):
            s[k] = str(s[k])
    for e in j["entries"]:
        e.pop("frames", None)
    return json.dumps(j).encode()


def as_pickle_dump(d: dict[str, Any]) -> bytes:
    p = json.loads(json.dumps(d))
    for e in p["entries"]:
        e["process_group"] = tuple(e["process_group"])
    return pickle.dumps(p, protocol=2)


def hung_dumps(world: int = 16, late: int = LATE_RANK) -> dict[int, dict[str, Any]]:
    """Every rank but `late` entered collective HUNG_SEQ and waits in it; `late` stopped one before."""
    out = {}
    for r in range(world):
        if r == late:
            out[r] = fr_dump(r, world, last_enqueued=HUNG_SEQ - 1, last_completed=HUNG_SEQ - 1)
        else:
            out[r] = fr_dump(r, world, last_enqueued=HUNG_SEQ, last_completed=HUNG_SEQ - 1)
    return out


def env() -> list[dict[str, Any]]:
    return [{"name": "DB_PASSWORD", "value": SECRETS["env-password"]},
            {"name": "HF_TOKEN", "value": SECRETS["env-hf-token"]},
            {"name": "AZURE_STORAGE_CONNECTION_STRING",
             "value": f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={SECRETS['env-account-key']};"},
            {"name": "NCCL_DEBUG", "value": "INFO"},
            {"name": "API_SECRET", "valueFrom": {"secretKeyRef": {"name": "api", "key": "secret"}}}]


def objects(*, workers: int = 2) -> list[dict[str, Any]]:
    run = taurun(RUN, NS, "Running", NOW - timedelta(hours=1), workers=workers)
    run["metadata"]["annotations"] = {
        "example.com/api-token": SECRETS["annotation-token"],
        "kubectl.kubernetes.io/last-applied-configuration": json.dumps(
            {"apiVersion": "taugrid.io/v1alpha1", "kind": "TauRun",
             "spec": {"env": [{"name": "CLIENT_SECRET", "value": SECRETS["applied-config-secret"]}]}}),
    }
    out: list[dict[str, Any]] = [run]
    for i in range(workers):
        p = pod(f"{RUN}-w{i}", NS, NOW - timedelta(hours=1), node=f"gpu-node-{i}", gpus=8,
                labels={"taugrid.io/run": RUN})
        p["spec"]["containers"][0]["env"] = env()
        out.append(p)
        out.append(event(f"{RUN}-w{i}.pulled", NS, p, "Pulled", "Successfully pulled image trainer:1",
                         NOW - timedelta(minutes=59)))
        out.append(event(f"{RUN}-w{i}.unhealthy", NS, p, "Unhealthy",
                         f"Readiness probe failed: token={SECRETS['annotation-token']}",
                         NOW - timedelta(minutes=5), type_="Warning", count=7))
    return out


def write_scenario(root: Path, *, workers: int = 2, dumps: bool = True, logs: bool = True) -> Path:
    logs_by_pod = {(NS, f"{RUN}-w{i}"): train_log(i) for i in range(workers)} if logs else {}
    d = write_dump(root, objects(workers=workers), logs=logs_by_pod)
    if dumps:
        write_artifacts(root.parent / "artifacts", workers=workers)
    return d


def write_artifacts(root: Path, *, workers: int = 2) -> Path:
    """Where the profile says runs leave dumps: one directory per pod."""
    for r, dump in hung_dumps(world=workers * RANKS_PER_POD).items():
        pod_dir = root / f"{RUN}-w{r // RANKS_PER_POD}"
        pod_dir.mkdir(parents=True, exist_ok=True)
        # Pod 0's ranks dumped pickles (PyTorch's default), pod 1's JSON.
        if r // RANKS_PER_POD == 0:
            (pod_dir / f"nccl_trace_rank_{r}").write_bytes(as_pickle_dump(dump))
        else:
            (pod_dir / f"nccl_trace_rank_{r}.json").write_bytes(as_json_dump(dump))
    (root / f"{RUN}-w0" / "py-spy-dump-rank0.txt").write_text(
        "Thread 4242 (active): \"MainThread\"\n    all_reduce (torch/distributed/distributed_c10d.py:2696)\n"
        f"    train_step (/workspace/pretrain_gpt.py:412)\n    # env HF_TOKEN={SECRETS['env-hf-token']}\n")
    return root


def all_bytes(root: Path) -> list[tuple[str, bytes]]:
    return [(p.relative_to(root).as_posix(), p.read_bytes()) for p in sorted(root.rglob("*")) if p.is_file()]


def leaks(root: Path) -> list[str]:
    """Every (secret, file) where a planted secret survived, in any form we can think of."""
    found = []
    for rel, data in all_bytes(root):
        for name, value in SECRETS.items():
            for form in {value, value.replace("/", "\\/"), json.dumps(value)[1:-1]}:
                if form.encode() in data:
                    found.append(f"{name} in {rel}")
    return found
