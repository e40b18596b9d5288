"""The controller's JSON log lines carry no secrets and no raw control characters (issue 8)."""

from __future__ import annotations

import json
import logging

from collector.logfmt import JsonFormatter


def test_log_lines_are_redacted_and_json_escaped() -> None:
    uri = "https://acct01.blob.core.windows.net/c/p?sv=2024-01-01&sig=c2lnbmF0dXJlLXNlY3JldA%3D%3D"
    record = logging.makeLogRecord({
        "name": "taugrid.controller", "levelno": logging.WARNING, "levelname": "WARNING",
        "msg": "skipped %s", "args": (f"checkpoint location {uri!r}: query strings are not accepted",),
        "problem": "event says password=hunter2-Sup3rS3cret \x1b]0;title\x07",
    })
    line = JsonFormatter().format(record)
    assert "\n" not in line and "\x1b" not in line
    doc = json.loads(line)
    assert "c2lnbmF0dXJlLXNlY3JldA" not in line and "hunter2-Sup3rS3cret" not in line
    assert "[REDACTED]" in doc["msg"] and "[REDACTED]" in doc["problem"]
