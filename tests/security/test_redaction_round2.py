"""Secrets that survived redaction (issue 26, round 2), planted where tenants put them.

The rule: when a key names a secret, its whole value is masked, whatever the value looks like
(short, numeric, punctuation first, holding spaces). Beside names: the argument after a password
or token flag, PGP key blocks, SAS signatures that start a value, URL passwords holding `@`,
Slack webhooks, Sentry DSNs, a secret across the redactor's chunk boundary, secrets used as keys.
Every planted value is first shown to be in the input (the control), then absent from every
file of the bundle (index.html and timeline.json included), from `explain` and from REDACTIONS.md;
text that is not secret (steps, losses, pods, reasons, ports, paths) still reads.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.claims import evaluate
from collector.cli import main
from collector.config import load_settings
from collector.correlate import build_index
from collector.redact import MASK, RedactionLog, redact, redact_counted
from collector.settings import Settings
from collector.sources.dump import load_dump
from exporters.bundles.scrub import report, scrub_json, scrub_text
from tests.dumpkit import event, pod, write_dump
from tests.progress.test_linear_patterns import PATTERNS
from tests.test_explain_fixtures import NOW, taurun

RUN, NS = "llm", "research"
AT = "2026-01-10T12:00:00Z"

SLACK_HOOK = "https://hooks.slack.com/services/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"
SENTRY_KEY = "4f6b1c9e2d7a48b0a3c5e8f1d2b9c6a7"
PGP_BODY = "lQOYBGXa1ZIBCADKq9v2kSx5OZ3mBtsE8x1N7cP0bJ4uW6yQ2rT9hLfGvA3dK8nM"
GH_KEY_AS_KEY = "ghp_" + "Zx8Yw7Vu6Ts5Rq4Po3Nm2Lk1Jh0GfEdCbA9z"
OPENAI_AS_KEY = "sk-" + "proj4Hq8Zt2Lw6Xc0Vb3Nm7Ks1Dj5Fg9"
CHUNK_TOKEN = "ghp_" + "Q1w2E3r4T5y6U7i8O9p0A1s2D3f4G5h6J7k8"

# name → the value that must not survive (each unique in the input)
SECRETS = {
    "DB_PASS numeric": "73910528",
    "KAGGLE_KEY short": "k4q",
    "AZURE_OPENAI_KEY punctuation first": "!pUnct-lead_Q7",
    "AZURE_STORAGE_KEY with spaces": "has spaces in Z8 it",
    "MY_SAS_TOKEN value": "sv=2024-05-04&ss=b&sp=r&sig=c0ffeeSasSig%2Bv4%3D",
    "REDIS_DSN value": "redis-dsn-7Kq2",
    "ALERT_WEBHOOK_URL value": "https://alerts.example.invalid/hook/3f9a7c",
    "psql --password in sh -c": "c0rrect horse batt3ry",
    "--token in args": "tok-9QmZx7Lw3",
    "mysql -p glued in a log": "MyS3cretPw88",
    "sshpass -p in a log": "sshpw-4471",
    "--password= in an event": "evPw-2Zq9",
    "PGP private key block": PGP_BODY,
    "SAS value starting with sig=": "Zm9vYmFyYmF6cXV4cXV1eA%3D%3D",
    "URL password with @ inside": "p@ss@w0rd!",
    "Slack webhook": "kV9xq2ZlT1wK8mN3pQ7rS5tU",
    "Sentry DSN": SENTRY_KEY,
    "secret across the chunk boundary": CHUNK_TOKEN,
    "GitHub token as a dict key": GH_KEY_AS_KEY,
    "OpenAI key as an annotation key": OPENAI_AS_KEY,
}

# Text that must read after redaction (the control against redacting into uselessness).
PLAIN = ["iteration      40/  250000", "lm loss: 2.461000E+00", "llm-w0", "FailedScheduling",
         "0/4 nodes are available", "NCCL_DEBUG", "INFO", "mkdir -p /data/ckpt", "docker run -p 8080:80",
         "psql -h db -p 5432", "num_tokens=4096", "eos_token", "topologyKey", "kubernetes.io/hostname",
         "nvidia.com/gpu", "Readiness probe failed"]


def _pgp_block() -> str:
    return ("-----BEGIN PGP PRIVATE KEY BLOCK-----\n\n" + PGP_BODY + "\nAAEBAAHJ2k3Lq0=\n=Xq3Z\n"
            "-----END PGP PRIVATE KEY BLOCK-----\n")


def _env() -> list[dict[str, str]]:
    return [
        {"name": "DB_PASS", "value": SECRETS["DB_PASS numeric"]},
        {"name": "KAGGLE_KEY", "value": SECRETS["KAGGLE_KEY short"]},
        {"name": "AZURE_OPENAI_KEY", "value": SECRETS["AZURE_OPENAI_KEY punctuation first"]},
        {"name": "AZURE_STORAGE_KEY", "value": SECRETS["AZURE_STORAGE_KEY with spaces"]},
        {"name": "MY_SAS_TOKEN", "value": SECRETS["MY_SAS_TOKEN value"]},
        {"name": "REDIS_DSN", "value": SECRETS["REDIS_DSN value"]},
        {"name": "ALERT_WEBHOOK_URL", "value": SECRETS["ALERT_WEBHOOK_URL value"]},
        {"name": "SENTRY_DSN", "value": f"https://{SENTRY_KEY}@o450123.ingest.sentry.io/4504412"},
        {"name": "NCCL_DEBUG", "value": "INFO"},
    ]


def _log() -> str:
    t = "2026-01-10T11:10:00.000000000Z"
    long_line = "x" * 70_000  # one line longer than a redaction call: the token straddles where it was cut
    cut = 64 * 1024 - 1024  # exporters.bundles.scrub's chunk before this fix
    long_line = long_line[: cut - 10] + f" {CHUNK_TOKEN} " + long_line[cut + 40:]
    lines = [
        f"{t} running: mysql -u root -p{SECRETS['mysql -p glued in a log']} runs < schema.sql",
        f"{t} sshpass -p {SECRETS['sshpass -p in a log']} ssh trainer@10.0.0.7",
        f"{t} reading blob with sas sig={SECRETS['SAS value starting with sig=']}&sv=2022-11-02&se=2026-02-01",
        f"{t} connect postgres://app:{SECRETS['URL password with @ inside']}@db.internal:5432/runs",
        f"{t} notify {SLACK_HOOK}",
        f"{t} sentry init https://{SENTRY_KEY}@o450123.ingest.sentry.io/4504412",
        f"{t} mkdir -p /data/ckpt && docker run -p 8080:80 exporter && psql -h db -p 5432 -c 'select 1'",
        f"{t} num_tokens=4096 eos_token: </s>",
        *(f"{t} {ln}" for ln in _pgp_block().splitlines()),
        f"{t} {long_line}",
    ]
    for i in range(40):
        lines.append(f"{t}  iteration {i + 1:>7}/  250000 | consumed samples: {1024 * (i + 1):>12} | "
                     f"lm loss: {2.5 - i * 0.001:.6E} | number of skipped iterations:   0 |")
    return "\n".join(lines) + "\n"


def hostile_dump(tmp_path: Path) -> Path:
    tr = taurun(RUN, NS, "Running", NOW - timedelta(hours=1), workers=1)
    tr["metadata"]["annotations"] = {f"notify.example.com/{OPENAI_AS_KEY}": "on-failure"}
    tr["spec"]["notify"] = {GH_KEY_AS_KEY: ["failed", "stalled"]}
    w0 = pod(f"{RUN}-w0", NS, NOW - timedelta(hours=1), node="gpu-1", gpus=8, labels={"taugrid.io/run": RUN},
             ready=False, containers=[{"name": "main", "ready": False, "restartCount": 0, "state": {"waiting": {
                 "reason": "CreateContainerConfigError",
                 "message": f"KAGGLE_KEY={SECRETS['KAGGLE_KEY short']} rejected; retry with "
                            f"--token {SECRETS['--token in args']}"}}}])
    c = w0["spec"]["containers"][0]
    c["env"] = _env()
    c["command"] = ["sh", "-c", f"psql --password '{SECRETS['psql --password in sh -c']}' -h db -p 5432 runs"]
    c["args"] = ["--token", SECRETS["--token in args"], "--epochs", "3"]
    w0["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"taugrid.io/run": RUN}}}]}}
    w0["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    ev = event(f"{RUN}-w0.probe", NS, w0, "Unhealthy",
               f"Readiness probe failed: mysql --password={SECRETS['--password= in an event']} -e 'select 1'",
               NOW - timedelta(minutes=2), type_="Warning", count=3)
    ev2 = event(f"{RUN}-w0.sched", NS, w0, "FailedScheduling",
                "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.", NOW - timedelta(minutes=50),
                type_="Warning", component="default-scheduler")
    return write_dump(tmp_path / "dump", [tr, w0, ev, ev2], logs={(NS, f"{RUN}-w0"): _log()})


def _forms(value: str) -> set[str]:
    return {value, json.dumps(value)[1:-1], value.replace("/", "\\/"), value.replace("&", "&amp;")}


def _leaks(texts: dict[str, str]) -> list[str]:
    return sorted(f"{name} ~at~ {where}" for where, text in texts.items() for name, value in SECRETS.items()
                  if any(f in text for f in _forms(value)))


def _files(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_bytes().decode("utf-8", "replace")
            for p in sorted(root.rglob("*")) if p.is_file()}


def _bundle(dump: Path, out: Path, *extra: str) -> Path:
    r = CliRunner().invoke(main, ["bundle", RUN, "--from-dump", str(dump), "--at", AT, "--out", str(out), *extra])
    assert r.exit_code == 0, r.output
    return Path(r.stdout.strip())


def test_the_planted_secrets_are_really_in_the_input(tmp_path: Path) -> None:
    dump = hostile_dump(tmp_path)
    found = {leak.split(" ~at~ ")[0] for leak in _leaks(_files(dump))}
    assert found == set(SECRETS)


def test_no_secret_survives_in_any_bundle_file_and_plain_text_still_reads(tmp_path: Path) -> None:
    dump = hostile_dump(tmp_path)
    b = _bundle(dump, tmp_path / "out")
    files = _files(b)
    assert {"index.html", "timeline.json", "events.json", "REDACTIONS.md", "manifest.json"} <= set(files)
    assert _leaks(files) == []
    everything = "\n".join(files.values())
    missing = [p for p in PLAIN if p not in everything]
    assert missing == [], "redacted into uselessness"
    # The key names stay: a reader learns where a secret was, not what it was.
    obj = json.loads(files[f"objects/Pod/{NS}/{RUN}-w0.json"])["versions"][0]["object"]
    env = {e["name"]: e["value"] for e in obj["spec"]["containers"][0]["env"]}
    assert env["NCCL_DEBUG"] == "INFO" and env["DB_PASS"] == MASK and env["KAGGLE_KEY"] == MASK
    assert obj["spec"]["containers"][0]["args"] == ["--token", MASK, "--epochs", "3"]
    assert obj["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"


def test_redactions_md_counts_real_replacements_and_never_prints_a_secret(tmp_path: Path) -> None:
    dump = hostile_dump(tmp_path)
    b = _bundle(dump, tmp_path / "out")
    rep = (b / "REDACTIONS.md").read_text()
    assert _leaks({"REDACTIONS.md": rep}) == []
    rows = [ln for ln in rep.splitlines() if ln.startswith("| `")]
    total = sum(int(ln.rsplit("|", 2)[1]) for ln in rows)
    assert f"{total} value(s) replaced" in rep
    # Every counted replacement is in the files: each leaves one mask behind (never fewer).
    masks = sum(t.count(MASK) for rel, t in _files(b).items()
                if rel not in ("REDACTIONS.md", "manifest.json", "index.html", "timeline.json"))
    assert 0 < total <= masks


def test_explain_shows_no_secret(tmp_path: Path) -> None:
    dump = hostile_dump(tmp_path)
    for fmt in ("json", "text"):
        r = CliRunner().invoke(main, ["explain", "--from-dump", str(dump), "--at", AT, "-o", fmt])
        assert r.exit_code in (0, 3), r.output
        assert _leaks({f"explain -o {fmt}": r.output}) == []
    # control: the waiting message holding two of the secrets reaches the claims before output
    d = load_dump(dump)
    index = build_index(d.records)
    index.synced.update(dict.fromkeys(d.snapshot_kinds(), NOW))
    raw = json.dumps([evaluate(ev, NOW, Settings().claims).to_json() for ev in index.all_evidence()])
    assert SECRETS["KAGGLE_KEY short"] in raw and SECRETS["--token in args"] in raw
    r = CliRunner().invoke(main, ["explain", "--from-dump", str(dump), "--at", AT, "-o", "json"])
    assert "CreateContainerConfigError" in r.stdout and "rejected; retry with --token" in r.stdout


# --- the rules, one shape at a time -----------------------------------------------------------------

SHAPES: list[tuple[str, str]] = [
    ("DB_PASS=73910528 connecting", "73910528"),
    ("KAGGLE_KEY=k4q", "k4q"),
    ('{"AZURE_OPENAI_KEY": "!pUnct-lead_Q7", "step": 5}', "!pUnct-lead_Q7"),
    ("AZURE_STORAGE_KEY='has spaces in Z8 it'", "spaces in Z8"),
    ("AZURE_STORAGE_KEY: has spaces in Z8 it", "spaces in Z8"),
    ("export db_pass=Zq9 && run", "Zq9"),
    ("dbPassword=Zq9x", "Zq9x"),
    ("STORAGE_SAS=se%3D2026%26sp%3Dr", "se%3D2026%26sp%3Dr"),
    ("SENTRY_DSN=https://x", "https://x"),
    ("SLACK_WEBHOOK_URL=https://example.invalid/h/1", "https://example.invalid/h/1"),
    ("psql --password 'c0rrect horse' -h db", "c0rrect horse"),
    ("psql --password=!bang -h db", "!bang"),
    ("sh -c \"mysql --password hunter2x && echo done\"", "hunter2x"),
    ("run --token tok-9QmZx7Lw3 --epochs 3", "tok-9QmZx7Lw3"),
    ("argv ['--api-key', 'k3y-v4lue']", "k3y-v4lue"),
    ('argv ["--db-password", "pw with space"]', "pw with space"),
    ("sshpass -p sshpw-4471 ssh host", "sshpw-4471"),
    ("mysql -u root -pMyS3cretPw88 db", "MyS3cretPw88"),
    ("sas sig=Zm9vYmFyYmF6%3D&sv=2022-11-02", "Zm9vYmFyYmF6"),
    ("sig=Zm9vYmFyYmF6%3D", "Zm9vYmFyYmF6"),
    ("postgres://app:p@ss@w0rd!@db.internal:5432/runs", "p@ss@w0rd!"),
    ("postgres://app:p@ss@w0rd!@db.internal:5432/runs", "ss@w0rd"),
    (f"post to {SLACK_HOOK} now", "kV9xq2ZlT1wK8mN3pQ7rS5tU"),
    ("https://discord.com/api/webhooks/1234567890123/AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
     "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"),
    (f"dsn https://{SENTRY_KEY}@o450123.ingest.sentry.io/4504412", SENTRY_KEY),
    (_pgp_block(), PGP_BODY),
    ("Authorization: Basic YWRtaW46aHVudGVy", "YWRtaW46aHVudGVy"),
]


@pytest.mark.parametrize(("text", "secret"), SHAPES, ids=[s[0][:40] for s in SHAPES])
def test_each_shape_is_masked(text: str, secret: str) -> None:
    out, counts = redact_counted(text)
    assert secret not in out, out
    assert MASK in out and sum(counts.values()) >= 1
    assert redact(out) == out  # idempotent


KEPT = [
    "iteration 100/ 1000 | consumed samples: 3200 | lm loss: 2.345E+00 | tokens: 409600",
    "num_tokens=4096 auth=true token_count: 12 max_tokens: 512",
    "mkdir -p /data/ckpt && cp -p a.txt b.txt",
    "docker run -p 8080:80 -p 127.0.0.1:9090:9090/tcp img",
    "psql -h db -p 5432 -U app",
    "ps -p 4242 -o rss",
    "find . -name '*.pt' -print",
    "python train.py --epochs 3 --lr 0.001 --bypass-cache",
    "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
    "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE)",
    "git clone ssh://git@github.com/org/repo",
    "https://user@example.com/path",
    "NCCL_DEBUG=INFO NCCL_SOCKET_IFNAME=eth0",
    "compass heading=270",
    "automountServiceAccountToken: true",
    "password: null",
]


@pytest.mark.parametrize("text", KEPT)
def test_plain_text_is_left_alone(text: str) -> None:
    assert redact(text) == text


def test_structured_values_are_masked_by_name_whatever_they_look_like() -> None:
    log = RedactionLog()
    doc: dict[str, Any] = {
        "env": [{"name": "DB_PASS", "value": "7"}, {"name": "NCCL_DEBUG", "value": "INFO"},
                {"name": "AZURE_OPENAI_KEY", "value": " leading space"}],
        "config": {"password": 123456, "retries": 3, "webhookUrl": "https://h/1", "eos_token": "</s>",
                   "topologyKey": "kubernetes.io/hostname", "secretName": "db-credentials",
                   "DSN": ["a", "b"], "auth": True},
        "params": [{"key": "KAGGLE_KEY", "value": "abc"}],
        "args": ["--password", "-dash-lead", "-p", "5432", "-p", "s3cr"],
    }
    out = scrub_json(doc, "f.json", log)
    assert out["env"][0]["value"] == MASK and out["env"][2]["value"] == MASK and out["env"][1]["value"] == "INFO"
    c = out["config"]
    assert c["password"] == MASK and c["webhookUrl"] == MASK and c["DSN"] == [MASK, MASK]
    assert (c["retries"], c["eos_token"], c["topologyKey"], c["secretName"], c["auth"]) == (
        3, "</s>", "kubernetes.io/hostname", "db-credentials", True)
    assert out["params"][0]["value"] == MASK
    assert out["args"] == ["--password", MASK, "-p", "5432", "-p", MASK]
    n = sum(log.entries.values())
    assert n == 9, log.rows()
    again = RedactionLog()
    assert scrub_json(out, "f.json", again) == out and sum(again.entries.values()) == 0


def test_secrets_used_as_keys_are_replaced_and_the_report_never_prints_them() -> None:
    log = RedactionLog()
    out = scrub_json({"notify": {GH_KEY_AS_KEY: "on", SLACK_HOOK: "failed"}, "ok": {"step": 1}}, "o.json", log)
    text = json.dumps(out)
    assert GH_KEY_AS_KEY not in text and "kV9xq2ZlT1wK8mN3pQ7rS5tU" not in text
    assert out["ok"] == {"step": 1} and len(out["notify"]) == 2  # two masked keys stay two entries
    rep = report(log, title="t")
    assert GH_KEY_AS_KEY not in rep and "kV9xq2ZlT1wK8mN3pQ7rS5tU" not in rep
    assert sum(log.entries.values()) == 2


def test_a_token_across_the_old_chunk_boundary_is_masked() -> None:
    chunk = 64 * 1024 - 1024
    for offset in range(-30, 5, 3):
        line = "x" * (chunk + offset) + " " + CHUNK_TOKEN + " tail\n"
        out = scrub_text("step 1\n" + line + "step 2\n", "logs/a.log", RedactionLog())
        assert CHUNK_TOKEN[:12] not in out and CHUNK_TOKEN[-12:] not in out, offset
        assert out.startswith("step 1\n") and out.endswith("step 2\n")


# Shapes aimed at the new patterns: runs of what each one starts, continues or ends with.
LINEAR_SHAPES = ["://", "a://a@", "@", "--password ", "-p ", "-pa", "sig=", "DB_PASS=", "a:", "a=", "'", '"',
                 "password: ", "hooks.slack.com/services/", "-----BEGIN PGP PRIVATE KEY BLOCK-----", "x" * 80 + "=",
                 '["--token", "', "postgres://u:", "A" * 100 + "a", "aA", "password: |\n ", "\\", '"\\',
                 "https://" + "0" * 32 + "@", "-a-a", "a.", "token=\"", "mysql -p"]


@pytest.mark.parametrize("name", [n for n, _ in PATTERNS if n.startswith("redact.")])
def test_each_redaction_pattern_is_linear_on_the_new_shapes(name: str) -> None:
    rx = dict(PATTERNS)[name]
    for shape in LINEAR_SHAPES:
        line = shape * (64 * 1024 // len(shape))
        best = float("inf")
        for _ in range(2):
            t0 = time.thread_time()
            rx.search(line)
            rx.match(line)
            best = min(best, time.thread_time() - t0)
        assert best < 0.05, f"{name}: {best * 1000:.0f} ms on 64 KB of {shape!r}"


def test_the_new_rules_stay_linear_on_hostile_repetition() -> None:
    for shape in LINEAR_SHAPES:
        text = shape * (64 * 1024 // len(shape))
        best = float("inf")
        for _ in range(2):
            t0 = time.thread_time()
            redact(text)
            best = min(best, time.thread_time() - t0)
        assert best < 0.5, f"{shape!r}: {best:.2f}s on 64 KB"


# --- the operator's own rules (settings: redaction.patterns on RE2, redaction.keys) -------------------

ACME = "acme_9f8e7d6c5b4a3921"
CUSTOM_CONFIG = """redaction:
  patterns:
    - 'acme_[0-9a-f]{16}'
    - 'employee-id=(?P<mask>[0-9]{7})'
    - '(a+)+$'
  keys: ['X_ACME_*', 'corp_badge']
"""


@pytest.fixture(autouse=True)
def _builtin_rules_after_each_test() -> Any:
    yield
    load_settings(None)  # back to the built-in rules: a test that loaded custom ones leaves none behind


def custom_dump(tmp_path: Path) -> Path:
    tr = taurun(RUN, NS, "Running", NOW - timedelta(hours=1), workers=1)
    tr["spec"]["owner"] = {"corp_badge": "B-1177", "team": "research"}
    w0 = pod(f"{RUN}-w0", NS, NOW - timedelta(hours=1), node="gpu-1", gpus=8, labels={"taugrid.io/run": RUN},
             ready=False, containers=[{"name": "main", "ready": False, "restartCount": 0, "state": {"waiting": {
                 "reason": "CreateContainerConfigError",
                 "message": f"license {ACME} refused for employee-id=8675309 (X_ACME_PIN=27182818)"}}}])
    w0["spec"]["containers"][0]["env"] = [{"name": "X_ACME_LICENSE", "value": "L-42"}]
    log = (f"2026-01-10T11:10:00Z checking {ACME} employee-id=8675309 X_ACME_PIN=27182818\n"
           "2026-01-10T11:10:01Z  iteration       1/  250000 | lm loss: 2.5E+00 |\n")
    return write_dump(tmp_path / "dump", [tr, w0], logs={(NS, f"{RUN}-w0"): log}, captured=NOW)


def test_operator_rules_from_settings_apply_to_explain_bundles_and_bundle_redact(tmp_path: Path) -> None:
    dump = custom_dump(tmp_path)
    cfg = tmp_path / "settings.yaml"
    cfg.write_text(CUSTOM_CONFIG)
    custom = [ACME, "8675309", "27182818", "L-42", "B-1177"]
    plain = CliRunner().invoke(main, ["explain", "--from-dump", str(dump), "--at", AT, "-o", "json"]).stdout
    assert ACME in plain and "8675309" in plain  # control: the built-in rules do not know these
    r = CliRunner().invoke(main, ["explain", "--from-dump", str(dump), "--at", AT, "-o", "json", "--config", str(cfg)])
    assert r.exit_code == 0, r.output
    assert [v for v in custom if v in r.stdout] == [] and "employee-id=" in r.stdout
    b = _bundle(dump, tmp_path / "out", "--config", str(cfg))
    files = _files(b)
    assert [f"{v} in {rel}" for rel, t in files.items() for v in custom if v in t] == []
    assert "team" in files[f"objects/TauRun/{NS}/{RUN}.json"] and "research" in files[f"objects/TauRun/{NS}/{RUN}.json"]
    rep = files["REDACTIONS.md"]
    assert "custom-pattern-" in rep and "acme_[0-9a-f]" not in rep  # a rule is named, its pattern never printed
    # bundle redact with the settings: an older bundle (written without them) loses them too
    load_settings(None)
    old = _bundle(dump, tmp_path / "old")
    assert ACME in (old / f"logs/{RUN}-w0/all_containers.log").read_text()
    r = CliRunner().invoke(main, ["bundle", "redact", str(old), "--config", str(cfg)])
    assert r.exit_code == 0, r.output
    assert [f"{v} in {rel}" for rel, t in _files(old).items() for v in custom if v in t] == []


def test_operator_patterns_run_on_re2_and_a_bad_one_is_a_clear_error(tmp_path: Path) -> None:
    from collector.redact import compile_rules

    r = compile_rules(["(a+)+$"], [])
    line = "a" * 65_000 + "!"
    t0 = time.thread_time()
    out, _ = r.redact_counted(line, limit=len(line))
    assert time.thread_time() - t0 < 0.5 and out == line  # no match, found in linear time (exponential on re)
    assert r.redact_counted("xaaa")[0] == "x" + MASK
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("redaction:\n  patterns: ['(?<=token=)\\w+']\n")
    r2 = CliRunner().invoke(main, ["explain", "--from-dump", str(custom_dump(tmp_path)), "--at", AT,
                                   "--config", str(cfg)])
    assert r2.exit_code != 0
    assert "config.redaction.patterns" in r2.output and "RE2" in r2.output
    with pytest.raises(ValueError, match="matches empty text"):
        compile_rules(["x*"], [])


PIECES = ["password", "DB_PASS", "token", "key", "=", ":", " ", '"', "'", "-p", "--password", "--token", "-u",
          "\n", "[REDACTED]", "@", "://", "https", "x", "1", "|", ",", "mysql", "sig=", "a:b", "\\", "&", "]", "}",
          "-----BEGIN PGP PRIVATE KEY BLOCK-----", "-----END ", "hooks.slack.com/services/", "eyJ", "İ", "true",
          "postgres://u:p@h", "secret: |\n  x\n"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=16))
def test_redaction_of_rule_pieces_is_idempotent(pieces: list[str]) -> None:
    once = redact("".join(pieces))
    assert redact(once) == once
