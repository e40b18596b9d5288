"""`taugrid-evidence bundle`: one run's evidence bundle on demand (from a dump or live), and re-redaction."""

from __future__ import annotations

import os
import tarfile
import tempfile
import zlib
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from collector.capture import CaptureError, EvidenceCapture, bundle_from_dump, save
from collector.controller import Controller
from collector.model import RunClaims
from collector.settings import Settings
from collector.sources.kube_api import KubeApi
from exporters.bundles.reredact import redact_bundle
from exporters.bundles.storage import TAR_SUFFIX, LocalStore, latest_bundle, pack, unpack
from exporters.bundles.writer import MANIFEST


def _store_for_out(out: Path | None, settings: Settings) -> tuple[LocalStore, Path | None]:
    """--out DIR: bundles go inside it; --out FILE.tar.gz: exactly that tarball."""
    if out is not None and out.name.endswith(TAR_SUFFIX):
        return LocalStore(out.parent, tarball=True), out
    return LocalStore(out or Path(settings.bundles.directory or "bundles"), tarball=False), None


def _finish(where: str, exact: Path | None) -> str:
    if exact is not None and Path(where) != exact:
        Path(where).replace(exact)
        return str(exact)
    return where


def bundle_from_dump_cmd(dump_dir: Path, run: str, out: Path | None, settings: Settings, *,
                         at: datetime | None = None, artifacts: Path | None = None) -> tuple[str, dict[str, Any]]:
    inp = bundle_from_dump(dump_dir, run, settings, at=at, artifacts_dir=artifacts)
    store, exact = _store_for_out(out, settings)
    with tempfile.TemporaryDirectory(prefix="taugrid-bundle-") as tmp:
        where, manifest = save(inp, replace(settings.bundles, directory=str(store.root)), store, Path(tmp))
    return _finish(where, exact), manifest


def bundle_live_cmd(api: KubeApi, run: str, out: Path | None, settings: Settings, *,
                    timeout_s: float = 60.0) -> tuple[str, dict[str, Any]]:
    """Watch the cluster just long enough to sync, then capture the run like the controller would."""
    store, exact = _store_for_out(out, settings)
    cfg = replace(settings.bundles, directory=str(store.root))
    settings = replace(settings, bundles=cfg, controller=replace(settings.controller, leader_election=False))
    now = lambda: datetime.now(UTC)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="taugrid-bundle-") as tmp:
        cap = EvidenceCapture(cfg, api, now, store=store)
        cap.staging = Path(tmp)
        cap.auto = False
        ctl = Controller(api, settings, now, capture=cap)
        try:
            ctl.open()
            if not ctl.ready.wait(timeout_s):
                raise CaptureError(f"the cluster did not sync within {timeout_s:.0f}s")
            ctl.evaluate(full=True)
            rc = _match(list(ctl.claims.values()), run)
            done = cap.request(rc.ref)
            if not done.wait(timeout_s) or not cap.written:
                raise CaptureError(f"capturing {rc.ref} did not finish within {timeout_s:.0f}s")
            where = cap.written[-1]
        finally:
            ctl.close()
    manifest_root = Path(where)
    manifest = orjson.loads((manifest_root / MANIFEST).read_bytes()) if manifest_root.is_dir() else {}
    return _finish(where, exact), manifest


def _match(claims: list[RunClaims], run: str) -> RunClaims:
    found = [rc for rc in claims if run in (rc.ref.name, f"{rc.ref.namespace}/{rc.ref.name}")]
    if len(found) != 1:
        names = ", ".join(sorted(f"{c.ref.namespace}/{c.ref.name}" for c in claims)) or "none"
        raise CaptureError(f"{'no run matches' if not found else 'ambiguous:'} {run}; runs: {names}")
    return found[0]


def redact_cmd(path: Path) -> int:
    """Re-apply the current redaction rules to a bundle directory or tarball: all or nothing.

    The redacted copy is written beside the bundle and swapped in only when complete; any error
    leaves the bundle as it was (and no work directory behind). A tarball is unpacked within
    storage.unpack's caps on members and sizes."""
    now = datetime.now(UTC)
    if path.is_dir():
        path = path.resolve()  # a link to the bundle: the bundle itself is redacted and replaced
        if not (path / MANIFEST).is_file():
            raise CaptureError(f"{path}: no {MANIFEST}: not a bundle")
        with tempfile.TemporaryDirectory(prefix=f".{path.name}.redact-", dir=path.parent) as tmp:
            new = Path(tmp) / "new"
            changed = redact_bundle(path, new, now)
            # Two renames on one filesystem: the old tree moves into the work directory (and goes
            # with it), the new one takes its place.
            os.rename(path, Path(tmp) / "old")
            os.rename(new, path)
        return changed
    if not path.name.endswith(TAR_SUFFIX):
        raise CaptureError(f"{path}: not a bundle directory or .tar.gz")
    with tempfile.TemporaryDirectory(prefix=f".{path.name}.redact-", dir=path.parent) as tmp:
        try:
            root = unpack(path, Path(tmp) / "in")
        except (tarfile.TarError, EOFError, zlib.error) as e:
            raise CaptureError(f"{path}: not a readable tarball: {e}") from e
        if not (root / MANIFEST).is_file():
            raise CaptureError(f"{path}: no {MANIFEST} inside: not a bundle")
        out = Path(tmp) / "out" / root.name
        out.parent.mkdir()
        changed = redact_bundle(root, out, now)
        new = Path(tmp) / path.name
        pack(out, new)
        os.replace(new, path)  # the redacted tarball replaces the old one in one step
    return changed


def latest_bundles(directory: Path, claims: list[RunClaims]) -> dict[tuple[str, str, str], str]:
    """For `explain`: the newest local bundle of each run, by run key."""
    if not directory.is_dir():
        return {}
    store = LocalStore(directory)
    out = {}
    for rc in claims:
        b = latest_bundle(store, rc.ref.namespace, rc.ref.name)
        if b is not None:
            out[rc.ref.key] = b.location
    return out
