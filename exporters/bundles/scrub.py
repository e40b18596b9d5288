"""The redact pass of a bundle: every string of every object, every log line, every text file.

Built on `collector.redact` (named, linear-time rules) with a `RedactionLog` that records where
and which rule fired, never the value. Strings in objects are judged with their key in view
(`DB_PASSWORD=...`, annotation `example.com/api-token: ...`), so a secret is caught by its name
even when the value itself looks harmless.
"""

from __future__ import annotations

from typing import Any

import orjson

from collector.redact import MAX_TEXT, RedactionLog

# Log text is redacted in chunks below the redactor's input bound, cut at line ends.
_CHUNK = MAX_TEXT - 1024
_MAX_DEPTH = 64
_MAX_EMBEDDED = 1 << 20


def scrub_text(text: str, where: str, log: RedactionLog) -> str:
    """Redact text of any length, chunk by chunk at line ends."""
    if len(text) <= _CHUNK:
        return log.apply(text, where)
    out: list[str] = []
    pos = 0
    while pos < len(text):
        end = min(len(text), pos + _CHUNK)
        if end < len(text):
            # Never split a PEM block: a chunk holding a BEGIN without its END ends before the BEGIN.
            begin = text.rfind("-----BEGIN ", pos, end)
            if begin > pos and text.find("-----END ", begin, end) < 0:
                end = begin
            nl = text.rfind("\n", pos, end)
            if nl > pos:
                end = nl + 1
        out.append(log.apply(text[pos:end], where))
        pos = end
    return "".join(out)


def _scrub_value(key: str, value: str, where: str, log: RedactionLog, depth: int) -> str:
    if not value:
        return value
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
    if key:
        joined = log.apply(f"{key}={value}", where)
        if joined.startswith(f"{key}="):
            return joined[len(key) + 1:]
    return scrub_text(value, where, log)


def scrub_json(obj: Any, where: str, log: RedactionLog, *, key: str = "", path: str = "", depth: int = 0) -> Any:
    """A copy of a JSON value with every string redacted; env entries judged by their name."""
    if depth > _MAX_DEPTH:
        return "[cut: nested too deeply]"
    if isinstance(obj, str):
        return _scrub_value(key, obj, f"{where}:{path or '$'}", log, depth)
    if isinstance(obj, list):
        return [scrub_json(v, where, log, key=key, path=f"{path}[{i}]", depth=depth + 1) for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        # {"name": "DB_PASSWORD", "value": "..."} (container env): the name is the key of the value.
        env_name = obj.get("name") if isinstance(obj.get("name"), str) and "value" in obj else None
        out: dict[str, Any] = {}
        for k, v in obj.items():
            sk = str(k)
            sub = env_name if (sk == "value" and env_name) else sk
            out[sk] = scrub_json(v, where, log, key=sub, path=f"{path}.{sk}" if path else sk, depth=depth + 1)
        return out
    return obj


def report(log: RedactionLog, *, title: str, rules_note: str = "") -> str:
    """REDACTIONS.md: where, which rule, how often; never the value."""
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
        lines.append(f"| `{where.replace('|', '%7C').replace('`', '%60')}` | {rule} | {n} |")
    return "\n".join(lines) + "\n"
