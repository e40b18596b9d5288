"""Redaction: every planted secret shape is masked, ordinary training text is left alone, linear time."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.redact import MASK, RedactionLog, redact, redact_counted

JWT = "eyJhbGciOiJSUzI1NiIsImtpZCI6IkFCQyJ9.eyJhdWQiOiJodHRwczovL2t1YmVybmV0ZXMifQ.c2lnbmF0dXJlLXBhcnQtaGVyZQ"
SECRETS = {
    "jwt": f"mounting token {JWT} failed",
    "authorization-header": "request failed: Authorization: Bearer abcdef0123456789abcdef",
    "url-credentials": "cannot reach https://admin:hunter2pass@registry.example.com/v2/",
    "sas-signature": "GET https://acct.blob.core.windows.net/c/b?sv=2022-11-02&se=2026&sp=r&sig=AbCdEf0123456789%2BzzZ%3D",
    "connection-string-key": "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=Zm9vYmFyYmF6cXV4;Suffix=x",
    "aws-access-key": "using key AKIAIOSFODNN7EXAMPLE for s3",
    "github-token": "git clone with ghp_0123456789abcdefghijABCDEFGHIJ0123456789",
    "slack-token": "posting with xoxb-1234567890-abcdefghij",
    "api-key": "WANDB key sk-proj0123456789abcdefghijKLMN set",
    "azure-storage-key": "key " + "A" * 86 + "==",
    "secret-assignment": "env DB_PASSWORD=s3cr3t-Value! and clientSecret: 'verysecretvalue'",
    "private-key": "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\n-----END RSA PRIVATE KEY----- done",
}
PLANTED = {
    "jwt": JWT, "authorization-header": "abcdef0123456789abcdef", "url-credentials": "hunter2pass",
    "sas-signature": "AbCdEf0123456789", "connection-string-key": "Zm9vYmFyYmF6cXV4",
    "aws-access-key": "AKIAIOSFODNN7EXAMPLE", "github-token": "ghp_0123456789abcdefghij",
    "slack-token": "xoxb-1234567890", "api-key": "sk-proj0123456789", "azure-storage-key": "A" * 86,
    "secret-assignment": "s3cr3t-Value", "private-key": "MIIEpAIBAAKCAQEA",
}


@pytest.mark.parametrize("rule", sorted(SECRETS))
def test_each_shape_is_masked_by_its_rule(rule: str) -> None:
    out, counts = redact_counted(SECRETS[rule])
    assert PLANTED[rule] not in out
    assert MASK in out
    assert counts[rule] >= 1, counts


def test_secret_assignment_masks_both_forms() -> None:
    out = redact(SECRETS["secret-assignment"])
    assert "verysecretvalue" not in out and "s3cr3t" not in out
    assert out.startswith("env DB_PASSWORD=")  # the key stays: a reader learns where, not what


@pytest.mark.parametrize("text", [
    "iteration 100/ 1000 | consumed samples: 3200 | lm loss: 2.345E+00 | tokens: 409600",
    "{'loss': 0.1234, 'grad_norm': 1.5, 'learning_rate': 2e-05, 'epoch': 0.5}",
    "num_tokens=4096 auth=true token_count: 12",
    "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE)",
    "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.",
])
def test_training_and_scheduler_text_is_untouched(text: str) -> None:
    assert redact(text) == text


def test_log_reports_where_and_rule_never_value() -> None:
    log = RedactionLog()
    log.apply(SECRETS["jwt"], "events.json")
    log.apply(SECRETS["aws-access-key"], "logs/worker-0.txt")
    rows = log.rows()
    assert ("events.json", "jwt", 1) in rows and ("logs/worker-0.txt", "aws-access-key", 1) in rows
    assert all(JWT not in str(r) for r in rows)


@pytest.mark.parametrize("shape", ["[", "a", "=", "password", "token=", "eyJ", "-----BEGIN ", "https://a:", "A",
                                   "sig=", "Bearer "])
def test_adversarial_repetition_is_linear(shape: str) -> None:
    text = shape * (64 * 1024 // len(shape))
    t0 = time.perf_counter()
    redact(text)
    assert time.perf_counter() - t0 < 1.0


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=2000))
def test_never_raises_and_is_idempotent(text: str) -> None:
    once = redact(text)
    assert redact(once) == once
