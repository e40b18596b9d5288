"""The straggler verdict kept per run (`claims.stragglers.stragglers`) is the one `detect` gives on the
run's tracks now: kept while the tracks are the same, judged again when one advances, and never kept
when a step lies past the clock (what `detect` reads the clock for)."""

from __future__ import annotations

from datetime import timedelta

from collector.claims import stragglers as mod
from collector.claims.stragglers import Track, detect, stragglers, tracks
from collector.correlate import RunEvidence, Signal, build_index
from collector.kube import normalize
from collector.model import Ref
from collector.progress import scan_lines
from tests.claims.test_recheck_at import pod as mkpod
from tests.claims.test_recheck_at import taurun
from tests.claims.test_stragglers import lockstep, now_of

LINE = " iteration {s:>8}/  250000 | lm loss: 2.504220E+00 | loss scale: 1.0 |"


def _scan(t: Track, upto: int | None = None):  # type: ignore[no-untyped-def]
    text = "".join(f"{a.strftime('%Y-%m-%dT%H:%M:%S.%fZ')} {LINE.format(s=s)}\n"
                   for s, a in list(zip(t.steps, t.at, strict=True))[:upto])
    return scan_lines(text.splitlines(), source="t")


def _run(ts: list[Track]) -> tuple[RunEvidence, list[Signal]]:
    objs = [taurun(workers=len(ts)), *(mkpod(f"r-{i}") for i in range(len(ts)))]
    index = build_index([n.record for n in map(normalize, objs) if n.record is not None])
    for i, t in enumerate(ts):
        index.set_signal(Signal(Ref("Pod", "ns", f"r-{i}"), "main", _scan(t, 50), now_of(ts)))
    ev = index.evidence(Ref("TauRun", "ns", "r"))
    return ev, ev.signals


def test_the_kept_verdict_is_detects_on_the_tracks_of_now() -> None:
    ts = lockstep(n=6, steps=60, slow=3, ratio=0.3, from_step=10)
    ev, sigs = _run(ts)
    now = now_of(ts) + timedelta(minutes=1)
    first = stragglers(ev, sigs, now)
    assert first is not None and [s.pod for s in first.suspects] == ["r-3"]
    assert first == detect(tracks(ev, sigs), now)
    # nothing changed: the verdict stands, not judged again
    calls = []
    real = mod.detect

    def counted(*a, **kw):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*a, **kw)

    mod.detect = counted  # type: ignore[assignment]
    try:
        assert stragglers(ev, sigs, now + timedelta(seconds=30)) is first
        assert calls == []
        # the slow rank's log advances to steps where it caught up: judged again
        fast = lockstep(n=6, steps=60, seed=9)
        caught = Track(ts[3].rank, ts[3].pod, ts[3].node, fast[3].steps, fast[3].at)
        for i in range(6):
            new = Track(ts[i].rank, ts[i].pod, ts[i].node, fast[i].steps, fast[i].at) if i != 3 else caught
            ev.signals[i] = Signal(sigs[i].ref, "main", _scan(new), now)
        later = now_of(fast) + timedelta(minutes=1)
        got = stragglers(ev, ev.signals, later)
        assert calls == [1]
        assert got == real(tracks(ev, ev.signals), later) and got is not None and got.suspects == ()
        # judged at an instant before its newest steps (explain at an earlier time): never the kept one
        early = now_of(fast) - timedelta(seconds=60)
        got = stragglers(ev, ev.signals, early)
        assert calls == [1, 1] and got == real(tracks(ev, ev.signals), early)
        assert stragglers(ev, ev.signals, early) is not None and calls == [1, 1, 1]
    finally:
        mod.detect = real  # type: ignore[assignment]
