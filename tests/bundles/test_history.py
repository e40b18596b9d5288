"""The controller's raw object history for bundles stays within its bounds."""

from __future__ import annotations

from datetime import UTC, datetime

from exporters.bundles.history import MAX_OBJECT_BYTES, ObjectHistory

T = datetime(2026, 1, 10, tzinfo=UTC)


def pod(name: str, rv: int, pad: int = 100) -> dict[str, object]:
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv),
                                        "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:x": {}}}]},
            "status": {"message": "x" * pad}}


def test_versions_per_object_and_total_bytes_are_bounded() -> None:
    h = ObjectHistory(max_bytes=20_000, versions=3)
    for rv in range(10):
        h.record(("Pod", "ns", "a"), pod("a", rv), T)
    (a,) = h.get({("Pod", "ns", "a")})
    assert [v[2].count(b'"resourceVersion":"') for v in a.versions] == [1, 1, 1]
    assert b'"7"' in a.versions[0][2] and b"managedFields" not in a.versions[0][2]
    h.record(("Pod", "ns", "a"), pod("a", 9), T)  # a resync repeating the last version adds nothing
    assert len(h.get({("Pod", "ns", "a")})[0].versions) == 3
    for i in range(200):
        h.record(("Pod", "ns", f"p{i}"), pod(f"p{i}", 1, pad=500), T)
    assert h.bytes <= 20_000 and h.evicted > 0
    assert h.get({("Pod", "ns", "p199")}) and not h.get({("Pod", "ns", "p0")})  # least recently changed go first
    h.deleted(("Pod", "ns", "p199"), pod("p199", 2), T)
    assert h.get({("Pod", "ns", "p199")})[0].versions[-1][1] == "delete"


def test_one_huge_object_is_kept_as_a_stub() -> None:
    h = ObjectHistory()
    h.record(("Pod", "ns", "big"), pod("big", 1, pad=MAX_OBJECT_BYTES + 10), T)
    (big,) = h.get({("Pod", "ns", "big")})
    assert len(big.versions[0][2]) < 1000 and b"not kept" in big.versions[0][2]
    assert h.keys_where("ns", {"big"}) == {("Pod", "ns", "big")}
