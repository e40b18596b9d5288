"""The bundle's redact pass on text longer than one redaction call, and on JSON."""

from __future__ import annotations

import hashlib

from collector.redact import MAX_TEXT, RedactionLog
from exporters.bundles.scrub import scrub_json, scrub_text

KEY_LINES = [hashlib.sha256(str(i).encode()).hexdigest()[:64] for i in range(25)]  # no line repeats


def test_long_logs_are_redacted_everywhere_and_a_key_block_is_never_split() -> None:
    chunk = MAX_TEXT - 1024  # what scrub_text hands redact() at once
    for offset in range(-1600, 0, 100):  # the PEM block (~1.7 kB) straddles the chunk boundary
        filler = "".join(f"step {i:06d} loss 1.0\n" for i in range((chunk + offset) // 21))  # 21 chars a line
        pem = "-----BEGIN PRIVATE KEY-----\n" + "\n".join(KEY_LINES)
        text = filler + pem + "\n-----END PRIVATE KEY-----\n" + "password=hunter2hunter2\n" * 3
        log = RedactionLog()
        out = scrub_text(text, "logs/x.log", log)
        assert [ln for ln in KEY_LINES if ln in out] == [], offset
        assert "hunter2hunter2" not in out
        assert out.startswith(filler[:1000]) and out.count("\n") >= filler.count("\n")
        assert ("logs/x.log", "private-key") in log.entries


def test_json_values_judged_by_their_key_and_env_name() -> None:
    log = RedactionLog()
    out = scrub_json({"env": [{"name": "DB_PASSWORD", "value": "Tr0ub4dor-horse"},
                              {"name": "EPOCHS", "value": "12"}],
                      "metadata": {"annotations": {"example.com/api-token": "abc123xyz789"}},
                      "tokenizer": "llama", "count": 3}, "f.json", log)
    assert out["env"][0]["value"] == "[REDACTED]" and out["env"][1]["value"] == "12"
    assert out["metadata"]["annotations"]["example.com/api-token"] == "[REDACTED]"
    assert out["tokenizer"] == "llama" and out["count"] == 3
    assert ("f.json:env[0].value", "secret-assignment") in log.entries
