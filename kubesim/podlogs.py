"""Containers' log text as the kubelet keeps it: the current log (bounded in bytes, oldest lines
dropped first) and, after a restart, the previous one. Guarded by the store's lock, so a log follow
waits on the same condition as watches."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from kubesim.clock import Clock, rfc3339_nano
from kubesim.errors import ApiError

LogKey = tuple[str, str, str]  # (namespace, pod, container)


@dataclass(slots=True)
class ContainerLog:
    lines: deque[tuple[datetime, str]] = field(default_factory=deque)
    size: int = 0
    previous: list[tuple[datetime, str]] | None = None


class PodLogs:
    """Every container's log, under the store's lock (`cond`); `version` counts changes."""

    def __init__(self, cond: threading.Condition, clock: Clock, max_bytes: int) -> None:
        self.cond = cond
        self.clock = clock
        self.max_bytes = max_bytes
        self.logs: dict[LogKey, ContainerLog] = {}
        self.version = 0

    def append(
        self, namespace: str, pod: str, container: str, lines: Iterable[str], when: datetime | None = None
    ) -> int:
        """Append lines to a container's current log; returns the number of lines kept."""
        when = when or self.clock.now()
        with self.cond:
            log = self.logs.setdefault((namespace, pod, container), ContainerLog())
            for line in lines:
                # Like the container runtime: only "\n" ends a line; tqdm's "\r" frames stay in one.
                parts = line.split("\n")
                if len(parts) > 1 and parts[-1] == "":
                    parts.pop()
                for part in parts:
                    log.lines.append((when, part))
                    log.size += len(part) + 1
            while log.size > self.max_bytes and log.lines:
                _, dropped = log.lines.popleft()
                log.size -= len(dropped) + 1
            self.version += 1
            self.cond.notify_all()
            return len(log.lines)

    def rotate(self, namespace: str, pod: str, container: str) -> None:
        """A container restarted: its current log becomes `previous`, the new one starts empty."""
        with self.cond:
            log = self.logs.setdefault((namespace, pod, container), ContainerLog())
            log.previous = list(log.lines)
            log.lines = deque()
            log.size = 0
            self.version += 1
            self.cond.notify_all()

    def read(
        self,
        namespace: str,
        pod: str,
        container: str,
        *,
        previous: bool = False,
        tail_lines: int | None = None,
        limit_bytes: int | None = None,
        timestamps: bool = False,
        since: datetime | None = None,
    ) -> tuple[bytes, int]:
        """Log text like the kubelet serves it, plus the number of lines available (for follow)."""
        with self.cond:
            log = self.logs.get((namespace, pod, container))
            if previous:
                if log is None or log.previous is None:
                    raise ApiError.bad_request(f'previous terminated container "{container}" in pod "{pod}" not found')
                lines = list(log.previous)
            else:
                lines = list(log.lines) if log else []
        total = len(lines)
        if since is not None:
            lines = [(t, line) for t, line in lines if t >= since]
        if tail_lines is not None:
            lines = lines[-tail_lines:] if tail_lines > 0 else []
        if timestamps:
            text = "".join(f"{rfc3339_nano(t)} {line}\n" for t, line in lines)
        else:
            text = "".join(f"{line}\n" for _, line in lines)
        data = text.encode()
        if limit_bytes is not None:
            data = data[:limit_bytes]
        return data, total

    def line_count(self, namespace: str, pod: str, container: str) -> int:
        with self.cond:
            log = self.logs.get((namespace, pod, container))
            return len(log.lines) if log else 0

    def drop_pod(self, namespace: str, pod: str) -> None:
        """The pod is gone: so are its containers' logs (lock held)."""
        for log_key in [k for k in self.logs if k[0] == namespace and k[1] == pod]:
            del self.logs[log_key]
