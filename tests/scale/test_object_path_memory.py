"""What the synced object path keeps per pod and per run (issue 30), and that keeping less changed
no answer: list pages of pods read typed (the watch's Structs, parts shared), run links naming one
tuple per key, `RunPods` without id sets, `/runs` history as tuples."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collector.correlate import RunIndex
from collector.kube import normalize
from collector.kube_pod import PodObject
from collector.model import ObjectRecord
from collector.runlinks import named_parents
from collector.sources.decode import FULL, POD_DICTS, decoder_for, listed
from collector.sources.kube_api import Listing, Resource
from tests.dumpkit import meta
from tests.dumpkit import pod as kit_pod

POD = decoder_for("v1", "Pod")
PODS = Resource("Pod", "", "v1", "pods", optional=False)
T0 = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)


def _gang(run: str, n: int, ns: str = "team-a") -> list[dict[str, Any]]:
    out = []
    for j in range(n):
        p = kit_pod(f"{run}-w-{j}", ns, T0, node=f"gpu-{j:04d}", gpus=8,
                    labels={"taugrid.io/run": run, "ray.io/cluster": f"{run}-rc",
                            "ray.io/node-type": "head" if j == 0 else "worker", "app": "x"},
                    owner={"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": f"{run}-rc", "uid": "u1"})
        p["spec"]["containers"].append({"name": "fluentbit", "image": "fluent-bit:3"})  # a helper
        p.pop("kind", None)  # as list items come
        p.pop("apiVersion", None)
        out.append(p)
    return out


def taurun(name: str, ns: str) -> dict[str, Any]:
    return {"apiVersion": "taugrid.io/v1alpha1", "kind": "TauRun", "metadata": meta(name, ns, f"uid-{name}", T0),
            "spec": {"profile": "a100-2x8", "workers": 2, "gpusPerWorker": 8}, "status": {"phase": "Running"}}


def _page(items: list[Any], rv: str = "7") -> bytes:
    return orjson.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": rv},
                         "items": items})


class _Api:
    """The part of KubeApi a `Listing` reads: pages by continue token."""

    def __init__(self, pages: list[bytes]) -> None:
        self.pages = pages

    def get_text(self, path: str, query: list[tuple[str, Any]]) -> bytes:
        token = dict(query).get("continue")
        return self.pages[int(token) if token else 0]


def _records(items: list[Any]) -> list[ObjectRecord | None]:
    return [normalize(i, where="Pod x").record for i in items]


def test_a_clean_page_of_pods_comes_typed_with_the_records_of_the_full_decode() -> None:
    items = _gang("r1", 4)
    page = _page(items)
    got = POD.page(page)
    assert got["metadata"] == {"resourceVersion": "7"}
    assert all(type(i) is PodObject for i in got["items"])  # the typed path, not the dicts
    want = [listed(i, "Pod", "v1") for i in FULL.page(page)["items"]]
    assert _records([listed(i, "Pod", "v1") for i in got["items"]]) == _records(want)
    one = POD.item(orjson.dumps(items[0]))  # a list read item by item
    assert type(one) is PodObject and _records([listed(one, "Pod", "v1")]) == _records(want[:1])


def test_a_page_with_an_item_of_another_kind_or_type_comes_as_dicts() -> None:
    items: list[Any] = _gang("r1", 2)
    other = copy.deepcopy(items[1])
    other["kind"] = "Status"
    for page in (_page([items[0], other]), _page([items[0], {**items[1], "metadata": {"name": 7}}]),
                 _page([items[0], 3])):
        got = POD.page(page)
        assert got == POD_DICTS.page(page) and all(not isinstance(i, PodObject) for i in got["items"])
    assert isinstance(POD.item(orjson.dumps(other)), dict)
    assert POD.page(b'{"metadata": {"continue": "1"}}') == {"metadata": {"continue": "1"}}  # no items
    assert POD.page(b'{"items": null}') == {"items": None}


def test_listed_fills_what_a_list_leaves_out_for_dicts_and_typed_pods() -> None:
    d: dict[str, Any] = {"metadata": {"name": "a"}}
    assert listed(d, "Pod", "v1") == {"metadata": {"name": "a"}, "kind": "Pod", "apiVersion": "v1"}
    p = PodObject()
    assert listed(p, "Pod", "v1") is p and (p.kind, p.apiVersion) == ("Pod", "v1")
    q = PodObject(kind="Pod", apiVersion="v2")
    assert listed(q, "X", "v1") is q and (q.kind, q.apiVersion) == ("Pod", "v2")
    assert listed(3, "Pod", "v1") is None and listed([1], "Pod", "v1") is None


def test_a_listing_of_pod_pages_yields_the_records_the_full_decode_gives() -> None:
    a, b = _gang("r1", 3), _gang("r2", 2)
    pages = [orjson.dumps({"metadata": {"continue": "1"}, "items": a}), _page(b, rv="9")]
    typed = list(Listing(_Api(pages), PODS, 500, POD))  # type: ignore[arg-type]
    full = list(Listing(_Api(pages), PODS, 500, FULL))  # type: ignore[arg-type]
    assert all(type(i) is PodObject for i in typed) and len(typed) == 5
    assert _records(typed) == _records(full)


def test_typed_list_pods_share_their_parts_and_strings() -> None:
    """A gang's pods listed typed share what is equal between them: owner, labels, conditions,
    containers that are the same, the apiVersion string (one per pod before)."""
    items = [listed(i, "Pod", "v1") for i in POD.page(_page(_gang("r1", 3)))["items"]]
    recs = [r for r in _records(items) if r is not None]
    assert len(recs) == 3
    w1, w2 = recs[1], recs[2]
    assert w1.owners is w2.owners and w1.labels is w2.labels and len(w1.owners) == 1
    assert w1.facts.helpers == ("fluentbit",) and w1.facts.helpers is w2.facts.helpers  # type: ignore[union-attr]
    assert w1.api_version is w2.api_version
    assert all(x is y for x, y in zip(w1.conditions, w2.conditions, strict=True))


def test_pods_of_a_run_name_the_same_parent_key_tuples() -> None:
    items = [listed(i, "Pod", "v1") for i in FULL.page(_page(_gang("r1", 3)))["items"]]
    recs = [r for r in _records(items) if r is not None]
    ups = [named_parents(r) for r in recs]
    assert ups[0] == [("RayCluster", "team-a", "r1-rc"), ("TauRun", "team-a", "r1")]
    assert all(x is y for u in ups[1:] for x, y in zip(ups[0], u, strict=True))


def _index(runs: int, per_run: int) -> tuple[RunIndex, list[ObjectRecord]]:
    idx = RunIndex()
    roots = []
    for i in range(runs):
        root = normalize(taurun(f"r{i}", "team-a")).record
        assert root is not None
        idx.upsert(root)
        roots.append(root)
        for p in _gang(f"r{i}", per_run):
            rec = normalize(listed(p, "Pod", "v1")).record
            assert rec is not None
            idx.upsert(rec)
    return idx, roots


def test_a_remembered_member_walk_holds_the_index_keys_not_copies() -> None:
    idx, roots = _index(2, 3)
    for root in roots:
        keys = idx._member_keys(root.ref)
        assert keys == tuple(m.ref.key for m in idx.members(root.ref))  # the same members, in the same order
        assert len(keys) == 3
        held = {k: k for k in idx._objects}
        assert all(held[k] is k for k in keys)  # the index's own tuples


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3), st.booleans()), min_size=1, max_size=12))
def test_member_walks_and_evidence_as_before_across_writes(ops: list[tuple[int, int, bool]]) -> None:
    """Pods created and deleted across runs: the remembered walk is the walk, key for key (with keys
    shared, a walk that yielded a key of another object would show here)."""
    idx, roots = _index(3, 0)
    gangs = {i: _gang(f"r{i}", 4) for i in range(3)}
    for run, j, delete in ops:
        rec = normalize(listed(copy.deepcopy(gangs[run][j]), "Pod", "v1")).record
        assert rec is not None
        if delete:
            idx.delete(rec.ref)
        else:
            idx.upsert(rec)
        for root in roots:
            assert idx._member_keys(root.ref) == tuple(m.ref.key for m in idx.members(root.ref))
            ev = idx.evidence(root.ref)
            assert sorted(p.ref.name for p in ev.pods) == sorted(
                m.ref.name for m in idx.members(root.ref) if m.ref.kind == "Pod")


def test_run_pods_keep_no_id_sets_and_names_only_when_asked() -> None:
    from collector.claims.lineage import RunPods, replaced_pods

    idx, roots = _index(1, 3)
    rp = RunPods(idx.evidence(roots[0].ref))
    assert not hasattr(rp, "alive") and rp._present is None
    assert replaced_pods(rp.ev, rp) == [] and rp._why == ["", "", ""]
    assert rp._present is None  # no create Event: never asked
    assert rp.present == {p.ref.name for p in rp.every}
    assert rp.every is rp.pods  # no retired pods: one list


def test_run_history_shares_states_and_renders_as_before() -> None:
    from collector.evaluation import unknown_claims
    from collector.model import Ref
    from collector.runsapi import RunHistory

    h = RunHistory()
    a = unknown_claims(Ref("TauRun", "ns", "a"), None, T0, "x")
    b = unknown_claims(Ref("TauRun", "ns", "b"), None, T0 + timedelta(seconds=1), "x")
    h.record([a, b])
    assert h._last[a.ref.key] is h._last[b.ref.key]  # one state, shared
    got = h.of(a.ref.key)
    assert [e["claim"] for e in got] == ["scheduled", "running", "progressing"]
    assert got[0] == {"at": "2026-01-05T08:00:00Z", "claim": "scheduled", "from": None,
                      "to": {"observed": "unknown", "verdict": a.scheduled.verdict.value},
                      "reason": a.scheduled.reason[:300]}
    h.record([a])
    assert len(h.of(a.ref.key)) == 3  # no transition: nothing added
    assert h.of(("TauRun", "ns", "c")) == []


def test_interner_shares_equal_values_and_stays_bounded() -> None:
    from collector.interning import Interner

    intern: Interner[tuple[str, ...]] = Interner(3)
    first = intern(("a", "b"))
    again = intern(tuple(["a", "b"]))
    assert again is first and again == ("a", "b")
    for i in range(10):
        intern((str(i),))
        assert len(intern) <= 3
    fresh = tuple(["a", "b"])
    assert intern(fresh) is fresh  # forgotten past the cap: the new one is the shared one now
