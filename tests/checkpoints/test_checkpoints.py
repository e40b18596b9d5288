"""Expstore checkpoints: names → steps, local trees per framework, Azure Blob against real Azurite."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from azure.core.credentials import AzureNamedKeyCredential
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.storage.blob import BlobServiceClient, ContainerClient

from collector.claims.progress import analyze
from collector.model import Plane, Ref
from collector.settings import ClaimSettings, StorageSettings
from collector.sources.checkpoints import (
    BlobCheckpointStore,
    CheckpointEntry,
    CheckpointSourceError,
    CheckpointStore,
    LocalCheckpointStore,
    PermanentCheckpointError,
    RetryableCheckpointError,
    _blob_error,
    checkpoint_signal,
    marker_step,
    step_of,
    store_for,
)
from tests.azurite import Azurite

T0 = datetime(2026, 1, 10, 10, 0, tzinfo=UTC)
RUN = Ref("TauRun", "research", "llm-pretrain")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# --- names -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "step"),
    [
        ("checkpoint-1200", 1200),  # Hugging Face
        ("checkpoint-1200/", 1200),
        ("iter_0001000", 1000),  # Megatron
        ("global_step1200", 1200),  # DeepSpeed
        ("step_500.pt", 500),
        ("step-7", 7),
        ("epoch=3-step=1200.ckpt", 1200),  # Lightning: the step, not the epoch
        ("epoch=3-step=1200-v1.ckpt", 1200),
        ("megatron_gpt--val_loss=2.10-step=1000-consumed_samples=8000.0.ckpt", 1000),  # NeMo
        ("ckpt-1200", 1200),  # TensorFlow
        ("ckpt-1200.index", 1200),
        ("ckpt-1200.data-00000-of-00001", 1200),
        ("model.ckpt-1200.meta", 1200),
        ("1200", 1200),  # Orbax / T5X
        ("000100", 100),
        ("checkpoint_1200", 1200),
        ("iter_1200.pth", 1200),
        # no step
        ("epoch=3.ckpt", None),
        ("last.ckpt", None),
        ("release", None),
        ("latest", None),
        ("runs", None),
        ("config.json", None),
        ("model-00001-of-00002.safetensors", None),
        ("checkpoint-best", None),
        ("twitter_2", None),
        (".hidden_100", None),
        ("", None),
        # unfinished saves
        ("checkpoint-1200.tmp", None),
        ("tmp-checkpoint-1200", None),
        ("checkpoint-1200_tmp", None),
        ("global_step1200.incomplete", None),
        ("step_500.pt.partial", None),
        ("checkpoint-12.part", None),
        ("1200.orbax-checkpoint-tmp-1712345678", None),
        ("ckpt-1200_temp_9f8e7d", None),
        ("megatron_gpt--step=2000-consumed_samples=16000.0-unfinished", None),
    ],
)
def test_step_of(name: str, step: int | None) -> None:
    assert step_of(name) == step


@pytest.mark.parametrize(
    ("text", "step"),
    [
        ("2000\n", 2000),  # Megatron latest_checkpointed_iteration.txt
        ("global_step1200", 1200),  # DeepSpeed latest
        ('model_checkpoint_path: "ckpt-3"\nall_model_checkpoint_paths: "ckpt-2"\n', 3),  # TensorFlow
        ('model_checkpoint_path: "/data/run/ckpt-3"\n', 3),
        ("release", None),
        ("", None),
        ("\x00\x01garbage", None),
    ],
)
def test_marker_step(text: str, step: int | None) -> None:
    assert marker_step(text) == step


# --- local trees -------------------------------------------------------------------------------


def put(path: Path, t: float, data: bytes = b"x" * 16) -> None:
    """A file written at T0+t."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.utime(path, (at(t).timestamp(), at(t).timestamp()))


def mkdir_at(path: Path, t: float) -> None:
    """A directory created at T0+t (set after its contents, which would otherwise move it)."""
    path.mkdir(parents=True, exist_ok=True)
    os.utime(path, (at(t).timestamp(), at(t).timestamp()))


def listing(root: Path) -> tuple[list[tuple[int, datetime | None]], tuple[str, ...]]:
    with LocalCheckpointStore(root) as store:
        sig = checkpoint_signal(RUN, store.list(""), at(10_000))
    return [(s.step, s.at) for s in sig.scan.samples], sig.scan.diagnostics


def test_local_huggingface(tmp_path: Path) -> None:
    for step, t in ((500, 100), (1000, 200)):
        d = tmp_path / f"checkpoint-{step}"
        put(d / "model.safetensors", t)
        put(d / "optimizer.pt", t + 5)
        put(d / "trainer_state.json", t + 7)  # written last: the save completes here
        mkdir_at(d, t - 1)
    put(tmp_path / "tmp-checkpoint-1500" / "model.safetensors", 300)  # saving now
    put(tmp_path / "runs" / "events.out.tfevents", 310)
    put(tmp_path / "config.json", 1)
    steps, diags = listing(tmp_path)
    assert steps == [(500, at(107)), (1000, at(207))]
    assert any("tmp-checkpoint-1500" in d and "unfinished" in d for d in diags)
    assert any(d.startswith("runs:") and "no step" in d for d in diags)
    assert any(d.startswith("config.json:") for d in diags)


def test_local_megatron_tracker_file(tmp_path: Path) -> None:
    for it, t in ((1000, 100), (2000, 200), (3000, 300)):
        d = tmp_path / f"iter_{it:07d}"
        put(d / "mp_rank_00" / "model_optim_rng.pt", t)
        put(d / "mp_rank_01" / "model_optim_rng.pt", t + 3)
        mkdir_at(d / "mp_rank_00", t)
        mkdir_at(d / "mp_rank_01", t + 3)
        mkdir_at(d, t)
    put(tmp_path / "latest_checkpointed_iteration.txt", 205, b"2000")  # iter 3000 not yet done by all ranks
    steps, diags = listing(tmp_path)
    assert steps == [(1000, at(103)), (2000, at(203))]
    assert any("iter_0003000" in d and "past the last complete checkpoint (2000)" in d for d in diags)
    assert not any("latest_checkpointed_iteration.txt" in d for d in diags)


def test_local_deepspeed_latest(tmp_path: Path) -> None:
    for step, t in ((100, 10), (200, 20), (300, 30)):
        d = tmp_path / f"global_step{step}"
        put(d / "mp_rank_00_model_states.pt", t)
        put(d / "zero_pp_rank_0_mp_rank_00_optim_states.pt", t + 1)
        mkdir_at(d, t)
    put(tmp_path / "latest", 22, b"global_step200")
    put(tmp_path / "zero_to_fp32.py", 22, b"#!/usr/bin/env python\n")
    steps, diags = listing(tmp_path)
    assert steps == [(100, at(11)), (200, at(21))]
    assert any("global_step300" in d for d in diags)


def test_megatron_deepspeed_markers_disagree_use_lowest(tmp_path: Path) -> None:
    for step in (100, 200):
        put(tmp_path / f"global_step{step}" / "mp_rank_00_model_states.pt", step)
    put(tmp_path / "latest", 201, b"global_step200")  # DeepSpeed's, written first
    put(tmp_path / "latest_checkpointed_iteration.txt", 150, b"100")  # Megatron's, not yet updated
    steps, diags = listing(tmp_path)
    assert [s for s, _ in steps] == [100]
    assert any("markers disagree" in d for d in diags)


def test_local_plain_pytorch(tmp_path: Path) -> None:
    put(tmp_path / "step_500.pt", 50)
    put(tmp_path / "step_1000.pt", 100)
    put(tmp_path / "step_1500.pt.tmp", 150)  # torch.save to a temp name, then rename
    put(tmp_path / "step_2000.pt", 200, b"")  # a failed save left an empty file
    steps, diags = listing(tmp_path)
    assert steps == [(500, at(50)), (1000, at(100))]
    assert any("step_2000.pt: empty" in d for d in diags)


def test_local_lightning_and_nemo(tmp_path: Path) -> None:
    put(tmp_path / "epoch=0-step=1200.ckpt", 120)
    put(tmp_path / "epoch=1-step=2400.ckpt", 240)
    put(tmp_path / "epoch=1-step=2400-v1.ckpt", 900)  # saved again after a restart: durable since 240
    os.symlink("epoch=1-step=2400.ckpt", tmp_path / "last.ckpt")
    nemo = "megatron_gpt--val_loss=2.10-step={}-consumed_samples={}.0"
    put(tmp_path / (nemo.format(3000, 24000) + ".ckpt"), 300)
    put(tmp_path / (nemo.format(3600, 28800) + ".ckpt"), 360)
    put(tmp_path / (nemo.format(3600, 28800) + "-unfinished"), 359, b"")  # NeMo: still being saved
    steps, diags = listing(tmp_path)
    assert steps == [(1200, at(120)), (2400, at(240)), (3000, at(300))]
    assert any("step=3600" in d and "being saved" in d for d in diags)
    assert not any(d.startswith("last.ckpt") for d in diags)  # a link: not followed below the root (issue 26)


def test_local_tensorflow_file_sets(tmp_path: Path) -> None:
    for n, t in ((2, 20), (3, 30)):
        put(tmp_path / f"ckpt-{n}.data-00000-of-00001", t)
        put(tmp_path / f"ckpt-{n}.index", t + 2)  # the index completes the set
    put(tmp_path / "ckpt-4_temp_9f8e" / "part-00000-of-00001.data-00000-of-00001", 40)
    put(tmp_path / "checkpoint", 33, b'model_checkpoint_path: "ckpt-3"\nall_model_checkpoint_paths: "ckpt-2"\n')
    steps, diags = listing(tmp_path)
    assert steps == [(2, at(22)), (3, at(32))]
    assert any("ckpt-4_temp_9f8e" in d for d in diags)


def test_local_orbax_numeric_dirs(tmp_path: Path) -> None:
    for step, t in ((1000, 100), (2000, 200)):
        put(tmp_path / str(step) / "default" / "_METADATA", t)
        put(tmp_path / str(step) / "_CHECKPOINT_METADATA", t + 4)
        mkdir_at(tmp_path / str(step) / "default", t)
        mkdir_at(tmp_path / str(step), t)
    put(tmp_path / "3000.orbax-checkpoint-tmp-1712345678" / "default" / "_METADATA", 300)
    mkdir_at(tmp_path / "2500", 250)  # created, nothing written: not a checkpoint
    steps, diags = listing(tmp_path)
    assert steps == [(1000, at(104)), (2000, at(204))]
    assert any("orbax-checkpoint-tmp" in d for d in diags)
    assert any(d.startswith("2500: empty") for d in diags)


def test_local_entries_sizes_and_prefix(tmp_path: Path) -> None:
    put(tmp_path / "run1" / "checkpoint-5" / "a.bin", 5, b"a" * 100)
    put(tmp_path / "run1" / "checkpoint-5" / "sub" / "b.bin", 6, b"b" * 23)
    put(tmp_path / "run1" / "step_9.pt", 9, b"c" * 7)
    with LocalCheckpointStore(tmp_path) as store:
        assert isinstance(store, CheckpointStore)
        entries = store.list("run1")
        assert store.list("/run1/") == entries
        assert store.list("absent") == []  # nothing saved yet: no entries, no error
        with pytest.raises(ValueError, match="leaves the store root"):
            store.list("../etc")
        with pytest.raises(PermanentCheckpointError, match="step_9.pt"):
            store.list("run1/step_9.pt")
    assert [(e.name, e.size) for e in entries] == [("checkpoint-5", 123), ("step_9.pt", 7)]
    assert all(e.modified.tzinfo is UTC for e in entries)
    limited = LocalCheckpointStore(tmp_path, walk_limit=1).list("run1")
    assert limited[0].size is None


# --- the signal (pure) --------------------------------------------------------------------------


def test_checkpoint_signal_shape() -> None:
    entries = [
        CheckpointEntry("checkpoint-300", at(300), 10),
        CheckpointEntry("checkpoint-100", at(100), 10),
        CheckpointEntry("checkpoint-200", at(200), None),
        CheckpointEntry("runs", at(5), 0),
        CheckpointEntry("README.md", at(6), 3),
    ]
    sig = checkpoint_signal(RUN, entries, at(400))
    assert sig.ref == RUN
    assert sig.source == "checkpoints"
    assert sig.plane is Plane.EXPSTORE
    assert sig.durable is True
    assert sig.read_at == at(400)
    assert [(s.step, s.at, s.loss, s.line, s.format) for s in sig.scan.samples] == [
        (100, at(100), None, 0, "checkpoint"),
        (200, at(200), None, 0, "checkpoint"),
        (300, at(300), None, 0, "checkpoint"),
    ]
    assert sig.scan.format == "checkpoint"
    assert sig.scan.source == "checkpoints"
    assert sig.scan.lines == 5
    assert sig.scan.hangs == () and sig.scan.xids == ()
    assert sig.scan.diagnostics == (
        "README.md: no step number in the name; ignored",
        "runs: no step number in the name; ignored",
    )
    # The claim engine's analysis reads it as durable progress.
    view = analyze([sig], ClaimSettings())
    assert view.last_step == 300
    assert [a.step for a in view.advances] == [100, 200, 300]


def test_checkpoint_signal_empty_and_markers() -> None:
    empty = checkpoint_signal(RUN, [], at(0))
    assert empty.scan.samples == () and empty.scan.format is None and empty.scan.diagnostics == ()
    sig = checkpoint_signal(
        RUN,
        [
            CheckpointEntry("iter_0000100", at(1), None),
            CheckpointEntry("latest_checkpointed_iteration.txt", at(2), 7, "release"),
        ],
        at(3),
    )
    assert [s.step for s in sig.scan.samples] == [100]
    assert any("does not name a step" in d for d in sig.scan.diagnostics)
    sig = checkpoint_signal(RUN, [CheckpointEntry("latest", at(2), 14, "global_step500")], at(3))
    assert sig.scan.samples == ()
    assert any("step 500, is not in the listing" in d for d in sig.scan.diagnostics)


def test_checkpoint_signal_bounds_diagnostics() -> None:
    entries = [CheckpointEntry(f"junk-{i}", at(i), 1) for i in range(250)]
    sig = checkpoint_signal(RUN, entries, at(0))
    assert len(sig.scan.diagnostics) == 101
    assert sig.scan.diagnostics[-1] == "... and 150 more diagnostics"


def test_entry_times_are_aware_utc() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        CheckpointEntry("checkpoint-1", datetime(2026, 1, 1), 1)
    e = CheckpointEntry("checkpoint-1", datetime(2026, 1, 1, 12, tzinfo=timezone(timedelta(hours=2))), 1)
    assert e.modified == datetime(2026, 1, 1, 10, tzinfo=UTC) and e.modified.tzinfo is UTC


# --- URIs ---------------------------------------------------------------------------------------

KEYCRED = AzureNamedKeyCredential("devstoreaccount1", "a2V5")
# What the platform configured: the only places a checkpoint location may lead (docs/security.md).
POLICY = StorageSettings(
    clouds=frozenset({"public", "usgov"}),
    accounts=frozenset({"acct01"}),
    local_roots=frozenset({"/ckpt", "relative"}),
    emulator_urls=frozenset({"http://127.0.0.1:10000/devstoreaccount1", "http://[::1]:10000/devstoreaccount1"}),
)


def test_store_for_local() -> None:
    store, prefix = store_for("/ckpt/run1", POLICY)
    assert isinstance(store, LocalCheckpointStore) and store.root == Path("/ckpt/run1") and prefix == ""
    store, prefix = store_for("file:///ckpt/run%201", POLICY)
    assert isinstance(store, LocalCheckpointStore) and store.root == Path("/ckpt/run 1") and prefix == ""
    store, _ = store_for("file://localhost/ckpt", POLICY)
    assert isinstance(store, LocalCheckpointStore) and store.root == Path("/ckpt")
    store, _ = store_for("relative/dir", POLICY)
    assert isinstance(store, LocalCheckpointStore) and store.root == Path("relative/dir")


@pytest.mark.parametrize(
    ("uri", "account_url", "container", "prefix"),
    [
        (
            "https://acct01.blob.core.windows.net/ckpt/research/llm/",
            "https://acct01.blob.core.windows.net",
            "ckpt",
            "research/llm",
        ),
        ("https://acct01.blob.core.windows.net/ckpt", "https://acct01.blob.core.windows.net", "ckpt", ""),
        ("https://acct01.blob.core.usgovcloudapi.net/c-1/p", "https://acct01.blob.core.usgovcloudapi.net", "c-1", "p"),
        (
            "https://acct01.privatelink.blob.core.windows.net/ckpt/p",
            "https://acct01.privatelink.blob.core.windows.net",
            "ckpt",
            "p",
        ),
        ("abfss://ckpt@acct01.dfs.core.windows.net/runs/a", "https://acct01.blob.core.windows.net", "ckpt", "runs/a"),
        (
            "https://acct01.blob.core.windows.net/ckpt/with%20space",
            "https://acct01.blob.core.windows.net",
            "ckpt",
            "with space",
        ),
    ],
)
def test_store_for_blob(uri: str, account_url: str, container: str, prefix: str) -> None:
    store, got = store_for(uri, POLICY)
    assert isinstance(store, BlobCheckpointStore)
    assert (store.account_url, store.container, got) == (account_url, container, prefix)


def test_store_for_azurite_style() -> None:
    store, prefix = store_for("http://127.0.0.1:10000/devstoreaccount1/ckpt/run1", POLICY, credential=KEYCRED)
    assert isinstance(store, BlobCheckpointStore)
    assert (store.account_url, store.container, prefix) == ("http://127.0.0.1:10000/devstoreaccount1", "ckpt", "run1")
    store, _ = store_for("http://[::1]:10000/devstoreaccount1/ckpt", POLICY, credential=KEYCRED)
    assert isinstance(store, BlobCheckpointStore) and store.account_url == "http://[::1]:10000/devstoreaccount1"


@pytest.mark.parametrize(
    ("uri", "why"),
    [
        ("", "empty"),
        ("s3://bucket/run1", "unsupported scheme"),
        ("gs://bucket/run1", "unsupported scheme"),
        ("https://example.com/ckpt/run1", "not an Azure Blob endpoint"),
        ("http://acct01.blob.core.windows.net/ckpt/p", "need https"),
        ("https://acct01.blob.core.windows.net/", "no container"),
        ("https://acct01.blob.core.windows.net/Bad_Container/p", "not a valid container name"),
        ("https://acct01.blob.core.windows.net/a--b/p", "not a valid container name"),
        ("https://ab.blob.core.windows.net/ckpt/p", "not a storage account name"),
        ("https://acct01.blob.core.windows.net/ckpt/p?sv=2024-01-01&sig=abc", "SAS"),
        ("file://fileserver/share/ckpt", "remote host"),
        ("file:relative/path", "absolute path"),
        ("http://127.0.0.1:10000/", "ACCOUNT/CONTAINER"),
        ("http://127.0.0.1:99999/devstoreaccount1/c", "bad port"),
        ("abfss://acct01.dfs.core.windows.net/p", "abfss://CONTAINER@ACCOUNT"),
        ("http://127.0.0.1:10000/devstoreaccount1/ckpt", "explicit credential"),  # no workload identity over http
    ],
)
def test_store_for_rejects(uri: str, why: str) -> None:
    with pytest.raises(ValueError, match=why) as exc:
        store_for(uri, POLICY)
    assert repr(uri) in str(exc.value) or uri == ""


def test_default_credential_is_workload_identity() -> None:
    store, _ = store_for("https://acct01.blob.core.windows.net/ckpt/run1", POLICY)
    assert isinstance(store, BlobCheckpointStore)
    store.open()  # builds DefaultAzureCredential and the client; no request is sent
    try:
        assert type(store._owned_credential).__name__ == "DefaultAzureCredential"
    finally:
        store.close()
    assert store._owned_credential is None


# --- error classification -----------------------------------------------------------------------


def _http(status: int) -> HttpResponseError:
    err = HttpResponseError(f"status {status}")
    err.status_code = status
    return err


@pytest.mark.parametrize(
    ("err", "retryable"),
    [
        (ServiceRequestError("connection refused"), True),
        (ServiceResponseError("connection reset"), True),
        (_http(500), True),
        (_http(503), True),  # ServerBusy: throttling
        (_http(429), True),
        (_http(408), True),
        (_http(400), False),
        (_http(403), False),
        (ClientAuthenticationError("AuthenticationFailed"), False),
        (ResourceNotFoundError("ContainerNotFound"), False),
    ],
)
def test_blob_error_classification(err: Exception, retryable: bool) -> None:
    out = _blob_error(err, "listing x")
    assert isinstance(out, CheckpointSourceError)
    assert out.retryable is retryable
    assert isinstance(out, RetryableCheckpointError if retryable else PermanentCheckpointError)
    assert str(out).startswith("listing x: ")


def test_module_imports_no_controller_cli_kubernetes_or_azure() -> None:
    code = (
        "import sys, collector.sources.checkpoints\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'azure')"
        " or m.startswith(('collector.controller', 'collector.cli')))\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"  # azure is imported only when a blob store opens


# --- Azure Blob against real Azurite ------------------------------------------------------------


@pytest.fixture(scope="module")
def container(azurite: Azurite) -> Iterator[ContainerClient]:
    service = BlobServiceClient(azurite.blob_url, credential=azurite.credential())
    client = service.create_container("checkpoints")
    yield client
    client.close()
    service.close()


def upload(c: ContainerClient, names: list[str], data: bytes = b"x" * 10) -> None:
    for n in names:
        c.upload_blob(n, data, overwrite=True)


def blob_store(az: Azurite, **kw: Any) -> BlobCheckpointStore:
    return BlobCheckpointStore(az.blob_url, "checkpoints", credential=az.credential(), retries=0, **kw)


def test_blob_huggingface_dirs(azurite: Azurite, container: ContainerClient) -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    upload(container, ["hf/checkpoint-100/model.safetensors", "hf/checkpoint-100/trainer_state.json"])
    upload(container, ["hf/checkpoint-200/model.safetensors", "hf/tmp-checkpoint-300/model.safetensors"])
    upload(container, ["hf/config.json", "hf-other/checkpoint-999/x"])
    after = datetime.now(UTC) + timedelta(seconds=1)
    configured = StorageSettings(emulator_urls=frozenset({azurite.blob_url}))
    store, prefix = store_for(f"{azurite.blob_url}/checkpoints/hf", configured, credential=azurite.credential())
    assert isinstance(store, BlobCheckpointStore)
    with store:
        entries = store.list(prefix)
    assert [(e.name, e.size) for e in entries] == [
        ("checkpoint-100", 20),
        ("checkpoint-200", 10),
        ("config.json", 10),
        ("tmp-checkpoint-300", 10),
    ]
    assert all(e.modified.tzinfo is UTC and before <= e.modified <= after for e in entries)
    sig = checkpoint_signal(RUN, entries, datetime.now(UTC))
    assert [s.step for s in sig.scan.samples] == [100, 200]
    assert any("tmp-checkpoint-300" in d for d in sig.scan.diagnostics)


def test_blob_directory_time_is_newest_blob_and_settled_dirs_are_cached(
    azurite: Azurite, container: ContainerClient
) -> None:
    upload(container, ["timing/global_step10/model_states.pt"])
    time.sleep(1.05)  # Azurite's times have one-second resolution
    upload(container, ["timing/global_step10/optim_states.pt"])
    newest = max(b.last_modified for b in container.list_blobs(name_starts_with="timing/global_step10/"))
    settled = blob_store(azurite, settle_s=0)  # every listed directory counts as finished
    live = blob_store(azurite)
    with settled, live:
        (first,) = settled.list("timing")
        assert first.modified == newest and first.size == 20
        assert live.list("timing") == [first]
        time.sleep(1.05)
        upload(container, ["timing/global_step10/late.pt"])
        (cached,) = settled.list("timing")
        (fresh,) = live.list("timing")
    assert cached.modified == first.modified and cached.size == 20  # not listed again
    assert fresh.modified > first.modified and fresh.size == 30


def test_blob_deepspeed_latest_and_megatron_tracker(azurite: Azurite, container: ContainerClient) -> None:
    upload(container, [f"ds/global_step{s}/mp_rank_00_model_states.pt" for s in (100, 200, 300)])
    container.upload_blob("ds/latest", b"global_step200", overwrite=True)
    upload(container, [f"meg/iter_{i:07d}/mp_rank_{r:02d}/model_optim_rng.pt" for i in (1000, 2000) for r in (0, 1)])
    container.upload_blob("meg/latest_checkpointed_iteration.txt", b"1000", overwrite=True)
    with blob_store(azurite) as store:
        ds = store.list("ds/")
        meg = store.list("meg")
    assert [e.marker for e in ds if e.name == "latest"] == ["global_step200"]
    assert [s.step for s in checkpoint_signal(RUN, ds, datetime.now(UTC)).scan.samples] == [100, 200]
    assert [(e.name, e.size) for e in meg] == [
        ("iter_0001000", 20),
        ("iter_0002000", 20),
        ("latest_checkpointed_iteration.txt", 4),
    ]
    assert [s.step for s in checkpoint_signal(RUN, meg, datetime.now(UTC)).scan.samples] == [1000]


def test_blob_files_rotation_and_folder_blobs(azurite: Azurite, container: ContainerClient) -> None:
    upload(container, ["pt/step_100.pt", "pt/step_200.pt", "pt/epoch=0-step=300.ckpt"])
    upload(container, ["pt/1000/_CHECKPOINT_METADATA"])
    container.upload_blob("pt/1000", b"", overwrite=True)  # a hierarchical-namespace folder blob
    with blob_store(azurite, settle_s=0) as store:
        names = [e.name for e in store.list("pt")]
        assert names == ["1000", "epoch=0-step=300.ckpt", "step_100.pt", "step_200.pt"]
        for b in ("pt/1000/_CHECKPOINT_METADATA", "pt/1000", "pt/step_100.pt"):
            container.delete_blob(b)  # rotation removes old checkpoints
        assert [e.name for e in store.list("pt")] == ["epoch=0-step=300.ckpt", "step_200.pt"]
        assert store.list("nothing-here") == []


def test_blob_from_connection_string(azurite: Azurite, container: ContainerClient) -> None:
    upload(container, ["cs/checkpoint-1/a"])
    with BlobCheckpointStore.from_connection_string(azurite.connection_string, "checkpoints", retries=0) as store:
        assert [e.name for e in store.list("cs")] == ["checkpoint-1"]
    assert azurite.key not in repr(store)
    with pytest.raises(ValueError, match="AccountKey"):
        BlobCheckpointStore.from_connection_string("BlobEndpoint=http://x;AccountName=a", "c")


def test_blob_permanent_errors(azurite: Azurite, container: ContainerClient) -> None:
    missing = BlobCheckpointStore(azurite.blob_url, "no-such-container", credential=azurite.credential(), retries=0)
    with missing, pytest.raises(PermanentCheckpointError, match="ContainerNotFound") as exc:
        missing.list("run1")
    assert exc.value.retryable is False
    wrong = AzureNamedKeyCredential(azurite.account, "d3Jvbmcga2V5IGZvciB0ZXN0cw==")
    denied = BlobCheckpointStore(azurite.blob_url, "checkpoints", credential=wrong, retries=0)
    with denied, pytest.raises(PermanentCheckpointError, match="HTTP 403") as exc:
        denied.list("run1")
    assert exc.value.retryable is False


def test_blob_azurite_down_is_retryable(tmp_path: Path) -> None:
    with Azurite.start(tmp_path) as az:
        service = BlobServiceClient(az.blob_url, credential=az.credential())
        service.create_container("checkpoints").upload_blob("r/checkpoint-5/a", b"x")
        service.close()
        store = blob_store(az)
        store.open()
        assert [e.name for e in store.list("r")] == ["checkpoint-5"]
    # stopped: the same open store now fails, retryably, and quickly
    t = time.monotonic()
    with pytest.raises(RetryableCheckpointError, match="127.0.0.1") as exc:
        store.list("r")
    assert exc.value.retryable is True
    assert time.monotonic() - t < 5
    store.close()
