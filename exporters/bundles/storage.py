"""Where bundles live: a local directory (bundle directories or .tar.gz files) or Azure Blob.

Both keep the same layout: `<bundle>/<files>` (directory form) or `<bundle>.tar.gz`. Azure Blob
authenticates with workload identity (azure-identity's DefaultAzureCredential) and only to the
account URL the platform configured. Retention deletes bundles past an age, then the oldest
until the store is under its size bound.
"""

from __future__ import annotations

import os
import shutil
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from exporters.bundles.model import path_component
from exporters.bundles.writer import MANIFEST

TAR_SUFFIX = ".tar.gz"
# What an archive may unpack to: a bundle the writer makes stays under `max_bundle_bytes` (256 MiB
# by default) in a few files per pod; one object history or decoded dump stays under 128 MiB.
MAX_MEMBERS = 20_000
MAX_MEMBER_BYTES = 128 << 20
MAX_UNPACKED_BYTES = 512 << 20


class StoreError(RuntimeError):
    """The store could not be reached or refused the operation."""


@dataclass(frozen=True, slots=True)
class StoredBundle:
    name: str
    created: datetime
    bytes: int
    location: str


class BundleStore(Protocol):
    def open(self) -> None: ...
    def close(self) -> None: ...
    def put(self, local: Path, name: str) -> str: ...
    def list(self) -> list[StoredBundle]: ...
    def delete(self, name: str) -> None: ...
    def fetch(self, name: str, dest: Path) -> Path: ...


def pack(src: Path, dest: Path) -> Path:
    """A bundle directory as one .tar.gz whose members are `<bundle>/<file>`, regular files only."""
    with tarfile.open(dest, "w:gz") as tar:
        for p in sorted(src.rglob("*")):
            if p.is_file() and not p.is_symlink():
                info = tar.gettarinfo(str(p), arcname=f"{src.name}/{p.relative_to(src).as_posix()}")
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                with p.open("rb") as fh:
                    tar.addfile(info, fh)
    return dest


def unpack(archive: Path, dest_dir: Path, *, max_members: int = MAX_MEMBERS, max_member_bytes: int = MAX_MEMBER_BYTES,
           max_total_bytes: int = MAX_UNPACKED_BYTES) -> Path:
    """Extract a bundle tarball safely; returns its one top directory.

    Regular files inside one top directory only; member count, each member's size and the total
    are capped from the headers, before a byte of a member is written (a megabyte of gzip can
    hold gigabytes). Raises ValueError naming the member and the limit.
    """
    _Caps(archive, max_members, max_member_bytes, max_total_bytes).scan()
    caps = _Caps(archive, max_members, max_member_bytes, max_total_bytes)  # again: the file may have changed
    with tarfile.open(archive, "r:gz") as tar:
        while (m := tar.next()) is not None:
            if not caps.check(m):
                continue
            target = dest_dir.joinpath(*PurePosixPath(m.name).parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(m)
            if src is None:
                raise ValueError(f"{archive}: unreadable member {m.name!r}")
            with src, target.open("wb") as out:
                shutil.copyfileobj(src, out)
    return dest_dir / caps.finish()


class _Caps:
    """The limits and the layout of a bundle archive, checked member by member from the headers."""

    def __init__(self, archive: Path, max_members: int, max_member_bytes: int, max_total_bytes: int) -> None:
        self.archive = archive
        self.max_members, self.max_member_bytes, self.max_total_bytes = max_members, max_member_bytes, max_total_bytes
        self.members = self.total = 0
        self.top: str | None = None

    def check(self, m: tarfile.TarInfo) -> bool:
        """True for a file to extract, False for a directory; ValueError for anything else."""
        self.members += 1
        if self.members > self.max_members:
            raise ValueError(f"{self.archive}: more than {self.max_members} members; over the limit for a bundle, "
                             f"not unpacked")
        parts = PurePosixPath(m.name).parts
        if m.isdir():
            return False
        if not m.isfile() or not parts or PurePosixPath(m.name).is_absolute() or ".." in parts:
            raise ValueError(f"{self.archive}: unsafe member {m.name!r}")
        if m.size > self.max_member_bytes or self.total + m.size > self.max_total_bytes:
            raise ValueError(f"{self.archive}: member {m.name!r} of {m.size} bytes passes the limit of "
                             f"{self.max_member_bytes} bytes a member and {self.max_total_bytes} bytes in all; "
                             f"not unpacked")
        self.total += m.size
        if self.top is None:
            self.top = parts[0]
        if parts[0] != self.top or len(parts) < 2:
            raise ValueError(f"{self.archive}: member {m.name!r} outside the bundle directory")
        return True

    def scan(self) -> None:
        """A first pass over the headers only, so that a refused archive writes nothing."""
        with tarfile.open(self.archive, "r:gz") as tar:
            while (m := tar.next()) is not None:  # one header at a time: at most max_members are held
                self.check(m)
        self.finish()

    def finish(self) -> str:
        if self.top is None:
            raise ValueError(f"{self.archive}: empty archive")
        return self.top


def _size(p: Path) -> int:
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


class LocalStore:
    """Bundles under one directory, as directories or (tarball=True) .tar.gz files."""

    def __init__(self, root: Path, *, tarball: bool = False) -> None:
        self.root = root
        self.tarball = tarball

    def open(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    def close(self) -> None:
        return None

    def put(self, local: Path, name: str) -> str:
        path_component(name)  # a bundle is written, and replaced, only inside the store's directory
        self.open()
        if self.tarball:
            target = self.root / f"{name}{TAR_SUFFIX}"
            tmp = target.with_name(f".{target.name}.tmp")
            pack(local, tmp) if local.is_dir() else shutil.copyfile(local, tmp)
            os.replace(tmp, target)
        else:
            target = self.root / name
            if local.resolve() != target.resolve():
                if target.exists():
                    shutil.rmtree(target)
                shutil.copytree(local, target)
        return str(target)

    def _entries(self) -> Iterator[tuple[str, Path]]:
        if not self.root.is_dir():
            return
        for p in self.root.iterdir():
            if p.name.startswith("."):
                continue
            if p.is_dir() and (p / MANIFEST).is_file():
                yield p.name, p
            elif p.is_file() and p.name.endswith(TAR_SUFFIX):
                yield p.name[: -len(TAR_SUFFIX)], p

    def list(self) -> list[StoredBundle]:
        out = []
        for name, p in self._entries():
            out.append(StoredBundle(name, datetime.fromtimestamp(p.stat().st_mtime, UTC), _size(p), str(p)))
        return sorted(out, key=lambda b: (b.created, b.name))

    def delete(self, name: str) -> None:
        for n, p in self._entries():
            if n == name:
                shutil.rmtree(p) if p.is_dir() else p.unlink()

    def fetch(self, name: str, dest: Path) -> Path:
        for n, p in self._entries():
            if n == name:
                return unpack(p, dest) if p.is_file() else p
        raise KeyError(name)


class BlobStore:
    """Bundles in an Azure Blob container under `prefix`: `<prefix><bundle>/<file>` or `<prefix><bundle>.tar.gz`.

    The credential defaults to DefaultAzureCredential (workload identity in the cluster); tests pass
    Azurite's named key. Every call is bounded by the SDK's timeouts and retried by its policy.
    """

    def __init__(self, account_url: str, container: str, *, prefix: str = "", credential: Any = None,
                 tarball: bool = False, timeout_s: float = 30.0, retries: int = 3) -> None:
        self.account_url = account_url
        self.container_name = container
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.credential = credential
        self.tarball = tarball
        self.timeout_s = timeout_s
        self.retries = retries
        self._service: Any = None
        self._container: Any = None

    def open(self) -> None:
        from azure.core.exceptions import AzureError, ResourceExistsError
        from azure.storage.blob import BlobServiceClient, ExponentialRetry

        cred = self.credential
        if cred is None:
            from azure.identity import DefaultAzureCredential

            cred = DefaultAzureCredential()
        retry = ExponentialRetry(initial_backoff=2, increment_base=2, retry_total=self.retries)
        self._service = BlobServiceClient(self.account_url, credential=cred, connection_timeout=self.timeout_s,
                                          read_timeout=self.timeout_s, retry_policy=retry)
        self._container = self._service.get_container_client(self.container_name)
        try:
            self._container.create_container()
        except ResourceExistsError:
            pass
        except AzureError as e:
            raise StoreError(f"blob store {self.account_url}/{self.container_name}: {e}") from e

    def close(self) -> None:
        if self._service is not None:
            self._service.close()
            self._service = self._container = None

    def _client(self) -> Any:
        if self._container is None:
            self.open()
        return self._container

    def put(self, local: Path, name: str) -> str:
        from azure.core.exceptions import AzureError

        c = self._client()
        try:
            if self.tarball or local.is_file():
                blob = f"{self.prefix}{name}{TAR_SUFFIX}"
                if local.is_dir():
                    tmp = local.parent / f".{name}{TAR_SUFFIX}.tmp"
                    pack(local, tmp)
                    data = tmp.read_bytes()
                    tmp.unlink()
                else:
                    data = local.read_bytes()
                c.upload_blob(blob, data, overwrite=True)
                return f"{self.account_url}/{self.container_name}/{blob}"
            # The manifest goes last: a bundle with a manifest is complete.
            files = sorted((p for p in local.rglob("*") if p.is_file() and not p.is_symlink()),
                           key=lambda p: p.name == MANIFEST)
            for p in files:
                c.upload_blob(f"{self.prefix}{name}/{p.relative_to(local).as_posix()}", p.read_bytes(), overwrite=True)
            return f"{self.account_url}/{self.container_name}/{self.prefix}{name}/"
        except AzureError as e:
            raise StoreError(f"blob store {self.account_url}/{self.container_name}: upload of {name} failed: "
                             f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e

    def list(self) -> list[StoredBundle]:
        from azure.core.exceptions import AzureError

        c = self._client()
        sizes: dict[str, int] = {}
        created: dict[str, datetime] = {}
        complete: set[str] = set()
        try:
            for b in c.list_blobs(name_starts_with=self.prefix or None):
                rest = b.name[len(self.prefix):]
                if rest.endswith(TAR_SUFFIX) and "/" not in rest:
                    name = rest[: -len(TAR_SUFFIX)]
                    complete.add(name)
                else:
                    name, _, file = rest.partition("/")
                    if file == MANIFEST:
                        complete.add(name)
                sizes[name] = sizes.get(name, 0) + int(b.size or 0)
                t = b.last_modified or datetime.now(UTC)
                created[name] = max(created.get(name, t), t)
        except AzureError as e:
            raise StoreError(f"blob store {self.account_url}/{self.container_name}: {e}") from e
        return sorted((StoredBundle(n, created[n], sizes[n], f"{self.account_url}/{self.container_name}/"
                                    f"{self.prefix}{n}") for n in complete), key=lambda b: (b.created, b.name))

    def delete(self, name: str) -> None:
        c = self._client()
        for b in list(c.list_blobs(name_starts_with=f"{self.prefix}{name}")):
            rest = b.name[len(self.prefix) + len(name):]
            if rest == TAR_SUFFIX or rest.startswith("/"):
                c.delete_blob(b.name)

    def fetch(self, name: str, dest: Path) -> Path:
        """Download a bundle into dest: its directory (tarballs unpacked)."""
        c = self._client()
        tar_blob = f"{self.prefix}{name}{TAR_SUFFIX}"
        blobs = list(c.list_blobs(name_starts_with=f"{self.prefix}{name}"))
        if any(b.name == tar_blob for b in blobs):
            local = dest / f"{name}{TAR_SUFFIX}"
            dest.mkdir(parents=True, exist_ok=True)
            local.write_bytes(c.download_blob(tar_blob).readall())
            return unpack(local, dest / "unpacked")
        root = dest / name
        for b in blobs:
            rel = b.name[len(self.prefix) + len(name) + 1:]
            parts = PurePosixPath(rel).parts
            if not rel or ".." in parts or PurePosixPath(rel).is_absolute():
                continue
            target = root.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(c.download_blob(b.name).readall())
        if not (root / MANIFEST).is_file():
            raise KeyError(name)
        return root


def apply_retention(store: BundleStore, now: datetime, *, max_age: timedelta, max_total_bytes: int) -> list[str]:
    """Delete bundles older than max_age, then the oldest until the total fits; returns the deleted names."""
    bundles = store.list()
    deleted = []
    keep = []
    for b in bundles:
        if now - b.created > max_age:
            store.delete(b.name)
            deleted.append(b.name)
        else:
            keep.append(b)
    total = sum(b.bytes for b in keep)
    for b in keep[:-1]:  # the newest bundle always stays
        if total <= max_total_bytes:
            break
        store.delete(b.name)
        deleted.append(b.name)
        total -= b.bytes
    return deleted


def latest_bundle(store: BundleStore, namespace: str, run: str) -> StoredBundle | None:
    """The newest bundle of one run (names are `<namespace>.<run>.<time>`)."""
    prefix = f"{namespace}.{run}."
    mine = [b for b in store.list() if b.name.startswith(prefix) and "." not in b.name[len(prefix):]]
    return max(mine, key=lambda b: (b.name[len(prefix):], b.created), default=None)
