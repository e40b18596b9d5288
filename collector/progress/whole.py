"""Whole texts and files through one `LineScanner` (the `scan` command, dumps, the API log poller).

`scan_path` reads a file in chunks (its tail only with `max_bytes`); over-long lines are cut before
the scanner sees them, which names them in a diagnostic.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from collector.progress.model import LogScan
from collector.progress.scan import LineScanner


def scan_lines(
    lines: Iterable[str | bytes],
    *,
    source: str,
    custom_regex: str | None = None,
    max_line_bytes: int = 1 << 20,
) -> LogScan:
    """Scan lines (with or without their terminators). Raises ValueError for a bad custom_regex."""
    sc = LineScanner(source, custom_regex, max_line_bytes)
    sc.feed_all(lines)
    return sc.finish()


def _split(text: str | bytes) -> Iterator[str | bytes]:
    # Not splitlines(): it also splits on \r (progress-bar redraws) and other separators.
    parts: list[str] | list[bytes] = text.split("\n") if isinstance(text, str) else text.split(b"\n")
    if parts and not parts[-1]:
        parts.pop()
    yield from parts


def scan_text(text: str | bytes, *, source: str, custom_regex: str | None = None) -> LogScan:
    return scan_lines(_split(text), source=source, custom_regex=custom_regex)


def _file_lines(f: BinaryIO, limit: int, chunk: int = 1 << 22) -> Iterator[bytes]:
    """Lines without terminators, read in chunks; an over-long line is cut to limit+1 bytes
    (scan_lines then truncates it with a diagnostic), the rest of it is read and dropped."""
    carry = b""
    while True:
        data = f.read(chunk)
        if not data:
            break
        parts = data.split(b"\n")
        if len(parts) == 1:  # still inside one line
            if len(carry) <= limit:
                carry = (carry + data)[: limit + 1]
            continue
        yield (carry + parts[0])[: limit + 1] if len(carry) <= limit else carry
        last = parts.pop()
        del parts[0]
        yield from parts
        carry = last[: limit + 1]
    if carry:
        yield carry


def scan_path(path: Path, *, custom_regex: str | None = None, max_bytes: int | None = None) -> LogScan:
    """Scan a file; with max_bytes, only its tail (from the first whole line in the last max_bytes)."""
    limit = 1 << 20
    sc = LineScanner(str(path), custom_regex, limit)
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        start = 0
        if max_bytes is not None and size > max_bytes:
            start = size - max(0, max_bytes)
        f.seek(max(0, start - 1))
        lines = _file_lines(f, limit)
        if start > 0:
            # the byte before the window says whether the window starts on a line boundary
            if f.read(1) != b"\n":
                next(lines, None)  # a partial line
            sc.diag(f"tail only: read from byte {start} of {size}; line numbers count from there")
        sc.feed_all(lines)
    return sc.finish()
