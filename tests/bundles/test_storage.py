"""Bundle stores: Azure Blob (a real Azurite on loopback), local directories and tarballs, retention."""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from collector.capture import bundle_from_dump, save
from collector.settings import BundleSettings, Settings
from exporters.bundles.storage import BlobStore, LocalStore, StoreError, apply_retention, latest_bundle
from exporters.bundles.writer import verify
from tests.azurite import Azurite
from tests.bundles.scenario import NOW, RUN, write_scenario
from tests.netutil import free_port


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_bundle_uploaded_to_azurite_and_read_back_byte_for_byte(tmp_path: Path) -> None:
    dump = write_scenario(tmp_path / "dump")
    inp = bundle_from_dump(dump, RUN, Settings(), at=NOW, artifacts_dir=tmp_path / "artifacts")
    written = tmp_path / "written"
    from exporters.bundles.writer import write_bundle

    write_bundle(inp, written / "b")
    original = tree(written / "b")
    with Azurite.start(tmp_path / "azurite") as az:
        for tarball in (False, True):
            store = BlobStore(az.blob_url, "evidence", prefix="clusters/dev", credential=az.credential(),
                              tarball=tarball)
            store.open()
            try:
                where = store.put(written / "b", "research.llm-pretrain.20260110T120000Z")
                assert where.startswith(az.blob_url + "/evidence/clusters/dev/research.llm-pretrain.")
                listed = store.list()
                assert [b.name for b in listed] == ["research.llm-pretrain.20260110T120000Z"]
                assert listed[0].bytes > 0
                back = store.fetch(listed[0].name, tmp_path / f"back-{tarball}")
                assert tree(back) == original  # byte for byte
                assert verify(back) == []  # and every hash in the manifest holds
                found = latest_bundle(store, "research", RUN)
                assert found is not None and found.name == listed[0].name
                store.delete(listed[0].name)
                assert store.list() == []
            finally:
                store.close()


def test_blob_store_unavailable_keeps_the_bundle_locally_and_says_why(tmp_path: Path) -> None:
    dump = write_scenario(tmp_path / "dump", dumps=False)
    inp = bundle_from_dump(dump, RUN, Settings(), at=NOW)
    dead = f"http://127.0.0.1:{free_port()}/devstoreaccount1"  # nothing listens here
    from azure.core.credentials import AzureNamedKeyCredential

    from tests.azurite import ACCOUNT, KEY

    store = BlobStore(dead, "evidence", credential=AzureNamedKeyCredential(ACCOUNT, KEY), timeout_s=2,
                      retries=0)
    cfg = BundleSettings(directory=str(tmp_path / "local"))
    t0 = time.monotonic()
    try:
        store.open()
        raise AssertionError("open should fail without a blob service")
    except StoreError as e:
        assert "blob store" in str(e)
    where, manifest = save(inp, cfg, store, tmp_path / "staging")
    assert time.monotonic() - t0 < 30  # bounded: no endless retries against a dead store
    local = Path(where)
    assert local.parent == tmp_path / "local" and verify(local) == []
    why = {m["what"]: m["why"] for m in manifest["missing"]}
    assert "upload of research.llm-pretrain" in why["upload to the bundle store"]
    assert why["upload to the bundle store"].endswith("kept locally instead")


def test_local_tarballs_and_retention_by_age_and_size(tmp_path: Path) -> None:
    dump = write_scenario(tmp_path / "dump", dumps=False)
    store = LocalStore(tmp_path / "store", tarball=True)
    cfg = BundleSettings(directory=str(tmp_path / "store"), tarball=True)
    names = []
    for minutes in (30, 20, 10, 0):
        inp = bundle_from_dump(dump, RUN, Settings(), at=NOW - timedelta(minutes=minutes))
        where, _ = save(inp, cfg, store, tmp_path / "staging")
        assert where.endswith(".tar.gz") and Path(where).is_file()
        names.append(Path(where).name[: -len(".tar.gz")])
    # Give them distinct ages: the oldest is 3 days old.
    now = datetime.now(UTC)
    for i, n in enumerate(names):
        t = (now - timedelta(days=3 - i)).timestamp()
        os.utime(store.root / f"{n}.tar.gz", (t, t))
    sizes = {b.name: b.bytes for b in store.list()}
    assert set(sizes) == set(names)
    gone = apply_retention(store, now, max_age=timedelta(days=2, hours=12), max_total_bytes=10**12)
    assert gone == [names[0]]
    # By size: only what fits stays, newest kept.
    limit = sizes[names[3]] + sizes[names[2]]
    gone = apply_retention(store, now, max_age=timedelta(days=30), max_total_bytes=limit)
    assert gone == [names[1]]
    assert [b.name for b in store.list()] == names[2:]
    latest = latest_bundle(store, "research", RUN)
    assert latest is not None and latest.name == names[3]
    back = store.fetch(names[3], tmp_path / "unpacked")
    assert verify(back) == [] and hashlib.sha256((back / "manifest.json").read_bytes()).hexdigest()


def test_store_from_settings(tmp_path: Path) -> None:
    from collector.capture import store_for

    assert isinstance(store_for(BundleSettings(directory=str(tmp_path))), LocalStore)
    s = store_for(replace(BundleSettings(), blob_account_url="https://acct.blob.core.windows.net"))
    assert isinstance(s, BlobStore) and s.container_name == "evidence-bundles"
