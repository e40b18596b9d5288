"""Structured JSON log lines (one object per line) for the controller and agent."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import orjson

from collector.redact import redact

_STANDARD = frozenset(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        # Log lines carry tenant text (object names, checkpoint locations, error messages that quote
        # them): redacted here, once, for every logger (docs/security.md). JSON escapes the rest.
        doc: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact(record.getMessage()),
        }
        for k, v in vars(record).items():
            if k not in _STANDARD and not k.startswith("_"):
                doc[k] = redact(v) if isinstance(v, str) else v
        if record.exc_info:
            doc["exc"] = redact(self.formatException(record.exc_info))
        return orjson.dumps(doc, default=lambda o: redact(str(o))).decode()


def setup_json_logging(level: str = "INFO") -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("urllib3").setLevel(logging.ERROR)
