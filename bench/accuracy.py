"""Accuracy against ground truth: the live controller and `explain` on a kubectl dump, judged by the simulator.

A seeded generator (`kubesim.generate`) draws hundreds of runs from classes the
collector must tell apart (stalls, NCCL hangs, crash loops, quota, admission checks, DRA,
Karpenter, cluster-autoscaler, MultiKueue, replay, lagging ranks, skipped steps, node loss...).
The simulator plays them on a manual clock to one instant and says what is true of each run
(`ScenarioEngine.truth()`, a Python side channel the collector cannot see). Then:

1. the live controller watches the simulator through the official client until its claims settle;
2. `kubectl cluster-info dump` (+ the custom kinds) captures the same moment and `explain` reads it;
3. both are compared with the truth, claim by claim and for the blocked stage.

Usage: .venv/bin/python bench/accuracy.py [--runs 500] [--seed 1] [--out docs/accuracy.md]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

for _p in (Path(__file__).resolve().parents[1], Path(__file__).resolve().parent):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from accuracy_dumps import Kubectl, bare, procedure  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from collector import kube  # noqa: E402
from collector.cli import main as cli_main  # noqa: E402
from collector.controller import Controller  # noqa: E402
from collector.planes.api_logs import ApiLogSource  # noqa: E402
from collector.settings import ControllerSettings, Settings  # noqa: E402
from collector.sources.kube_api import KubeApi, api_client_for  # noqa: E402
from kubesim.clock import ManualClock  # noqa: E402
from kubesim.engine import ScenarioEngine  # noqa: E402
from kubesim.generate import CLASSES, DESCRIPTIONS, Generated, generate  # noqa: E402
from kubesim.server import Simulator, SimulatorSettings  # noqa: E402
from kubesim.truth import STAGES, RunTruth  # noqa: E402

CLAIMS = ("scheduled", "running", "progressing")
# Kinds the simulator serves for the new classes; dumped only once `explain` can read them
# (an unknown kind in a dump is an input error by the dump contract).
EXTRA_KINDS = {"ResourceClaim": "resourceclaims", "NodeClaim": "nodeclaims", "AdmissionCheck": "admissionchecks"}


def _explain_reads(kind: str) -> bool:
    return kind in kube._BUILDERS or kind in kube.IRRELEVANT_KINDS  # the dump reader's own table


class _CountingApi(KubeApi):
    """The controller's API edge, noting which pod logs it has read (so the harness knows a pass is done)."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.logs_read: set[str] = set()

    def get_text(self, path: str, query: Any = ()) -> bytes:
        out = super().get_text(path, query)
        self.logs_read.add(path)
        return out


def _wait(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise TimeoutError(f"timed out waiting for {what}")


def _snapshot(c: Controller) -> dict[str, Any]:
    return {f"{r.ref.namespace}/{r.ref.name}": r.to_json() for r in list(c.claims.values())}


class LiveController:
    """The live controller against the simulator, with the waits the harness needs."""

    def __init__(self, url: str, clock: ManualClock, timeout: float) -> None:
        cfg = replace(ControllerSettings(), tick=timedelta(seconds=1), leader_election=False,
                      log_poll_interval=timedelta(seconds=0.2), ray_poll_interval=timedelta(0),
                      checkpoint_poll_interval=timedelta(0), watch_timeout_s=30)
        self.api = _CountingApi(api_client_for(url))
        self.ctl = Controller(self.api, Settings(controller=cfg), clock.now)
        self.timeout = timeout

    def open(self) -> None:
        self.ctl.open()
        _wait(self.ctl.ready.is_set, self.timeout, "controller ready")

    def _log_targets(self) -> list[Any]:
        logs = self.ctl.sources["logs"]
        assert isinstance(logs, ApiLogSource)
        return list(logs.targets.current)

    def _logs_done(self) -> bool:
        targets = self._log_targets()
        return all(f"/api/v1/namespaces/{ref.namespace}/pods/{ref.name}/log" in self.api.logs_read
                   for ref, *_ in targets)

    def log_pass(self) -> None:
        """Wait until every container log the controller tails has been read once from now on."""
        self.api.logs_read.clear()
        _wait(self._logs_done, self.timeout, "every log read")

    def settle(self) -> dict[str, Any]:
        """Claims once every log was read twice, every watch heard from the server and nothing changes."""
        since = time.monotonic()
        _wait(lambda: bool(self._log_targets()), self.timeout, "log targets")
        self.log_pass()
        self.log_pass()
        ctl = self.ctl

        def steady() -> bool:
            if not all(r.last_ok > since for r in ctl.watch.reflectors):
                return False
            a = _snapshot(ctl)
            time.sleep(1.0)
            return a == _snapshot(ctl) and ctl._changes.empty()
        _wait(steady, self.timeout, "claims settle")
        return _snapshot(ctl)

    def close(self) -> None:
        self.ctl.close()


def kubectl_dump(url: str, workdir: Path, captured: datetime | None = None) -> Path:
    """The README's fuller procedure (`accuracy_dumps.PROCEDURE`), kubectl's output as it writes it,
    plus the cluster-scoped kinds some classes need (ResourceClaims, NodeClaims, AdmissionChecks) when
    explain reads them. Files carry the capture instant as their modification time."""
    kubectl = Kubectl(url, workdir)
    base = bare(kubectl, workdir / "bare")
    extra = ",".join(plural for kind, plural in EXTRA_KINDS.items() if _explain_reads(kind))
    dump = procedure(kubectl, base, workdir / "dump", extra_kinds=extra)
    kubectl.close()
    if captured is not None:
        when = captured.timestamp()
        for top, dirs, names in os.walk(dump):
            for n in [*names, *dirs]:
                os.utime(os.path.join(top, n), (when, when))
    return dump


def explain_claims(dump: Path, at: str | None = None) -> tuple[dict[str, Any], str]:
    """`explain --from-dump DIR -o json` (with `--at` only when given: users do not pass it)."""
    args = ["explain", "--from-dump", str(dump), "-o", "json", *(["--at", at] if at else [])]
    result = CliRunner().invoke(cli_main, args)
    if result.exit_code == 2 and "no timestamps" in result.stderr:
        return {}, result.stderr  # nothing to judge by: every run unknown
    if result.exit_code not in (0, 3):
        raise RuntimeError(f"explain exited {result.exit_code}: {result.stderr[:2000]}")
    runs = {f"{r['namespace']}/{r['name']}": r for r in json.loads(result.stdout)["runs"]}
    return runs, result.stderr


# ----------------------------------------------------------------------------- comparison
@dataclass
class Finding:
    kind: str  # false-true | false-verified | wrong-owner | missed-false | missing-stage | spurious-stage | ...
    cls: str
    run: str
    source: str  # controller | explain | both
    what: str
    expected: str
    got: str
    reason: str


@dataclass
class Report:
    runs: int
    seed: int
    eval_at: float
    timings: dict[str, float] = field(default_factory=dict)
    # (claim, source, truth, observed) → count and (claim, source, truth, verdict) → count
    observed: Counter[tuple[str, str, bool, str]] = field(default_factory=Counter)
    verdicts: Counter[tuple[str, str, bool, str]] = field(default_factory=Counter)
    stages: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # (source, truth, observed)
    classes: Counter[str] = field(default_factory=Counter)
    findings: list[Finding] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    explain_stderr: str = ""
    stale_taucluster: bool = False
    watch_throughout: bool = False
    tau_runs: set[str] = field(default_factory=set)
    # (source, claim) → TauRun-backed runs observed true/false although the TauCluster is stale
    not_fail_closed: Counter[tuple[str, str]] = field(default_factory=Counter)

    def count(self, kind: str, cls: str | None = None) -> int:
        return sum(1 for f in self.findings if f.kind == kind and (cls is None or f.cls == cls))

    def by_class(self, cls: str) -> list[Finding]:
        return [f for f in self.findings if f.cls == cls]


ERRORS = ("false-verified", "false-true", "wrong-owner", "disagree")  # must be zero
WEAK = ("missed-false", "missing-stage", "spurious-stage", "unknown")


def _judge(rep: Report, cls: str, name: str, truth: RunTruth, source: str, run: dict[str, Any] | None) -> None:
    if run is None:
        rep.findings.append(Finding("missing-run", cls, name, source, "run", "present", "absent", ""))
        return
    for claim in CLAIMS:
        want: bool = getattr(truth, claim)
        c = run["claims"][claim]
        obs, verdict = c["observed"], c["verdict"]
        rep.observed[(claim, source, want, obs)] += 1
        rep.verdicts[(claim, source, want, verdict)] += 1
        reason = c.get("reason", "")
        if not want and verdict == "verified":
            rep.findings.append(Finding("false-verified", cls, name, source, claim, "false", "verified", reason))
        elif not want and obs == "true":
            rep.findings.append(Finding("false-true", cls, name, source, claim, "false", f"true ({verdict})", reason))
        elif want and obs == "false":
            rep.findings.append(Finding("missed-false", cls, name, source, claim, "true", f"false ({verdict})",
                                        reason))
        elif obs == "unknown":
            rep.findings.append(Finding("unknown", cls, name, source, claim, str(want).lower(), "unknown", reason))
    blocked = run.get("blocked") or None
    got = blocked["stage"] if blocked else None
    rep.stages[(source, truth.stage or "none", got or "none")] += 1
    breason = blocked.get("reason", "") if blocked else ""
    if truth.stage and got and got != truth.stage:
        rep.findings.append(Finding("wrong-owner", cls, name, source, "blocked", truth.stage, got, breason))
    elif truth.stage and not got:
        rep.findings.append(Finding("missing-stage", cls, name, source, "blocked", truth.stage, "none", ""))
    elif not truth.stage and got:
        rep.findings.append(Finding("spurious-stage", cls, name, source, "blocked", "none", got, breason))


def _shape(run: dict[str, Any]) -> dict[str, Any]:
    return {
        "claims": {k: (c["asserted"], c["observed"], c["verdict"]) for k, c in run["claims"].items()},
        "blocked": run["blocked"]["stage"] if run.get("blocked") else None,
    }


def compare(gen: Generated, truth: dict[tuple[str, str], RunTruth], live: dict[str, Any],
            offline: dict[str, Any], rep: Report) -> None:
    for (ns, name), t in sorted(truth.items()):
        key = f"{ns}/{name}"
        cls = gen.classes[(ns, name)]
        rep.classes[cls] += 1
        _judge(rep, cls, key, t, "controller", live.get(key))
        _judge(rep, cls, key, t, "explain", offline.get(key))
        if rep.stale_taucluster and key in rep.tau_runs:
            for source, run in (("controller", live.get(key)), ("explain", offline.get(key))):
                for claim in ("scheduled", "running"):
                    if run is not None and run["claims"][claim]["observed"] != "unknown":
                        rep.not_fail_closed[(source, claim)] += 1
        a, b = live.get(key), offline.get(key)
        if a is not None and b is not None and _shape(a) != _shape(b):
            sa, sb = _shape(a), _shape(b)
            diff = [k for k in sa["claims"] if sa["claims"][k] != sb["claims"][k]]
            if sa["blocked"] != sb["blocked"]:
                diff.append("blocked")
            for d in diff:
                ga = sa["claims"][d] if d in sa["claims"] else sa["blocked"]
                gb = sb["claims"][d] if d in sb["claims"] else sb["blocked"]
                ra = a["claims"][d]["reason"] if d in a["claims"] else ""
                rb = b["claims"][d]["reason"] if d in b["claims"] else ""
                rep.findings.append(Finding("disagree", cls, key, "both", d, f"controller {ga}",
                                            f"explain {gb}", f"controller: {ra} | explain: {rb}"))
    rep.missing = sorted(set(live) ^ set(offline))


def play(runs: int, seed: int, workdir: Path, timeout: float = 600.0, balanced: bool = False,
         stale_taucluster: bool = False, watch_throughout: bool = False, chunk_s: float = 30.0) -> Report:
    """Play a generated scenario and judge both inputs at its instant.

    By default the controller starts at the judging instant (it sees only what the cluster holds
    then, like a controller just restarted). `watch_throughout`: it watches from scenario time 0
    while the scenario plays in `chunk_s` steps, reading every log once per step (its own history).
    """
    t0 = time.monotonic()
    gen = generate(seed, runs, balanced=balanced, stale_taucluster=stale_taucluster)
    rep = Report(runs, seed, gen.eval_at, stale_taucluster=stale_taucluster, watch_throughout=watch_throughout)
    rep.tau_runs = {f"{r.namespace}/{r.name}" for r in gen.scenario.runs if r.tau_run}
    clock = ManualClock(gen.scenario.start)
    with Simulator(clock=clock, settings=SimulatorSettings(seed=seed, bookmark_interval_s=0.5)) as sim:
        url = sim.start()
        engine = ScenarioEngine(gen.scenario, url, clock=clock)
        ctl = LiveController(url, clock, timeout)
        try:
            if watch_throughout:
                engine.step_to(0)
                ctl.open()
                t = 0.0
                while t < gen.eval_at:
                    t = min(t + chunk_s, gen.eval_at)
                    engine.step_to(t)
                    ctl.log_pass()
            else:
                engine.step_to(gen.eval_at)
            if engine.errors:
                raise RuntimeError(f"scenario errors: {engine.errors[:5]}")
            truth = engine.truth()
            rep.timings["simulate"] = time.monotonic() - t0
            t1 = time.monotonic()
            if not watch_throughout:
                ctl.open()
            live = ctl.settle()
        finally:
            ctl.close()
        rep.timings["controller"] = time.monotonic() - t1
        t1 = time.monotonic()
        dump = kubectl_dump(url, workdir, clock.now())
        rep.timings["dump"] = time.monotonic() - t1
        engine.client.close()
    t1 = time.monotonic()
    offline, rep.explain_stderr = explain_claims(dump)  # no --at: judged at the time it finds in the dump
    rep.timings["explain"] = time.monotonic() - t1
    compare(gen, truth, live, offline, rep)
    rep.timings["total"] = time.monotonic() - t0
    return rep


# ----------------------------------------------------------------------------- report
def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def render(rep: Report, stale: Report | None = None, throughout: Report | None = None) -> str:
    lines = [
        "# Accuracy against ground truth",
        "",
        "Generated by `make accuracy` (`bench/accuracy.py`); do not edit by hand. How it works and what each",
        "class is: `kubesim/generate.py`, `kubesim/truth.py`.",
        "",
        f"{rep.runs} generated runs (seed {rep.seed}), judged at scenario t={rep.eval_at:.0f}s. The simulator knows "
        "what is true of every run it plays; the live controller (through the official client) and `explain` "
        "without `--at` on a dump of the same moment made by the fuller procedure (kubectl's files as it writes "
        "them, nothing rewritten) are compared with it.",
        "",
        "Truth: *scheduled* = every pod that does the run's work (RayJob: head and workers; Job: its workers) "
        "exists and is bound; *running* = all of them Running and Ready on Ready nodes, no crash loop in effect; "
        "*progressing* = a valid "
        "update (not a skipped step, past the pre-restart high-water mark) within 1.5 step intervals and at most "
        "half the steps skipped; *stage* = where a not-scheduled run waits. A MultiKueue-dispatched run is true on "
        "all three (it runs on the worker), so `unknown` there is coverage, not an error.",
        "",
    ]
    rows: list[list[object]] = [[cls, DESCRIPTIONS.get(cls, "")] for cls in CLASSES]
    lines += ["## Classes", ""] + _table(["class", "what the simulator plays"], rows) + [""]
    lines += _section(rep, "##")
    if throughout is not None:
        lines += ["", "# Watching throughout", "",
                  f"{throughout.runs} runs (seed {throughout.seed}, the classes in turn); the controller watches "
                  "from scenario time 0 while the scenario plays in 30 s steps, reading every log once per step, "
                  "so it holds its own history (pre-restart steps, earlier log lines). `explain` reads the dump "
                  "at the end as before.", ""]
        lines += _section(throughout, "##")
    if stale is not None:
        lines += ["", "# With a stale TauCluster", "",
                  f"{stale.runs} runs (seed {stale.seed}, the classes in turn) while the TauCluster's status "
                  "resolved an older spec (observedGeneration 1 < generation 2; the 4-worker profile resolved as 2 "
                  "workers) and is never refreshed. Fail-closed (issue 7) expects scheduled/running of TauRun-backed "
                  "runs to be `unknown` here.", ""]
        rows = [[src, claim, stale.not_fail_closed[(src, claim)], len(stale.tau_runs)]
                for src in ("controller", "explain") for claim in ("scheduled", "running")]
        lines += _table(["source", "claim", "observed true/false (not unknown)", "TauRun-backed runs"], rows)
        lines.append("")
        lines += _section(stale, "##")
    return "\n".join(lines) + "\n"


def _section(rep: Report, h: str) -> list[str]:
    lines = [
        "Runtime: " + ", ".join(f"{k} {v:.1f} s" for k, v in rep.timings.items()) + ".",
        "",
        f"{h} What must be zero",
        "",
    ]
    rows = []
    for kind, label in (("false-verified", "`verified` where the truth is false"),
                        ("false-true", "observed `true` (not verified) where the truth is false"),
                        ("wrong-owner", "a blocked stage other than the true one"),
                        ("disagree", "controller and explain disagree (claim or stage)"),
                        ("missing-run", "a run missing from one side")):
        rows.append([label, rep.count(kind)])
    lines += _table(["error", "count"], rows)
    lines += ["", f"{h} Coverage", ""]
    rows = []
    for source in ("controller", "explain"):
        for claim in CLAIMS:
            n = sum(v for (c, s, _, _), v in rep.observed.items() if c == claim and s == source)
            unk = sum(v for (c, s, _, o), v in rep.observed.items() if c == claim and s == source and o == "unknown")
            missed = sum(v for (c, s, t, o), v in rep.observed.items()
                         if c == claim and s == source and t and o == "false")
            rows.append([source, claim, n, f"{unk} ({100 * unk / max(n, 1):.0f}%)", missed])
    lines += _table(["source", "claim", "runs", "unknown", "true observed false"], rows)
    lines += ["", f"{h} Confusion per claim (observed)", ""]
    for claim in CLAIMS:
        lines += [f"{h}# {claim}", ""]
        rows = []
        for source in ("controller", "explain"):
            for want in (True, False):
                rows.append([source, f"truth {str(want).lower()}",
                             *(rep.observed[(claim, source, want, o)] for o in ("true", "false", "unknown")),
                             ", ".join(f"{v} {n}" for (c, s, t, v), n in sorted(rep.verdicts.items())
                                       if c == claim and s == source and t == want and n)])
        lines += _table(["source", "truth", "observed true", "observed false", "unknown", "verdicts"], rows)
        lines.append("")
    lines += [f"{h} Blocked stage (truth × named)", ""]
    names = ["none", *STAGES]
    for source in ("controller", "explain"):
        lines += [f"{h}# {source}", ""]
        rows = [[t] + [rep.stages[(source, t, o)] for o in names] for t in names]
        lines += _table(["truth \\ named", *names], rows)
        lines.append("")
    lines += [f"{h} Per class", ""]
    rows = []
    for cls in sorted(rep.classes):
        c = Counter(f.kind for f in rep.by_class(cls))
        rows.append([cls, rep.classes[cls]] + [c[k] for k in (*ERRORS, *WEAK)])
    lines += _table(["class", "runs", *ERRORS, *WEAK], rows)
    lines += ["", f"{h} Every error", "",
              "Errors only (the kinds that must be zero); one line per run, claim and source. Reasons as the "
              "collector gave them.", ""]
    grouped: dict[str, list[Finding]] = defaultdict(list)
    for f in rep.findings:
        if f.kind in (*ERRORS, "missing-run"):
            grouped[f.cls].append(f)
    for cls in sorted(grouped):
        lines += [f"{h}# {cls}", ""]
        rows = [[f.kind, f.run, f.source, f.what, f.expected, f.got, f.reason.replace("|", "\\|")[:300]]
                for f in grouped[cls]]
        lines += _table(["error", "run", "source", "claim", "expected", "got", "reason"], rows)
        lines.append("")
    return lines


def classes_report(runs: int, seed: int, stale_runs: int, throughout_runs: int) -> tuple[str, list[Report]]:
    """The class suite's passes (main, stale TauCluster, watching throughout) and their Markdown."""
    with tempfile.TemporaryDirectory(prefix="taugrid-accuracy-") as tmp:
        rep = play(runs, seed, Path(tmp))
    stale = None
    if stale_runs:
        with tempfile.TemporaryDirectory(prefix="taugrid-accuracy-") as tmp:
            stale = play(stale_runs, seed, Path(tmp), balanced=True, stale_taucluster=True)
    throughout = None
    if throughout_runs:
        with tempfile.TemporaryDirectory(prefix="taugrid-accuracy-") as tmp:
            throughout = play(throughout_runs, seed, Path(tmp), balanced=True, watch_throughout=True)
    return render(rep, stale, throughout), [r for r in (rep, throughout, stale) if r is not None]


def summary(r: Report) -> str:
    what = "stale TauCluster" if r.stale_taucluster else "watching throughout" if r.watch_throughout else "main"
    counts = ", ".join(f"{k} {r.count(k)}" for k in (*ERRORS, "missing-run"))
    return f"{what}: {r.runs} runs in {r.timings['total']:.1f} s; {counts}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stale-runs", type=int, default=3 * len(CLASSES),
                    help="runs of the stale-TauCluster pass (0: none)")
    ap.add_argument("--throughout-runs", type=int, default=3 * len(CLASSES),
                    help="runs of the pass where the controller watches from the start (0: none)")
    ap.add_argument("--out", type=Path, default=None, help="write the Markdown report here (default: stdout)")
    args = ap.parse_args()
    text, reports = classes_report(args.runs, args.seed, args.stale_runs, args.throughout_runs)
    if args.out:
        args.out.write_text(text)
        for r in reports:
            print(f"{args.out}: {summary(r)}")
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
