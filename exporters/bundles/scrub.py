"""The redact pass of a bundle: every string of every object, every log line, every text file.

Built on `collector.redact` (named, linear-time rules) with a `RedactionLog` that records where
and which rule fired, never the value. Values in objects are judged by their key
(`collector.redact.is_secret_name`): when the key, an env entry's `name` or a flag before it in an
argv list names a secret, the whole value is masked, whatever it looks like. Keys are redacted
too (a token used as a map key), so the locations in REDACTIONS.md never show a secret.
"""

from __future__ import annotations

from typing import Any

import orjson

from collector.redact import MASK, MAX_TEXT, RedactionLog, flag_value, is_secret_name, redact, redact_key_blocks

# Log text is redacted in chunks below the redactor's input bound, cut at line ends; a line longer
# than a chunk is redacted whole, up to MAX_LINE (its head kept, the rest cut with a marker).
_CHUNK = MAX_TEXT - 1024
MAX_LINE = 4 << 20
_MAX_DEPTH = 64
_MAX_EMBEDDED = 1 << 20
_NAME_KEYS = ("name", "key")  # {"name": "DB_PASS", "value": ...}: env, Helm/Argo parameters


def scrub_text(text: str, where: str, log: RedactionLog) -> str:
    """Redact text of any length: key blocks over the whole text, the rest chunk by chunk at line ends."""
    if len(text) <= _CHUNK:
        return log.apply(text, where)
    text, counts = redact_key_blocks(text)
    log.add(where, counts)
    out: list[str] = []
    pos = 0
    while pos < len(text):
        end = min(len(text), pos + _CHUNK)
        if end < len(text):
            nl = text.rfind("\n", pos, end)
            if nl >= pos:
                end = nl + 1
            else:  # one line longer than a chunk: the redactor sees it whole, never a piece of it
                nl = text.find("\n", end)
                end = len(text) if nl < 0 else nl + 1
        out.append(log.apply(text[pos:end], where, limit=max(MAX_TEXT, min(end - pos, MAX_LINE))))
        pos = end
    return "".join(out)


def _masks(value: Any) -> bool:
    """A value that a secret's name masks: text and numbers (a PIN is a number), not booleans or empties."""
    if isinstance(value, bool) or value is None or value in ("", MASK):
        return False
    return isinstance(value, str | int | float)


def _scrub_string(value: str, where: str, log: RedactionLog, depth: int) -> str:
    head = value.lstrip()[:1]
    if head in ("{", "[") and len(value) <= _MAX_EMBEDDED:
        # JSON inside a string (kubectl's last-applied-configuration annotation repeats the whole
        # spec, env included): judge its entries by their own keys.
        try:
            inner = orjson.loads(value)
        except orjson.JSONDecodeError:
            inner = None
        if isinstance(inner, dict | list):
            return orjson.dumps(scrub_json(inner, where, log, depth=depth + 1)).decode()
    return scrub_text(value, where, log)


def _scrub_list(items: list[Any], where: str, log: RedactionLog, key: str, path: str, depth: int) -> list[Any]:
    secret = bool(key) and is_secret_name(key)
    out: list[Any] = []
    flag = ""
    for i, v in enumerate(items):
        loc = f"{path}[{i}]"
        if (secret or flag) and _masks(v):
            repl = MASK if secret else flag_value(flag, str(v), " ".join(str(x) for x in items[max(0, i - 3):i - 1]))
            if repl is not None and repl != v:
                log.masked(f"{where}:{loc}", "secret-assignment" if secret else "secret-flag")
                out.append(repl)
                flag = ""
                continue
        # argv: ["--password", "x"], ["-p", "x"]: the element after a flag is that flag's value
        flag = v if isinstance(v, str) and v.startswith("-") and "=" not in v and len(v) <= 64 else ""
        out.append(scrub_json(v, where, log, key="" if secret else key, path=loc, depth=depth + 1))
    return out


def _scrub_dict(obj: dict[Any, Any], where: str, log: RedactionLog, path: str, depth: int) -> dict[str, Any]:
    named = next((obj[k] for k in _NAME_KEYS if isinstance(obj.get(k), str)), None) if "value" in obj else None
    out: dict[str, Any] = {}
    for k, v in obj.items():
        sk = str(k)
        key_out = log.apply(sk, f"{where}:{path or '$'}") if sk else sk  # a secret used as a key
        while key_out in out:  # two masked keys stay two entries
            key_out += "'"
        loc = f"{path}.{key_out}" if path else key_out
        judged = named if (sk == "value" and named) else sk
        if _masks(v) and is_secret_name(judged):
            log.masked(f"{where}:{loc}", "secret-assignment")
            out[key_out] = MASK
        else:
            out[key_out] = scrub_json(v, where, log, key=judged, path=loc, depth=depth + 1)
    return out


def scrub_json(obj: Any, where: str, log: RedactionLog, *, key: str = "", path: str = "", depth: int = 0) -> Any:
    """A copy of a JSON value with every string redacted and every value a secret's name holds masked."""
    if depth > _MAX_DEPTH:
        return "[cut: nested too deeply]"
    if isinstance(obj, str):
        return _scrub_string(obj, f"{where}:{path or '$'}", log, depth) if obj else obj
    if isinstance(obj, list):
        return _scrub_list(obj, where, log, key, path, depth)
    if isinstance(obj, dict):
        return _scrub_dict(obj, where, log, path, depth)
    return obj


def report(log: RedactionLog, *, title: str, rules_note: str = "") -> str:
    """REDACTIONS.md: where, which rule, how often; never the value (locations are redacted too)."""
    rows = log.rows()
    lines = [f"# {title}", ""]
    if rules_note:
        lines += [rules_note, ""]
    if not rows:
        lines.append("Nothing was redacted.")
        return "\n".join(lines) + "\n"
    total = sum(n for _, _, n in rows)
    lines += [f"{total} value(s) replaced by `[REDACTED]`. Locations are file:JSON path (or file for text).", "",
              "| where | rule | count |", "| --- | --- | --- |"]
    for where, rule, n in rows:
        shown = redact(where).replace("|", "%7C").replace("`", "%60").replace("\n", " ")
        lines.append(f"| `{shown}` | {rule} | {n} |")
    return "\n".join(lines) + "\n"
