"""Local checkpoint roots (issue 26): a location is accepted once, but read many times. A tenant who
swaps its checkpoint directory (or one above it) for a link after the location was accepted must
not get another tenant's listing, or anything outside the configured root, on the next read; and
one run's listing is bounded in entries and time."""

from __future__ import annotations

import os
import shutil
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from collector.model import Ref
from collector.settings import StorageSettings
from collector.sources.checkpoints import (
    CheckpointSourceError,
    LocalCheckpointStore,
    PermanentCheckpointError,
    RetryableCheckpointError,
    read_checkpoints,
    store_for,
)
from kubesim.server import Simulator
from tests.controller.test_controller import FAST, T0, Clock, ensure_namespaces, server_side, start, wait_until
from tests.dumpkit import pod
from tests.test_explain_fixtures import taurun

RUN = Ref("TauRun", "team-a", "llm")
SECRET = "team-b-private-marker-text"


def _checkpoint(d: Path, step: int) -> None:
    (d / f"checkpoint-{step}").mkdir(parents=True)
    (d / f"checkpoint-{step}" / "model.safetensors").write_bytes(b"x" * 16)


def _tree(root: Path) -> tuple[Path, Path]:
    """team-a's run directory (step 100) and team-b's (step 999999, a marker holding text), under one root."""
    a, b = root / "team-a" / "run1", root / "team-b" / "run9"
    _checkpoint(a, 100)
    _checkpoint(b, 999999)
    (b / "latest").write_text(SECRET)
    return a, b


def _steps(store: LocalCheckpointStore) -> list[int | None]:
    sig = read_checkpoints(store, "", RUN, datetime.now(UTC))
    assert SECRET not in repr(sig)
    return [s.step for s in sig.scan.samples]


@pytest.mark.parametrize("swap", ["run directory", "directory above it", "link out of the root"])
def test_a_directory_swapped_for_a_link_after_acceptance_is_not_followed(tmp_path: Path, swap: str) -> None:
    root = tmp_path / "ckpt"
    a, b = _tree(root)
    store, prefix = store_for(str(a), StorageSettings(local_roots=frozenset({str(root)})), namespace="team-a")
    assert isinstance(store, LocalCheckpointStore)
    assert _steps(store) == [100]  # accepted and read once
    if swap == "run directory":
        shutil.rmtree(a)
        a.symlink_to(b)
    elif swap == "directory above it":
        shutil.rmtree(a.parent)
        a.parent.symlink_to(root / "team-b")
        (root / "team-b" / "run1").symlink_to(b)  # so that team-a/run1 resolves to team-b's run
    else:
        outside = tmp_path / "elsewhere"
        _checkpoint(outside, 424242)
        shutil.rmtree(a)
        a.symlink_to(outside)
    with pytest.raises(PermanentCheckpointError, match="symbolic link"):
        store.list(prefix)


def test_links_inside_a_listing_are_not_followed(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    a, b = _tree(root)
    (a / "checkpoint-999999").symlink_to(b / "checkpoint-999999")  # a link to another tenant's checkpoint
    (a / "checkpoint-200").mkdir()
    (a / "checkpoint-200" / "weights").symlink_to(b / "checkpoint-999999")  # and one inside a checkpoint
    (a / "checkpoint-200" / "model.safetensors").write_bytes(b"y" * 8)
    store, _ = store_for(str(a), StorageSettings(local_roots=frozenset({str(root)})))
    assert isinstance(store, LocalCheckpointStore)
    entries = {e.name: e for e in store.list("")}
    assert set(entries) == {"checkpoint-100", "checkpoint-200"}
    assert entries["checkpoint-200"].size == 8  # the link inside was not walked into


def test_the_controller_reads_each_time_beneath_the_root(tmp_path: Path) -> None:
    """End to end: the controller accepted team-a's location and keeps its store; team-a then swaps
    its directory for a link to team-b's. Later polls refuse (counted), and team-b's step never
    shows up in team-a's claims."""
    root = tmp_path / "ckpt"
    a, b = _tree(root)
    clock = Clock(T0)
    with Simulator(settings=FAST, watch_window=50, clock=clock) as sim:
        sim.start()
        ensure_namespaces(sim, "team-a")
        tr = taurun("llm", "team-a", "Running", T0 - timedelta(hours=2), workers=1)
        tr["spec"]["checkpointUri"] = str(a)
        sim.apply(server_side(tr))
        sim.apply(server_side(pod("llm-w0", "team-a", T0 - timedelta(hours=2), node="gpu-0", gpus=8,
                                  labels={"taugrid.io/run": "llm"})))
        c = start(sim, clock, checkpoint_poll_interval=timedelta(seconds=0.1),
                  storage=StorageSettings(local_roots=frozenset({str(root)})))
        try:
            key = ("TauRun", "team-a", "llm")

            def steps() -> list[int | None]:
                sig = c.index.signal_of(Ref(*key), "checkpoints")
                return [s.step for s in sig.scan.samples] if sig is not None else []

            wait_until(lambda: steps() == [100], what="team-a's checkpoint read")

            def refusals() -> float:
                return c.registry.get_sample_value("taugrid_collector_errors_total",
                                                   {"source": "expstore", "class": "permanent"}) or 0.0

            before = refusals()
            shutil.rmtree(a)
            a.symlink_to(b)
            wait_until(lambda: refusals() >= before + 2, what="the swapped location refused on later polls")
            time.sleep(0.3)
            assert 999999 not in steps()
        finally:
            c.close()


def test_a_listing_is_capped_in_entries(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    run = root / "run"
    for i in range(30):
        _checkpoint(run, i + 1)
    store, _ = store_for(str(run), StorageSettings(local_roots=frozenset({str(root)}), checkpoint_max_entries=20))
    with pytest.raises(PermanentCheckpointError, match="more than 20 entries"):
        store.list("")
    store, _ = store_for(str(run), StorageSettings(local_roots=frozenset({str(root)})))
    assert len(store.list("")) == 30


def test_a_listing_is_capped_in_time(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    run = root / "run"
    for i in range(5):
        _checkpoint(run, i + 1)
    store, _ = store_for(str(run), StorageSettings(local_roots=frozenset({str(root)}),
                                                   checkpoint_list_budget=timedelta(0)))
    with pytest.raises(RetryableCheckpointError, match="not done within 0 s"):
        store.list("")
    assert issubclass(RetryableCheckpointError, CheckpointSourceError)


def test_a_path_through_a_link_or_dot_dot_is_refused_up_front(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    a, _ = _tree(root)
    os.symlink(root, tmp_path / "alias")  # a path that reaches the root only through a link
    from collector.sources.checkpoints import RefusedLocation

    policy = StorageSettings(local_roots=frozenset({str(root)}))
    for uri in (str(tmp_path / "alias" / "team-a" / "run1"), f"{root}/team-b/../team-a/run1"):
        with pytest.raises(RefusedLocation, match="local path"):
            store_for(uri, policy)
    assert store_for(str(a), policy)[0] is not None
