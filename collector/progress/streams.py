"""The progress state of one rank's output while a log is scanned (scan.LineScanner keeps one per rank)."""

from __future__ import annotations

import math
from collections import deque

from collector.progress import trainers
from collector.progress.model import ProgressSample, SampleSummary

MAX_DIAGNOSTICS = 100


class Stream:
    """Progress state of one rank's output (None: untagged lines)."""

    __slots__ = (
        "samples",
        "last",
        "seen",
        "n_skipped",
        "first",
        "last_real",
        "high",
        "last_loss",
        "first_bad",
        "total",
        "notes",
        "hf_total",
        "hf_pending",
        "hf_last_n",
        "hf_eval",
        "ds_prev",
        "meg_prev",
        "lt_epoch",
        "lt_offset",
        "lt_maxn",
        "noted",
        "more_notes",
        "rank",
    )

    def __init__(self, max_samples: int, rank: int | None = None) -> None:
        self.rank = rank  # the rank whose lines it reads (None: untagged lines)
        self.samples: deque[ProgressSample] = deque(maxlen=max_samples)
        # running aggregates over every sample, committed when a sample stops being the last one
        # (the last one can still be updated by a redrawn frame)
        self.seen = self.n_skipped = 0
        self.first: ProgressSample | None = None
        self.last_real: ProgressSample | None = None
        self.high: ProgressSample | None = None
        self.last_loss: ProgressSample | None = None
        self.first_bad: ProgressSample | None = None
        self.total: int | None = None
        self.notes: list[str] = []
        self.noted: set[str] = set()
        self.more_notes = 0
        self.hf_total: int | None = None  # the Trainer's training-bar total, once a loss dict confirmed it
        self.hf_pending: trainers.Bar | None = None  # last desc-less bar frame before confirmation
        self.hf_last_n: int | None = None
        self.hf_eval = False  # an evaluation bar of the training bar's length is being drawn
        self.ds_prev: tuple[int, int | None] | None = None
        self.meg_prev: int | None = None
        self.lt_epoch: int | None = None
        self.lt_offset = 0
        self.lt_maxn = 0

    def note(self, text: str) -> None:
        if len(self.notes) < MAX_DIAGNOSTICS:
            self.notes.append(text)
        else:
            self.more_notes += 1

    def note_once(self, key: str, text: str) -> None:
        if key not in self.noted:
            self.noted.add(key)
            self.note(text)

    def commit(self, x: ProgressSample) -> None:
        self.seen += 1
        if x.total is not None:
            self.total = x.total
        if x.skipped:
            self.n_skipped += 1
            return
        if self.first is None:
            self.first = x
        self.last_real = x
        if x.step is not None and (self.high is None or self.high.step is None or x.step > self.high.step):
            self.high = x
        if x.loss is not None:
            self.last_loss = x
            if self.first_bad is None and not math.isfinite(x.loss):
                self.first_bad = x

    def summary(self) -> SampleSummary:
        """The aggregates with the last sample counted, not committed: it is committed when the next
        sample arrives (a redrawn frame may still change it), so a scanner read again and again
        (the node agent's snapshots) counts each sample once."""
        if not self.samples:
            return self._summary()
        kept = (self.seen, self.n_skipped, self.first, self.last_real, self.high, self.last_loss, self.first_bad,
                self.total)
        self.commit(self.samples[-1])
        try:
            return self._summary()
        finally:
            (self.seen, self.n_skipped, self.first, self.last_real, self.high, self.last_loss, self.first_bad,
             self.total) = kept

    def _summary(self) -> SampleSummary:
        return SampleSummary(
            seen=self.seen,
            skipped=self.n_skipped,
            dropped=self.seen - len(self.samples),
            first=self.first,
            last=self.last_real,
            high_water=self.high,
            last_with_loss=self.last_loss,
            first_nonfinite=self.first_bad,
            total=self.total,
        )
