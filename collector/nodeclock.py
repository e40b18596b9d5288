"""How far each node's clock runs ahead of the API server's, for the live controller.

A pod's log stamps come from its node (the container runtime, the trainer's own clock there): a
node whose clock runs 90 s ahead makes a run that stalled two minutes ago look 30 s fresh. The
kubelet stamps two things on that clock that the controller watches:

- its node Lease (kube-node-lease), renewed every leaseDurationSeconds / 4 (10 s). A renewal seen
  as it happens (a watch event) measures the clock within the event's latency; one seen in a list
  is at most one renewal interval old, so the skew lies within that interval above what it shows
  (taken at the top of it: stamps read earlier look staler, never fresher).
- its node status heartbeat, posted only every nodeStatusReportFrequency (5 min) when nothing
  changes: a list's heartbeat may be minutes old and measures nothing; a fresh post does. The
  fallback where node Leases cannot be read.

Until one of them measured a node, its clock is unsure, and the claims place none of its stamps
(`RunEvidence.node_clock_unsure`): fail closed. A clock behind by more than the default stall
floor is unsure too: a renewal seen as it happens but stamped that far before now says so (a listed
one cannot: it may just be old). Pure: the caller hands in "now" on the API clock.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from collector.correlate import RunIndex
from collector.kube import NodeLease

# A node clock ahead of the API server's by more than this (a post and its arrival take well under
# it) is skewed; less is taken for latency.
NODE_SKEW_TOLERANCE = timedelta(seconds=15)
# A clock behind makes stamps look older, never fresher: taken as it is up to the default stall floor
# (a step that much older than it is can close a window), unsure past it.
NODE_BEHIND_LIMIT = timedelta(seconds=60)


class NodeClocks:
    """Measurements from node Leases and heartbeats, kept in `index.node_skew` (node → how far its
    clock runs ahead) and `index.node_clock_unsure` (seen, not measured yet)."""

    def __init__(self, index: RunIndex) -> None:
        self.index = index
        self._by_lease: set[str] = set()  # nodes a Lease measured: heartbeats no longer decide

    def lease(self, lease: NodeLease, ahead: timedelta, *, listed: bool) -> None:
        """A node Lease's renewal, `ahead` = renewTime − now when it arrived. `listed`: from a list
        (up to one renewal interval old) rather than a watch event."""
        if listed:
            if ahead < -lease.period:
                return  # not renewed within its duration: a kubelet gone quiet (or a clock behind) says nothing
            ahead += lease.period / 4  # renewed at most this long before the list: the skew's upper end
        self._by_lease.add(lease.node)
        self._measured(lease.node, ahead)

    def lease_gone(self, node: str) -> None:
        self._by_lease.discard(node)

    def leases_listed(self, nodes: set[str]) -> None:
        """A full list of node Leases: nodes whose Lease is gone are measured by heartbeats again."""
        self._by_lease &= nodes

    def heartbeat(self, node: str, beat: datetime | None, before: datetime | None, now: datetime) -> None:
        """A node's status heartbeat (`before`: the one it had; None at first sight)."""
        if node in self._by_lease or beat is None or beat == before:
            return
        ahead = beat - now
        if before is None:
            # First sight (a list): the heartbeat may be minutes old, so its clock is ahead by at
            # least this, perhaps more, until its kubelet's next post says.
            self.index.node_clock_unsure.add(node)
            if ahead > NODE_SKEW_TOLERANCE:
                self.index.node_skew[node] = ahead
            return
        self._measured(node, ahead)  # a fresh post

    def forget(self, node: str) -> None:
        self._by_lease.discard(node)
        self.index.node_skew.pop(node, None)
        self.index.node_clock_unsure.discard(node)

    def _measured(self, node: str, ahead: timedelta) -> None:
        if ahead < -NODE_BEHIND_LIMIT:
            # A renewal or post that arrives stamped a stall floor before now: its clock runs behind (a
            # steady run's last step would look a stall old), or the event came late (a watch resumed
            # from an old resourceVersion). Its stamps are not placed until one arrives closer in step.
            self.index.node_skew.pop(node, None)
            self.index.node_clock_unsure.add(node)
            return
        self.index.node_clock_unsure.discard(node)
        if ahead > NODE_SKEW_TOLERANCE:
            self.index.node_skew[node] = ahead
        else:
            self.index.node_skew.pop(node, None)
