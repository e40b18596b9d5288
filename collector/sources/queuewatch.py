"""The controller's reads of Kueue's visibility API: the queues of the runs blocked in queue admission,
read by a poller (never inside an evaluation), each answer kept until the next."""

from __future__ import annotations

import threading

from collector.queuefacts import PendingSummary
from collector.sources.kube_api import KubeApi
from collector.sources.visibility import read_pending

QueueKey = tuple[str, str, str]  # (ClusterQueue, namespace, LocalQueue)
NOT_READ = "the visibility API has not been read for this queue yet"


class QueueWatch:
    """Which queue each queued run waits in (set by evaluations), and the visibility API's latest
    answer for each of those queues (set by `poll`)."""

    def __init__(self, api: KubeApi) -> None:
        self._api = api
        self._lock = threading.Lock()
        self._runs: dict[object, QueueKey] = {}
        self._answers: dict[QueueKey, tuple[PendingSummary | None, str]] = {}

    def waiting(self, run: object, key: QueueKey | None) -> tuple[PendingSummary | None, str]:
        """Note the queue `run` waits in (None: it waits in none now) and answer what is known of it."""
        with self._lock:
            if key is None:
                self._runs.pop(run, None)
                return None, ""
            self._runs[run] = key
            return self._answers.get(key, (None, NOT_READ))

    def runs_in(self, key: QueueKey) -> list[object]:
        with self._lock:
            return [r for r, k in self._runs.items() if k == key]

    def poll(self) -> list[QueueKey]:
        """Read every queue a run waits in; the queues whose answer changed."""
        with self._lock:
            keys = set(self._runs.values())
            self._answers = {k: v for k, v in self._answers.items() if k in keys}
        changed = []
        by_cq: dict[str, PendingSummary] = {}  # a ClusterQueue's answer serves all its LocalQueues' runs
        for key in sorted(keys):
            summary: PendingSummary | None
            if key[0] in by_cq:
                summary, note = by_cq[key[0]], ""
            else:
                summary, note = read_pending(self._api, *key)
                if summary is not None and summary.queue.startswith("ClusterQueue/"):
                    by_cq[key[0]] = summary
            with self._lock:
                old = self._answers.get(key)
                self._answers[key] = (summary, note)
            if old is None or (old[0].items if old[0] else None, old[1]) != (summary.items if summary else None, note):
                changed.append(key)
        return changed
