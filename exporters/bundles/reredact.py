"""`bundle redact`: the current rules applied again to a bundle, written as a new copy.

A bundle is handed around and edited, so nothing in it is trusted to be what the writer left:
every regular file is redacted (JSON by its keys, JSON lines line by line, text line-chunk by
line-chunk, streamed so memory stays bounded whatever a file's size) or removed when it cannot be
(binary, compressed, HTML other than the timeline page, links and other non-files), and each
removal is listed in the manifest's `missing`. `index.html` is rebuilt from the redacted
`timeline.json`, or removed when that cannot be read. The manifest is redacted whole (extra keys
too) and its hashes recomputed. The source is only read: the caller swaps the copy in.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from collector.model import rfc3339
from collector.redact import MAX_KEY_BLOCK, RedactionLog
from exporters.bundles.scrub import MAX_LINE, report, scrub_json, scrub_text
from exporters.bundles.timeline import render_page
from exporters.bundles.writer import MANIFEST, REDACTIONS, file_list, is_binary, json_bytes

MAX_JSON_BYTES = 64 << 20  # a larger .json is redacted as text (parsing takes ~5x its size)
_BLOCK = 4 << 20
_PAGE = "index.html"
_UNREADABLE = (".gz", ".tgz", ".zip", ".bz2", ".xz", ".zst", ".7z", ".tar", ".pkl", ".pickle", ".pt", ".pth",
               ".npy", ".npz", ".parquet", ".png", ".jpg", ".jpeg", ".gif", ".pdf")
_MARKUP = (".html", ".htm", ".xhtml", ".svg")  # entities hide text from the rules (&#116;oken)


class BundleError(ValueError):
    """Not a bundle this command can redact (no readable manifest)."""


def _files(root: Path) -> Iterator[tuple[str, Path, os.stat_result]]:
    """Every entry under root but directories, links included, without following a link."""
    for top, dirs, names in os.walk(root, followlinks=False):
        dirs.sort()
        for name in sorted([*names, *(d for d in dirs if os.path.islink(os.path.join(top, d)))]):
            p = Path(top, name)
            yield p.relative_to(root).as_posix(), p, p.lstat()


def _why_removed(rel: str, st: os.stat_result, head: bytes) -> str:
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link, not a file of the bundle"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if rel.lower().endswith(_UNREADABLE) or is_binary(head):
        return "binary or compressed: it cannot be redacted"
    if rel.lower().endswith(_MARKUP) and rel != _PAGE:
        return "markup other than the timeline page: it cannot be checked"
    return ""


def _cut_at(data: bytes) -> int:
    """Where a streamed block may end: after its last line, never inside a private key block."""
    nl = data.rfind(b"\n")
    if nl < 0:
        return -1
    begin = data.rfind(b"-----BEGIN ", max(0, len(data) - MAX_KEY_BLOCK))
    if begin >= 0 and data.find(b"-----END ", begin) < 0:
        line = data.rfind(b"\n", 0, begin)
        if line >= 0:
            return line + 1
    return nl + 1


def _stream_text(src: Path, dst: Path, rel: str, log: RedactionLog) -> None:
    """Text redacted block by block at line ends; a line past MAX_LINE keeps its head, the rest is cut."""
    with src.open("rb") as fin, dst.open("wb") as fout:
        carry = b""
        skipping = False  # inside the cut-off rest of an over-long line
        while block := fin.read(_BLOCK):
            data = carry + block
            if skipping:
                nl = data.find(b"\n")
                if nl < 0:
                    carry = b""
                    continue
                data, skipping = data[nl + 1:], False
            cut = _cut_at(data)
            if cut < 0:
                if len(data) <= MAX_LINE:
                    carry = data
                    continue
                fout.write(scrub_text(data[:MAX_LINE].decode("utf-8", "replace"), rel, log).encode())
                fout.write(f"…[cut: a line over {MAX_LINE} bytes]\n".encode())
                carry, skipping = b"", True
                continue
            fout.write(scrub_text(data[:cut].decode("utf-8", "replace"), rel, log).encode())
            carry = data[cut:]
        if carry:
            fout.write(scrub_text(carry.decode("utf-8", "replace"), rel, log).encode())


def _json_lines(src: Path, dst: Path, rel: str, log: RedactionLog) -> None:
    """JSON lines by their keys; a line that is not JSON as text; a line past MAX_LINE keeps its head."""
    with src.open("rb") as fin, dst.open("wb") as fout:
        i = 0
        while line := fin.readline(MAX_LINE + 1):
            i += 1
            if len(line) > MAX_LINE and not line.endswith(b"\n"):
                while (rest := fin.readline(MAX_LINE)) and not rest.endswith(b"\n"):
                    pass  # the rest of an over-long line is cut
                line = line[:MAX_LINE] + f"…[cut: a line over {MAX_LINE} bytes]\n".encode()
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError:
                obj = None
            if obj is None:
                fout.write(scrub_text(line.decode("utf-8", "replace"), rel, log).encode())
            else:
                fout.write(orjson.dumps(scrub_json(obj, f"{rel}#{i}", log)) + b"\n")


def _copy_redacted(src: Path, dst: Path, rel: str, size: int, log: RedactionLog) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if rel.endswith(".json") and size <= MAX_JSON_BYTES:
        try:
            obj = orjson.loads(src.read_bytes())
        except orjson.JSONDecodeError:
            obj = None  # a broken file: redacted as text below
        if obj is not None:
            dst.write_bytes(json_bytes(scrub_json(obj, rel, log)))
            return
    if rel.endswith((".jsonl", ".ndjson")):
        _json_lines(src, dst, rel, log)
        return
    _stream_text(src, dst, rel, log)


def _manifest(src: Path) -> dict[str, Any]:
    path = src / MANIFEST
    try:
        st = path.lstat()
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_JSON_BYTES:
            raise BundleError(f"{path}: not a regular file of at most {MAX_JSON_BYTES} bytes")
        manifest = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as e:
        raise BundleError(f"{path}: unreadable manifest: {e}") from e
    if not isinstance(manifest, dict):
        raise BundleError(f"{path}: the manifest is not a JSON object")
    return manifest


def _page(dest: Path) -> str:
    """Rebuild index.html from the redacted timeline.json; the reason when it cannot be."""
    timeline = dest / "timeline.json"
    if not timeline.is_file():
        return "not rebuilt: no timeline.json; removed by bundle redact"
    try:
        data = orjson.loads(timeline.read_bytes())
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        (dest / _PAGE).write_text(render_page(data))
    except (orjson.JSONDecodeError, ValueError, TypeError, KeyError, AttributeError) as e:
        (dest / _PAGE).unlink(missing_ok=True)
        return f"not rebuilt: timeline.json is unreadable ({str(e)[:200]}); removed by bundle redact"
    return ""


def redact_bundle(src: Path, dest: Path, now: datetime) -> int:
    """Write the redacted copy of the bundle directory `src` into the new directory `dest`.

    Returns how many values were replaced. Raises BundleError when src has no readable manifest;
    src is never written.
    """
    manifest = _manifest(src)
    dest.mkdir()
    log = RedactionLog()
    removed: list[dict[str, str]] = []
    previous = ""
    for rel, p, st in _files(src):
        if rel in (MANIFEST, _PAGE) and stat.S_ISREG(st.st_mode):
            continue  # rebuilt below
        head = b""
        if stat.S_ISREG(st.st_mode):
            with p.open("rb") as fh:
                head = fh.read(8192)
        why = _why_removed(rel, st, head)
        if why:
            removed.append({"what": rel, "why": f"{why}; removed by bundle redact"})
        elif rel == REDACTIONS:
            with p.open("rb") as fh:  # the earlier sections, redacted again (an old report may show a key)
                previous = scrub_text(fh.read(MAX_LINE).decode("utf-8", "replace"), rel, log)
        else:
            out_rel = log.apply(rel, rel)  # a token in a file's name goes too
            while out_rel != rel and (dest / out_rel).exists():
                out_rel += "_"
            _copy_redacted(p, dest / out_rel, out_rel, st.st_size, log)
    page = _page(dest)
    if page and (src / _PAGE).exists():
        removed.append({"what": _PAGE, "why": page})
    manifest.pop("files", None)
    manifest = scrub_json(manifest, MANIFEST, log)
    missing = manifest.get("missing") if isinstance(manifest.get("missing"), list) else []
    manifest["missing"] = [*missing, *scrub_json(removed, MANIFEST, RedactionLog())]
    changed = sum(log.entries.values())
    section = report(log, title=f"Re-redaction {rfc3339(now)}",
                     rules_note="`taugrid-evidence bundle redact`: the current rules applied again to every file; "
                                "files that cannot be redacted removed (listed in the manifest's `missing`).")
    (dest / REDACTIONS).write_text(previous.rstrip("\n") + "\n\n" + section.replace("# ", "## ", 1))
    redactions = manifest.get("redactions") if isinstance(manifest.get("redactions"), list) else []
    manifest["redactions"] = [*redactions, {"at": rfc3339(now), "values": changed}]
    manifest["files"] = file_list(dest)
    (dest / MANIFEST).write_bytes(json_bytes(manifest))
    return changed
