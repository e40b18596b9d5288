"""Expstore plane: checkpoints of a run, listed from a local directory or an Azure Blob prefix.

A checkpoint is durable progress: the step it names survives a restart (DESIGN.md §3). The
default adapter lists one location and reads step numbers from entry names, for the common
trainers' layouts:

    checkpoint-1200/            Hugging Face Trainer
    iter_0001000/               Megatron-LM      (+ latest_checkpointed_iteration.txt)
    global_step1200/            DeepSpeed        (+ latest)
    epoch=3-step=1200.ckpt      PyTorch Lightning, NeMo (…-step=1200-….ckpt)
    ckpt-1200.index, ckpt-1200  TensorFlow       (+ checkpoint)
    1200/                       Orbax, T5X (numeric directories; checkpoint_1200/ too)
    step_500.pt                 plain PyTorch

Unfinished saves are not durable and are ignored: temporary names (`checkpoint-1200.tmp`,
`*.incomplete`, `*_tmp`, Orbax `1200.orbax-checkpoint-tmp-…`, NeMo's `…-unfinished` marker and the
checkpoint it marks), empty files and directories, and anything newer than the step that a
framework's own "latest" marker names (Megatron and DeepSpeed write it only once every rank saved).

I/O lives in the stores; `checkpoint_signal` is pure. Listing a missing directory gives no
entries, like an empty blob prefix: a run that has not saved yet has no checkpoint.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import re
import stat
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self, runtime_checkable

from collector.correlate import Signal
from collector.model import Plane, Ref
from collector.progress.model import LogScan, ProgressSample
from collector.settings import StorageSettings

if TYPE_CHECKING:
    from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential, TokenCredential
    from azure.storage.blob import ContainerClient

    BlobCredential = str | dict[str, str] | AzureNamedKeyCredential | AzureSasCredential | TokenCredential

SOURCE = "checkpoints"
FORMAT = "checkpoint"

# Files in which a framework names its last *complete* checkpoint, and how much of one is read.
MARKER_NAMES: frozenset[str] = frozenset({"latest", "latest_checkpointed_iteration.txt", "checkpoint"})
MARKER_MAX_BYTES = 4096
MAX_DIAGNOSTICS = 100


class CheckpointSourceError(Exception):
    """An I/O failure at the Expstore boundary. `retryable`: worth trying again after a backoff."""

    retryable = True


class RetryableCheckpointError(CheckpointSourceError):
    """Network errors, timeouts, throttling (429/503), other 5xx, transient file system errors."""


class PermanentCheckpointError(CheckpointSourceError):
    """Authentication or authorization failed, container or account not found, not a directory."""

    retryable = False


@dataclass(frozen=True, slots=True)
class CheckpointEntry:
    """One entry directly under the listed location: a file, or a directory (blob prefix).

    `modified` is timezone-aware UTC: for a directory, the newest file in it (when it was
    completed). `size` is bytes (a directory's total, when it was fully walked), None if unknown.
    `marker` is the text of a "latest" marker file (see MARKER_NAMES), else None.
    """

    name: str
    modified: datetime
    size: int | None
    marker: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.modified.tzinfo is None or self.modified.utcoffset() is None:
            raise ValueError(f"CheckpointEntry {self.name!r}: modified time must be timezone-aware")
        if self.modified.utcoffset() != UTC.utcoffset(None):
            object.__setattr__(self, "modified", self.modified.astimezone(UTC))


Entries = list[CheckpointEntry]  # `list` is shadowed inside the store classes


@runtime_checkable
class CheckpointStore(Protocol):
    """Where a run's checkpoints are. `list` may be called many times between `open` and `close`."""

    def open(self) -> None: ...

    def close(self) -> None: ...

    def list(self, prefix: str) -> Entries: ...


# --- names ------------------------------------------------------------------------------------

_SUFFIX_TOKENS = r"(?:tmp|temp|incomplete|partial|part|unfinished|inprogress|in_progress|in-progress|uploading|saving)"
_PARTIAL = re.compile(
    rf"(?:^|[._\-=~])(?:{_SUFFIX_TOKENS}|tmp[0-9a-z]+)(?:$|[._\-=~])",
    re.IGNORECASE,
)
# Step keys by priority: an explicit step beats an iteration, which beats a bare checkpoint index.
_STEP_PATTERNS: tuple[re.Pattern[str], ...] = (
    re.compile(r"(?<![a-z])(?:global_step|global-step|step|steps)[=_\-]?(\d+)(?!\d)", re.IGNORECASE),
    re.compile(r"(?<![a-z])(?:iteration|iter)[=_\-]?(\d+)(?!\d)", re.IGNORECASE),
    re.compile(r"(?<![a-z])(?:checkpoint|ckpt)[=_\-]?(\d+)(?!\d)", re.IGNORECASE),
)
_NUMERIC = re.compile(r"^(\d+)(?:\.(?:pt|pth|ckpt|bin|safetensors|pkl|msgpack|distcp))?$", re.IGNORECASE)
# TensorFlow writes one checkpoint as several files: ckpt-1200.index, ckpt-1200.data-00000-of-00001.
_TF_PART = re.compile(r"\.(?:index|meta|data-\d+-of-\d+)$")
# NeMo: `<checkpoint without .ckpt/.nemo>-unfinished` exists while <checkpoint> is being saved.
_UNFINISHED_MARKER = "-unfinished"
_NEMO_EXT = re.compile(r"\.(?:ckpt|nemo)$")
_TF_MARKER_PATH = re.compile(r'model_checkpoint_path:\s*"([^"]*)"')


def is_partial(name: str) -> bool:
    """A temporary or unfinished save (`.tmp`, `_tmp`, `.incomplete`, `-unfinished`, Orbax `-tmp-`)."""
    return bool(_PARTIAL.search(name))


def step_of(name: str) -> int | None:
    """The training step a checkpoint name carries, or None (no step, or an unfinished save)."""
    name = name.rstrip("/")
    if not name or name.startswith(".") or is_partial(name):
        return None
    m = _NUMERIC.match(name)
    if m:
        return int(m.group(1))
    for pattern in _STEP_PATTERNS:
        m = pattern.search(name)
        if m:
            return int(m.group(1))
    return None


def marker_step(text: str) -> int | None:
    """The step a "latest" marker names: `1000` (Megatron), `global_step1200` (DeepSpeed),
    `model_checkpoint_path: "ckpt-1200"` (TensorFlow); None for `release` or anything else."""
    m = _TF_MARKER_PATH.search(text)
    value = m.group(1) if m else (text.strip().splitlines() or [""])[0].strip()
    value = value.rstrip("/").rsplit("/", 1)[-1]
    if value.isdigit():
        return int(value)
    return step_of(value)


# --- the signal (pure) ---------------------------------------------------------------------------


def checkpoint_signal(ref: Ref, entries: Sequence[CheckpointEntry], read_at: datetime) -> Signal:
    """The durable progress signal of one checkpoint listing: one sample per complete checkpoint.

    A step saved more than once (Lightning's `-v1` copies, a re-save after a restart) is dated by
    its first complete save; a TensorFlow file set by its newest file.
    """
    diagnostics: list[str] = []
    dropped = 0

    def note(text: str) -> None:
        nonlocal dropped
        if len(diagnostics) < MAX_DIAGNOSTICS:
            diagnostics.append(text)
        else:
            dropped += 1

    markers: list[tuple[str, int]] = []
    for e in entries:
        if e.marker is None:
            continue
        ms = marker_step(e.marker)
        if ms is None:
            note(f"{e.name}: marker does not name a step ({e.marker.strip()[:60]!r}); not used")
        else:
            markers.append((e.name, ms))
    complete_up_to = min((s for _, s in markers), default=None)
    if len({s for _, s in markers}) > 1:
        listed = ", ".join(f"{n}={s}" for n, s in sorted(markers))
        note(f"markers disagree ({listed}); using the lowest, {complete_up_to}")

    unfinished = {e.name[: -len(_UNFINISHED_MARKER)] for e in entries if e.name.endswith(_UNFINISHED_MARKER)}

    # step -> stem -> newest modified of that stem (a TF file set completes with its last file)
    by_step: dict[int, dict[str, datetime]] = {}
    for e in sorted(entries, key=lambda x: x.name):
        name = e.name.rstrip("/")
        if e.marker is not None or name in MARKER_NAMES or name.startswith("."):
            continue
        if name.endswith(_UNFINISHED_MARKER):
            continue
        if unfinished and _NEMO_EXT.sub("", name) in unfinished:
            note(f"{name}: being saved ({name}{_UNFINISHED_MARKER} present); ignored")
            continue
        if is_partial(name):
            note(f"{name}: temporary or unfinished save; ignored")
            continue
        step = step_of(name)
        if step is None:
            note(f"{name}: no step number in the name; ignored")
            continue
        if e.size == 0:
            note(f"{name}: empty; ignored")
            continue
        if complete_up_to is not None and step > complete_up_to:
            note(f"{name}: step {step} is past the last complete checkpoint ({complete_up_to}); ignored")
            continue
        stems = by_step.setdefault(step, {})
        stem = _stem(name)
        prev = stems.get(stem)
        stems[stem] = e.modified if prev is None else max(prev, e.modified)

    if complete_up_to is not None and complete_up_to not in by_step:
        note(f"the last complete checkpoint, step {complete_up_to}, is not in the listing")
    if dropped:
        diagnostics.append(f"... and {dropped} more diagnostics")

    samples = tuple(
        ProgressSample(step=step, at=min(stems.values()), loss=None, line=0, format=FORMAT)
        for step, stems in sorted(by_step.items())
    )
    scan = LogScan(
        source=SOURCE,
        format=FORMAT if samples else None,
        samples=samples,
        hangs=(),
        xids=(),
        diagnostics=tuple(diagnostics),
        lines=len(entries),
    )
    return Signal(ref=ref, source=SOURCE, scan=scan, read_at=read_at, plane=Plane.EXPSTORE, durable=True)


def _stem(name: str) -> str:
    return _TF_PART.sub("", name)


# --- local directory ---------------------------------------------------------------------------


def _utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def _os_error(err: OSError, what: str) -> CheckpointSourceError:
    text = f"{what}: {err.strerror or err}"
    if isinstance(err, PermissionError | NotADirectoryError) or err.errno in (errno.EACCES, errno.EPERM):
        return PermanentCheckpointError(text)
    # EIO, ESTALE, ETIMEDOUT, ENOTCONN, … on network mounts (NFS, blobfuse): may pass.
    return RetryableCheckpointError(text)


class LocalCheckpointStore:
    """Checkpoints in a directory (a local disk, NFS, a blobfuse or CSI mount).

    `base` is the configured root (`storage.local_roots`; the store's own directory when not
    given). Every `list` opens the path from `base` one component at a time without following
    links (`O_NOFOLLOW | O_DIRECTORY` under the directory before), and lists and walks by file
    descriptor: a tenant who swaps a directory for a link after the location was accepted gets a
    refusal, never another directory's listing. Links inside a listing are skipped, not followed.

    A directory entry's time is the newest file found under it (at most `walk_limit` entries per
    checkpoint; past that, size is None). One listing reads at most `max_entries` entries and
    takes at most `budget_s` seconds (walks included): past either it fails, and the run's
    checkpoint evidence ages out to unknown rather than holding up every other run's.
    """

    def __init__(self, root: Path, *, walk_limit: int = 1000, base: Path | None = None,
                 max_entries: int = 10_000, budget_s: float = 10.0) -> None:
        self.root = Path(root)
        self.base = Path(base) if base is not None else self.root
        self.walk_limit = walk_limit
        self.max_entries = max_entries
        self.budget_s = budget_s
        below = Path(os.path.relpath(os.path.abspath(self.root), os.path.abspath(self.base))).parts
        if ".." in below:
            raise ValueError(f"checkpoint directory {self.root} is not below {self.base}")
        self._below = [p for p in below if p != "."]

    def __repr__(self) -> str:
        return f"LocalCheckpointStore({str(self.root)!r})"

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> Self:
        self.open()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _parts(self, prefix: str) -> list[str]:
        parts = [p for p in prefix.replace("\\", "/").split("/") if p not in ("", ".")]
        if ".." in parts:
            raise ValueError(f"checkpoint prefix {prefix!r} leaves the store root {self.root}")
        return self._below + parts

    def _open_beneath(self, parts: list[str], where: Path) -> int | None:
        """A descriptor of base/parts opened without following a link below base; None: missing."""
        try:
            fd = os.open(self.base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as err:
            raise _os_error(err, f"listing checkpoints in {where}") from err
        for i, part in enumerate(parts):
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                os.close(fd)
                return None
            except OSError as err:
                os.close(fd)
                if err.errno in (errno.ELOOP, errno.ENOTDIR):
                    at = self.base.joinpath(*parts[:i + 1])
                    raise PermanentCheckpointError(
                        f"listing checkpoints in {where}: {at} is a symbolic link or not a directory; "
                        "nothing below the configured root is reached through a link") from err
                raise _os_error(err, f"listing checkpoints in {where}") from err
            os.close(fd)
            fd = nxt
        return fd

    def list(self, prefix: str = "") -> Entries:
        parts = self._parts(prefix)
        where = self.base.joinpath(*parts)
        deadline = time.monotonic() + self.budget_s
        fd = self._open_beneath(parts, where)
        if fd is None:
            return []
        out: Entries = []
        try:
            with os.scandir(fd) as it:
                for n, de in enumerate(it, 1):
                    if n > self.max_entries:
                        raise PermanentCheckpointError(
                            f"listing checkpoints in {where}: more than {self.max_entries:,} entries; not read "
                            "(storage.checkpoint_max_entries)")
                    if time.monotonic() > deadline:
                        raise RetryableCheckpointError(
                            f"listing checkpoints in {where}: not done within {self.budget_s:g} s "
                            "(storage.checkpoint_list_budget)")
                    entry = self._entry(fd, de, deadline)
                    if entry is not None:
                        out.append(entry)
        except OSError as err:
            raise _os_error(err, f"listing checkpoints in {where}") from err
        finally:
            os.close(fd)
        out.sort(key=lambda e: e.name)
        return out

    def _entry(self, dir_fd: int, de: os.DirEntry[str], deadline: float) -> CheckpointEntry | None:
        try:
            st = de.stat(follow_symlinks=False)
        except FileNotFoundError:
            return None  # removed meanwhile (checkpoint rotation)
        if stat.S_ISDIR(st.st_mode):
            newest, size = self._walk(dir_fd, de.name, st.st_mtime, deadline)
            return CheckpointEntry(de.name, _utc(newest), size)
        if not stat.S_ISREG(st.st_mode):
            return None  # links (never followed below the root), FIFOs, devices, sockets
        marker = None
        if de.name in MARKER_NAMES and st.st_size <= MARKER_MAX_BYTES:
            # Never through a link: a tenant's `latest -> /var/run/secrets/...` would echo a token.
            try:
                fd = os.open(de.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
            except FileNotFoundError:
                return None
            except OSError:
                marker = ""  # swapped for a link meanwhile (ELOOP), or unreadable: a marker naming no step
            else:
                with os.fdopen(fd, "rb") as f:
                    marker = f.read(MARKER_MAX_BYTES).decode("utf-8", "replace")
        return CheckpointEntry(de.name, _utc(st.st_mtime), st.st_size, marker)

    def _walk(self, dir_fd: int, name: str, newest: float, deadline: float) -> tuple[float, int | None]:
        """Newest mtime and total size under `name` in `dir_fd`, by descriptor, links not followed.
        Each directory is opened again from `dir_fd` component by component, so that only a few
        descriptors are open at once however wide the tree."""
        size = 0
        seen = 0
        stack: list[tuple[str, ...]] = [(name,)]
        while stack:
            path = stack.pop()
            fd = _open_path(dir_fd, path)
            if fd is None:
                continue  # removed, or swapped for a file or a link meanwhile
            try:
                with os.scandir(fd) as it:
                    for de in it:
                        seen += 1
                        if seen > self.walk_limit or time.monotonic() > deadline:
                            return newest, None
                        try:
                            st = de.stat(follow_symlinks=False)
                        except FileNotFoundError:
                            continue
                        newest = max(newest, st.st_mtime)
                        if stat.S_ISDIR(st.st_mode):
                            stack.append((*path, de.name))
                        elif stat.S_ISREG(st.st_mode):
                            size += st.st_size
            finally:
                os.close(fd)
        return newest, size


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_path(dir_fd: int, path: tuple[str, ...]) -> int | None:
    """`path` under `dir_fd` opened one directory at a time without following links; None when a
    component is gone, a link or not a directory."""
    if not path:
        return None
    fd = dir_fd
    try:
        for part in path:
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except (FileNotFoundError, NotADirectoryError):
                return None
            except OSError as err:
                if err.errno == errno.ELOOP:
                    return None
                raise
            if fd != dir_fd:
                os.close(fd)
            fd = nxt
        out, fd = fd, dir_fd  # handed over: not closed below
        return out
    finally:
        if fd != dir_fd:
            os.close(fd)


# --- Azure Blob ---------------------------------------------------------------------------------


def _blob_error(err: Exception, what: str) -> CheckpointSourceError:
    from azure.core.exceptions import (
        ClientAuthenticationError,
        HttpResponseError,
        ResourceNotFoundError,
        ServiceRequestError,
        ServiceResponseError,
    )

    status: int | None = getattr(err, "status_code", None)
    code = getattr(err, "error_code", None)
    code = getattr(code, "value", code)  # StorageErrorCode is an enum
    detail = f" ({code})" if code else ""
    head = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    text = f"{what}: {f'HTTP {status}: ' if status else ''}{head}{detail}"
    if isinstance(err, ClientAuthenticationError):  # also covers azure-identity's CredentialUnavailableError
        return PermanentCheckpointError(text)
    if isinstance(err, ResourceNotFoundError):
        return PermanentCheckpointError(text)
    if isinstance(err, ServiceRequestError | ServiceResponseError):
        return RetryableCheckpointError(text)
    if isinstance(err, HttpResponseError):
        if status is None or status in (408, 429) or status >= 500:
            return RetryableCheckpointError(text)
        return PermanentCheckpointError(text)
    return RetryableCheckpointError(text)


@dataclass(slots=True)
class _DirInfo:
    modified: datetime
    size: int | None
    final: bool


class BlobCheckpointStore:
    """Checkpoints under a prefix of an Azure Blob container.

    "Directories" are listed with delimiter "/"; each one's time is its newest blob (one more
    listing per directory, at most `dir_blob_limit` blobs; past that size is None). A directory
    whose newest blob is older than `settle_s` is taken as finished and not listed again while
    the store stays open. Authentication: `DefaultAzureCredential` (workload identity) unless a
    credential is given (an account-key credential or a SAS for Azurite and tests).
    """

    def __init__(
        self,
        account_url: str,
        container: str,
        *,
        credential: BlobCredential | None = None,
        retries: int = 2,
        timeout_s: float = 20.0,
        dir_blob_limit: int = 5000,
        settle_s: float = 600.0,
        max_entries: int = 10_000,
        budget_s: float = 10.0,
    ) -> None:
        self.account_url = account_url.rstrip("/")
        self.container = container
        self._credential = credential
        self._owned_credential: TokenCredential | None = None
        self.retries = retries
        self.timeout_s = timeout_s
        self.dir_blob_limit = dir_blob_limit
        self.settle_s = settle_s
        self.max_entries = max_entries  # entries directly under the prefix, per listing
        self.budget_s = budget_s  # one listing's time, the directories' own listings included
        self._client: ContainerClient | None = None
        self._dirs: dict[str, _DirInfo] = {}

    @classmethod
    def from_connection_string(cls, connection_string: str, container: str, **kwargs: Any) -> BlobCheckpointStore:
        """A store from a storage connection string (Azurite's, in tests). Keys stay out of repr."""
        from azure.core.credentials import AzureNamedKeyCredential

        fields = dict(part.split("=", 1) for part in connection_string.strip().strip(";").split(";") if "=" in part)
        try:
            url = fields["BlobEndpoint"]
            credential = AzureNamedKeyCredential(fields["AccountName"], fields["AccountKey"])
        except KeyError as err:
            raise ValueError(f"connection string lacks {err.args[0]}") from None
        return cls(url, container, credential=credential, **kwargs)

    def __repr__(self) -> str:
        return f"BlobCheckpointStore({self.account_url!r}, {self.container!r})"

    def __enter__(self) -> Self:
        self.open()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def open(self) -> None:
        if self._client is not None:
            return
        from azure.storage.blob import ContainerClient, ExponentialRetry

        credential = self._credential
        if credential is None:
            if not self.account_url.lower().startswith("https://"):
                raise ValueError(f"{self!r}: workload identity needs https; give a credential for an http endpoint")
            from azure.identity import DefaultAzureCredential

            self._owned_credential = DefaultAzureCredential()
            credential = self._owned_credential
        self._client = ContainerClient(
            self.account_url,
            self.container,
            credential=credential,
            retry_policy=ExponentialRetry(
                initial_backoff=1, increment_base=2, retry_total=self.retries, random_jitter_range=1
            ),
            connection_timeout=self.timeout_s,
            read_timeout=self.timeout_s,
        )

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._owned_credential is not None:
            close = getattr(self._owned_credential, "close", None)
            if callable(close):
                close()
            self._owned_credential = None
        self._dirs.clear()

    def list(self, prefix: str = "") -> Entries:
        if self._client is None:
            self.open()
        client = self._client
        assert client is not None
        base = prefix.strip("/")
        base = f"{base}/" if base else ""
        where = f"{self.account_url}/{self.container}/{base}"
        from azure.core.exceptions import AzureError

        try:
            return self._list(client, base, where, time.monotonic() + self.budget_s)
        except AzureError as err:
            raise _blob_error(err, f"listing checkpoints in {where}") from err

    def _list(self, client: ContainerClient, base: str, where: str, deadline: float) -> Entries:
        from azure.storage.blob import BlobPrefix

        files: dict[str, CheckpointEntry] = {}
        dirs: list[str] = []
        for n, item in enumerate(client.walk_blobs(name_starts_with=base or None, delimiter="/"), 1):
            if n > self.max_entries:
                raise PermanentCheckpointError(f"listing checkpoints in {where}: more than {self.max_entries:,} "
                                               "entries; not read (storage.checkpoint_max_entries)")
            _in_time(deadline, where, self.budget_s)
            if isinstance(item, BlobPrefix):
                name = item.name[len(base) :].rstrip("/")
                if name:
                    dirs.append(name)
                continue
            name = item.name[len(base) :]
            if not name or name.endswith("/"):
                continue  # a folder-marker blob
            modified = item.last_modified
            if modified is None:
                continue
            marker = None
            if name in MARKER_NAMES and (item.size or 0) <= MARKER_MAX_BYTES:
                marker = self._read_marker(client, item.name) if item.size else ""
                if marker is None:
                    continue
            files[name] = CheckpointEntry(name, _aware(modified), item.size, marker)
        out: Entries = []
        live = set()
        for name in dirs:
            # Hierarchical-namespace accounts also list the directory itself as an empty blob.
            files.pop(name, None)
            key = base + name
            live.add(key)
            info = self._dirs.get(key)
            if info is None or not info.final:
                _in_time(deadline, where, self.budget_s)
                info = self._dir_info(client, key + "/")
                if info is None:
                    continue
                self._dirs[key] = info
            out.append(CheckpointEntry(name, info.modified, info.size))
        for key in [k for k in self._dirs if k.startswith(base) and "/" not in k[len(base) :] and k not in live]:
            del self._dirs[key]  # rotated away
        out.extend(files.values())
        out.sort(key=lambda e: e.name)
        return out

    @staticmethod
    def _read_marker(client: ContainerClient, blob: str) -> str | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            data = client.download_blob(blob, offset=0, length=MARKER_MAX_BYTES).readall()
        except ResourceNotFoundError:
            return None  # replaced or removed meanwhile
        return data.decode("utf-8", "replace")

    def _dir_info(self, client: ContainerClient, dir_prefix: str) -> _DirInfo | None:
        newest: datetime | None = None
        size: int | None = 0
        blobs = client.list_blobs(name_starts_with=dir_prefix, results_per_page=min(self.dir_blob_limit, 5000))
        for seen, blob in enumerate(blobs, 1):
            if seen > self.dir_blob_limit:
                size = None
                break
            if blob.last_modified is not None:
                m = _aware(blob.last_modified)
                newest = m if newest is None else max(newest, m)
            if size is not None:
                size += blob.size or 0
        if newest is None:
            return None  # emptied meanwhile
        final = (datetime.now(UTC) - newest).total_seconds() > self.settle_s
        return _DirInfo(newest, size, final)


def _in_time(deadline: float, where: str, budget_s: float) -> None:
    if time.monotonic() > deadline:
        raise RetryableCheckpointError(f"listing checkpoints in {where}: not done within {budget_s:g} s "
                                       "(storage.checkpoint_list_budget)")


def _aware(t: datetime) -> datetime:
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


# --- URIs ---------------------------------------------------------------------------------------

_ACCOUNT = re.compile(r"^[a-z0-9]{3,24}$")
_CONTAINER = re.compile(r"^(?:\$root|[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62})$")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# Endpoint suffixes of the Azure clouds (azure-identity's and the storage SDK's own tables).
CLOUD_SUFFIXES: dict[str, str] = {
    "public": "core.windows.net",
    "china": "core.chinacloudapi.cn",
    "usgov": "core.usgovcloudapi.net",
}


class RefusedLocation(ValueError):
    """A checkpoint location the platform did not configure: refused before any I/O."""


def _policy_suffixes(policy: StorageSettings) -> list[str]:
    out = []
    for cloud in sorted(policy.clouds):
        suffix = CLOUD_SUFFIXES.get(cloud.lower())
        if suffix is None:
            raise ValueError(f"storage.clouds: unknown cloud {cloud!r} (known: {', '.join(CLOUD_SUFFIXES)})")
        out.append(suffix)
    return out


def _namespaces_of(policy: StorageSettings, account: str) -> frozenset[str] | None:
    value = policy.account_namespaces.get(account)
    if value is None:
        return None
    return frozenset(n.strip() for n in value.split(",") if n.strip())


def _check_account(uri: str, account: str, namespace: str, policy: StorageSettings) -> None:
    if account not in policy.accounts and account not in policy.account_namespaces:
        raise RefusedLocation(
            f"checkpoint location {uri!r}: storage account {account!r} is not one the collector is configured "
            "to read (storage.accounts); refused, nothing fetched"
        )
    allowed = _namespaces_of(policy, account)
    if allowed is not None and namespace not in allowed:
        raise RefusedLocation(
            f"checkpoint location {uri!r}: storage account {account!r} serves namespaces "
            f"{', '.join(sorted(allowed)) or 'none'}, not {namespace!r} (storage.account_namespaces); refused"
        )


def _check_local(uri: str, path: Path, policy: StorageSettings) -> Path:
    """The configured root `path` lies under, as written (no `..`, no link followed: the store opens
    every component below the root without following links, on every read)."""
    if ".." not in path.parts:
        here = os.path.abspath(path)
        for r in sorted(policy.local_roots):
            for root in dict.fromkeys((os.path.abspath(r), os.path.realpath(r))):  # as written, or resolved
                if os.path.commonpath([root, here]) == root:
                    return Path(root)
    where = f"under {', '.join(sorted(policy.local_roots))}" if policy.local_roots \
        else "configured (storage.local_roots)"
    raise RefusedLocation(
        f"checkpoint location {uri!r}: a local path outside the directories checkpoints may be read from "
        f"({where}); refused, nothing read"
    )


def _local_store(path: Path, base: Path, policy: StorageSettings) -> LocalCheckpointStore:
    return LocalCheckpointStore(path, base=base, max_entries=policy.checkpoint_max_entries,
                                budget_s=policy.checkpoint_list_budget.total_seconds())


def store_for(uri: str, policy: StorageSettings, *, namespace: str = "",
              credential: BlobCredential | None = None) -> tuple[CheckpointStore, str]:
    """The store and the prefix for a checkpoint location a run in `namespace` names.

        /ckpt/run1, file:///ckpt/run1                          -> local directory, prefix ""
        https://ACCOUNT.blob.core.windows.net/CONTAINER/PREFIX  -> Azure Blob
        abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/PREFIX   -> Azure Blob (same account, blob endpoint)
        http://127.0.0.1:PORT/ACCOUNT/CONTAINER/PREFIX          -> Azurite (path-style, loopback only)

    The location is tenant input, and the collector's credentials go only where the platform
    configured (`policy`, docs/security.md): a listed storage account (for the namespaces it
    serves) on the endpoint suffix of a configured cloud, a local path under a configured root,
    an emulator account URL. Anything else raises RefusedLocation before any I/O.

    Blob stores authenticate with `credential`, else DefaultAzureCredential (workload identity):
    a SAS token in the URI is refused (no secrets in config). ValueError names a URI it cannot use.
    """
    text = uri.strip()
    if not text:
        raise ValueError("empty checkpoint location")
    parsed = urllib.parse.urlsplit(text)
    scheme = parsed.scheme.lower()
    if scheme == "" or (len(scheme) == 1 and text[1:2] == ":"):  # a plain path
        local = Path(text).expanduser()
        return _local_store(local, _check_local(uri, local, policy), policy), ""
    if scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"checkpoint location {uri!r}: file URI names a remote host {parsed.netloc!r}")
        if parsed.query or parsed.fragment:
            raise ValueError(f"checkpoint location {uri!r}: a file URI takes no query or fragment")
        path = urllib.parse.unquote(parsed.path)
        if not path.startswith("/"):
            raise ValueError(f"checkpoint location {uri!r}: a file URI needs an absolute path")
        return _local_store(Path(path), _check_local(uri, Path(path), policy), policy), ""
    if scheme not in ("https", "http", "abfs", "abfss"):
        raise ValueError(
            f"checkpoint location {uri!r}: unsupported scheme {parsed.scheme!r} "
            "(use a path, file://, https://ACCOUNT.blob.core.windows.net/CONTAINER/PREFIX or abfss://)"
        )
    if parsed.query:
        raise ValueError(
            f"checkpoint location {uri!r}: query strings (SAS tokens) are not accepted; "
            "the collector authenticates with workload identity"
        )
    if scheme in ("https", "http") and (parsed.username is not None or parsed.password is not None):
        raise RefusedLocation(f"checkpoint location {uri!r}: user information in the URL is refused")
    host = (parsed.hostname or "").lower()
    try:
        port = parsed.port
    except ValueError:
        raise ValueError(f"checkpoint location {uri!r}: bad port") from None
    path = urllib.parse.unquote(parsed.path).lstrip("/")
    suffixes = _policy_suffixes(policy)

    if scheme in ("abfs", "abfss"):
        container, _, account_host = parsed.netloc.rpartition("@")
        account, dot, suffix = account_host.lower().partition(".dfs.")
        if not container or not dot:
            raise ValueError(f"checkpoint location {uri!r}: expected abfss://CONTAINER@ACCOUNT.dfs.SUFFIX/PREFIX")
        if suffix not in suffixes:
            raise RefusedLocation(
                f"checkpoint location {uri!r}: {account_host!r} is not an Azure storage endpoint of the configured "
                f"cloud(s) ({', '.join(f'*.dfs.{x}' for x in suffixes)}); refused, nothing fetched"
            )
        if not _ACCOUNT.match(account):
            raise ValueError(f"checkpoint location {uri!r}: {account!r} is not a storage account name")
        _check_account(uri, account, namespace, policy)
        account_url, prefix = f"https://{account}.blob.{suffix}", path
    else:
        labels = host.split(".")
        virtual = len(labels) > 2 and (labels[1] == "blob" or labels[1:3] == ["privatelink", "blob"])
        if virtual:
            account = labels[0]
            allowed_hosts = {f"{account}.{kind}.{x}" for x in suffixes for kind in ("blob", "privatelink.blob")}
            if host not in allowed_hosts or port not in (None, 443):
                raise RefusedLocation(
                    f"checkpoint location {uri!r}: {parsed.netloc!r} is not an Azure Blob endpoint of the configured "
                    f"cloud(s) ({', '.join(f'ACCOUNT.blob.{x}' for x in suffixes)}); refused, nothing fetched "
                    "(the collector's storage token goes only to configured storage)"
                )
            if scheme != "https":
                raise ValueError(f"checkpoint location {uri!r}: Azure Blob endpoints need https")
            if not _ACCOUNT.match(account):
                raise ValueError(f"checkpoint location {uri!r}: {account!r} is not a storage account name")
            _check_account(uri, account, namespace, policy)
            account_url = f"https://{host}"
            container, _, prefix = path.partition("/")
        elif _is_loopback(host):
            account, _, rest = path.partition("/")
            if not _ACCOUNT.match(account):
                raise ValueError(
                    f"checkpoint location {uri!r}: expected {scheme}://{host}:PORT/ACCOUNT/CONTAINER/PREFIX"
                )
            netloc = f"[{host}]" if ":" in host else host
            if port is not None:
                netloc += f":{port}"
            account_url = f"{scheme}://{netloc}/{account}"
            if account_url not in {u.rstrip("/") for u in policy.emulator_urls}:
                raise RefusedLocation(
                    f"checkpoint location {uri!r}: {account_url} is not a configured emulator account "
                    "(storage.emulator_urls); refused, nothing fetched"
                )
            container, _, prefix = rest.partition("/")
        else:
            raise RefusedLocation(
                f"checkpoint location {uri!r}: not an Azure Blob endpoint "
                "(expected https://ACCOUNT.blob.core.windows.net/CONTAINER/PREFIX, or a loopback Azurite URL); "
                "refused, nothing fetched"
            )
    if not container:
        raise ValueError(f"checkpoint location {uri!r}: no container named")
    if not _CONTAINER.match(container):
        raise ValueError(f"checkpoint location {uri!r}: {container!r} is not a valid container name")
    if credential is None and not account_url.startswith("https://"):
        raise ValueError(
            f"checkpoint location {uri!r}: an http (Azurite) endpoint needs an explicit credential; "
            "workload identity tokens are only sent over https"
        )
    store = BlobCheckpointStore(account_url, container, credential=credential,
                                max_entries=policy.checkpoint_max_entries,
                                budget_s=policy.checkpoint_list_budget.total_seconds())
    return store, prefix.strip("/")


def read_checkpoints(store: CheckpointStore, prefix: str, ref: Ref, now: datetime) -> Signal:
    """List once and build the signal (the store must be open)."""
    return checkpoint_signal(ref, store.list(prefix), now)
