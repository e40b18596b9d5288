"""The unpaginated list (the reflector's fallback after a paged list expired, on servers without
streaming lists) read off the socket item by item: the same objects as the whole answer decoded at
once, in memory bounded by a read and an item instead of the list (2.2 GB at 48,700 pods before),
errors as before. Against a loopback server whose answers (framing, cuts) each test writes."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collector.kube import normalize
from collector.kube_pod import PodObject
from collector.sources import listbody
from collector.sources.decode import FULL, decoder_for
from collector.sources.kube_api import (
    KubeApi,
    PermanentSourceError,
    Resource,
    RetryableSourceError,
    api_client_for,
)
from collector.sources.listbody import ItemTooLarge, ListBody, ListSyntaxError, ListTruncated
from tests.netutil import read_head

POD = Resource("Pod", "", "v1", "pods", optional=False)
POD_DECODER = decoder_for("v1", "Pod")
Answer = Callable[[str, dict[str, list[str]]], Iterable[bytes | memoryview]]


@contextlib.contextmanager
def raw_server(answer: Answer) -> Iterator[tuple[str, list[dict[str, list[str]]]]]:
    """A loopback HTTP server that writes `answer(path, query)`'s pieces as they are (status line,
    headers, framing: the test's), then closes the connection. Yields its URL and the queries seen."""
    lsock = socket.create_server(("127.0.0.1", 0))
    lsock.settimeout(0.1)
    stop = threading.Event()
    seen: list[dict[str, list[str]]] = []

    def serve(conn: socket.socket) -> None:
        with conn:
            head = read_head(conn, 65536)
            if b"\r\n\r\n" not in head:
                return
            target = head.split(b" ", 2)[1].decode()
            url = urlsplit(target)
            query = parse_qs(url.query)
            seen.append(query)
            try:
                for piece in answer(url.path, query):
                    conn.sendall(piece)
            except OSError:
                return  # the client closed first
            conn.shutdown(socket.SHUT_WR)

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = lsock.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{lsock.getsockname()[1]}", seen
    finally:
        stop.set()
        t.join(5)
        lsock.close()


def response(body: bytes, *, chunks: int = 0, length: int | None = None) -> Iterator[bytes | memoryview]:
    """A 200 answer: Content-Length (`length`, default the body's), or chunked in `chunks`-byte chunks."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
    view = memoryview(body)
    if chunks:
        yield head + b"Transfer-Encoding: chunked\r\n\r\n"
        for i in range(0, len(body), chunks):
            piece = view[i:i + chunks]
            yield b"%x\r\n" % len(piece)
            yield piece
            yield b"\r\n"
        yield b"0\r\n\r\n"
    else:
        yield head + b"Content-Length: %d\r\n\r\n" % (len(body) if length is None else length)
        for i in range(0, len(body), 1 << 16):
            yield view[i:i + (1 << 16)]


def cut_chunked(body: bytes, at: int) -> Iterator[bytes]:
    """A chunked answer whose connection closes `at` bytes into the body (no last chunk)."""
    yield b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    yield b"%x\r\n" % len(body) + body[:at]


def listing(url: str, *, limit: int = 0, decoder: Any = POD_DECODER) -> Any:
    return KubeApi(api_client_for(url)).iter_list(POD, limit=limit, decoder=decoder)


# --- generated lists: tenant strings with braces, quotes, escapes, unicode -------------------------

HOSTILE = st.text(st.one_of(st.sampled_from(list('{}[]",:\\/\n\t\x00\x1f\u2028\ud7ff\U0001f600 ')),
                            st.characters(exclude_categories=["Cs"])), max_size=24)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 63), 2 ** 63 - 1),
                    st.floats(allow_nan=False, allow_infinity=False), HOSTILE)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(HOSTILE, inner, max_size=4)), max_leaves=20)


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    """A pod whose every field the pod decoder reads has its valid type, its strings hostile."""
    labels = draw(st.dictionaries(HOSTILE, HOSTILE, max_size=4))
    meta = {"name": draw(HOSTILE.filter(bool)), "namespace": draw(HOSTILE), "uid": draw(HOSTILE),
            "resourceVersion": str(draw(st.integers(1, 10 ** 9))), "labels": labels,
            "annotations": draw(st.dictionaries(HOSTILE, HOSTILE, max_size=4)),
            "creationTimestamp": "2026-01-01T00:00:00Z"}
    containers = [{"name": draw(HOSTILE), "image": draw(HOSTILE), "env": draw(VALUES),
                   "resources": {"limits": {"nvidia.com/gpu": str(draw(st.integers(0, 8)))}}}]
    pod: dict[str, Any] = {"metadata": meta, "spec": {"nodeName": draw(HOSTILE), "containers": containers},
                           "status": {"phase": draw(st.sampled_from(["Pending", "Running", "Failed"])),
                                      "message": draw(HOSTILE), "extra": draw(VALUES)}}
    if draw(st.booleans()):
        pod.update(kind="Pod", apiVersion="v1")
    return pod


def list_body(items: list[Any], meta: dict[str, Any], *, items_first: bool, indent: bool,
              extra: dict[str, Any] | None = None) -> bytes:
    members: list[tuple[str, Any]] = [("kind", "PodList"), ("apiVersion", "v1"), ("metadata", meta),
                                      *(extra or {}).items()]
    members.insert(0 if items_first else len(members), ("items", items))
    return orjson.dumps(dict(members), option=orjson.OPT_INDENT_2 if indent else 0)


def pieces(body: bytes, sizes: list[int]) -> Iterator[bytes]:
    pos, i = 0, 0
    while pos < len(body):
        n = sizes[i % len(sizes)] if sizes else len(body)
        yield body[pos:pos + n]
        pos, i = pos + n, i + 1


# --- the splitter alone ----------------------------------------------------------------------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.lists(VALUES, max_size=6), rv=st.text(max_size=8), items_first=st.booleans(),
       indent=st.booleans(), extra=st.dictionaries(HOSTILE, VALUES, max_size=2),
       sizes=st.lists(st.integers(1, 300), max_size=4))
def test_each_item_is_split_where_the_whole_decode_reads_it(items: list[Any], rv: str, items_first: bool,
                                                            indent: bool, extra: dict[str, Any],
                                                            sizes: list[int]) -> None:
    extra = {k: v for k, v in extra.items() if k not in ("items", "kind", "apiVersion", "metadata")}
    body = list_body(items, {"resourceVersion": rv}, items_first=items_first, indent=indent, extra=extra)
    whole = orjson.loads(body)
    lb = ListBody(pieces(body, sizes))
    assert [orjson.loads(x) for x in lb.items()] == whole.pop("items")
    assert lb.members == whole  # metadata (resourceVersion, continue) before or after the items


# Items that open alike, with nested objects that open as they do: where a run of items is cut at the
# last such opening, it is sometimes an item's, sometimes a nested one's (then the scan splits them).
ALIKE = st.builds(lambda a, b, c: {"metadata": a, "list": [{"metadata": x} for x in b], "z": c},
                  VALUES, st.lists(VALUES, max_size=3), VALUES)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.lists(ALIKE, max_size=12), items_first=st.booleans(), indent=st.booleans(),
       sizes=st.lists(st.integers(1, 2000), max_size=4))
def test_runs_of_items_that_open_alike_split_where_the_whole_decode_reads_them(
        items: list[Any], items_first: bool, indent: bool, sizes: list[int]) -> None:
    body = list_body(items, {"resourceVersion": "1"}, items_first=items_first, indent=indent)
    lb = ListBody(pieces(body, sizes))
    assert [orjson.loads(x) for x in lb.items()] == items


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.lists(VALUES, max_size=4), items_first=st.booleans(), data=st.data())
def test_a_body_cut_anywhere_before_its_end_is_an_error(items: list[Any], items_first: bool,
                                                         data: st.DataObject) -> None:
    body = list_body(items, {"resourceVersion": "7"}, items_first=items_first, indent=False)
    cut = data.draw(st.integers(0, len(body) - 1))
    with pytest.raises((ListTruncated, ListSyntaxError)):
        list(ListBody(pieces(body[:cut], [data.draw(st.integers(1, 64))])).items())


def test_escapes_written_by_other_encoders_split_alike() -> None:
    # Go's encoder escapes <, >, & and U+2028 as \u; a pair of escapes spells a character past U+FFFF.
    body = (b'{"items":[{"a":"\\u007b\\"\\\\","b":"\\ud83d\\ude00 \\u003c/x\\u003e \\\\"},'
            b'\n {"c" : [ "]\\\\", {} ] } ] ,\r\n"metadata":{"resourceVersion":"2"}}')
    whole = orjson.loads(body)
    for size in (1, 5, len(body)):
        lb = ListBody(pieces(body, [size]))
        assert [orjson.loads(x) for x in lb.items()] == whole["items"]
        assert lb.members == {"metadata": {"resourceVersion": "2"}}


def test_values_nested_past_the_fast_pattern_split_by_tokens() -> None:
    deep: Any = {"a": "}]"}
    for i in range(listbody.FAST_DEPTH):  # twice as deep: an object and an array a level
        deep = {"k": [deep, "[{\\\"", i]}
    items = [deep, {"x": 1}, deep]
    body = list_body(items, {"resourceVersion": "1"}, items_first=True, indent=False)
    for size in (7, 100, len(body)):
        assert [orjson.loads(x) for x in ListBody(pieces(body, [size])).items()] == items
        for cut in (len(body) // 3, len(body) - 5):
            with pytest.raises(ListTruncated):
                list(ListBody(pieces(body[:cut], [size])).items())


@pytest.mark.parametrize("body", [
    b'{"items":[{"a":[1}]}', b'{"items":[{"a":1}}]}', b'{"items":[{"a":1} {"b":2}]}', b'{"items":[1,]}',
    b'{"items":[{"a":1}],}', b'{"items":[]} x', b'{"items" [1]}', b'{items:[1]}'])
def test_malformed_bodies_are_refused(body: bytes) -> None:
    with pytest.raises(ListSyntaxError):
        list(ListBody(pieces(body, [3])).items())


def test_a_malformed_item_is_refused_by_its_decode_when_the_pattern_took_it() -> None:
    items = list(ListBody(iter([b'{"items":[{"a":[1}]]}'])).items())  # brackets counted, not paired
    assert items == [b'{"a":[1}]']
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(items[0])


def test_an_item_past_the_bound_fails_the_list_naming_it() -> None:
    big = {"metadata": {"name": "huge-pod", "namespace": "t"}, "pad": "x" * 5000}
    body = list_body([{"metadata": {"name": "ok"}}, big], {"resourceVersion": "1"}, items_first=True, indent=False)
    got = []
    with pytest.raises(ItemTooLarge, match="huge-pod"):
        for data in ListBody(pieces(body, [512]), max_item=4096).items():
            got.append(orjson.loads(data)["metadata"]["name"])
    assert got == ["ok"]


def test_a_large_hostile_item_read_in_small_pieces_is_linear() -> None:
    # One 4 MiB item of escapes, quotes and brackets in strings and deep arrays, arriving 1 KiB at a
    # time: retrying the whole item on each piece would scan ~8 GB; it doubles what it waits for.
    s = '\\"}{][,' * 40_000
    item = {"metadata": {"name": "x"}, "a": [s] * 12, "b": [[[[[s]]]]] * 2}
    body = list_body([item, item], {"resourceVersion": "1"}, items_first=False, indent=False)
    assert len(body) > 4 << 20
    t = time.monotonic()
    out = list(ListBody(pieces(body, [1024])).items())
    assert time.monotonic() - t < 10.0  # (quadratic: minutes)
    assert [orjson.loads(x) for x in out] == [item, item]
    spaced = body[:-1] + b" \r\n\t" * (1 << 20) + body[-1:]  # 4 MiB of whitespace before the List's end
    t = time.monotonic()
    assert len(list(ListBody(pieces(spaced, [1024])).items())) == 2
    assert time.monotonic() - t < 10.0  # (quadratic: minutes)


# --- the Listing over HTTP -------------------------------------------------------------------------


def _old(url: str, decoder: Any) -> list[Any]:
    """The page path (limit > 0), untouched: one answer decoded whole, as unpaginated lists were."""
    return list(listing(url, limit=500, decoder=decoder))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.lists(pods(), max_size=5), items_first=st.booleans(), indent=st.booleans(),
       chunks=st.sampled_from([0, 1, 97, 4096]), full=st.booleans())
def test_the_same_objects_as_the_whole_answer_decoded_at_once(items: list[Any], items_first: bool, indent: bool,
                                                              chunks: int, full: bool) -> None:
    body = list_body(items, {"resourceVersion": "4242"}, items_first=items_first, indent=indent)
    decoder = FULL if full else POD_DECODER
    with raw_server(lambda path, q: response(body, chunks=chunks)) as (url, seen):
        new = listing(url, decoder=decoder)
        got = list(new)
        assert got == _old(url, decoder)
        assert new.resource_version == "4242"
        assert "limit" not in seen[0]


def test_an_item_the_typed_decode_refuses_comes_whole_with_the_same_record() -> None:
    """As in a page (which then falls back whole): the same records and problems come out."""
    meta = {"name": "a", "namespace": "t", "uid": "u1", "creationTimestamp": "2026-01-01T00:00:00Z"}
    good: dict[str, Any] = {"metadata": meta, "status": {"phase": "Running"},
                            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    bad = {**good, "metadata": {**good["metadata"], "name": "b", "labels": 5}}  # labels of the wrong type
    body = list_body([good, bad, 7, good], {"resourceVersion": "9"}, items_first=False, indent=False)
    with raw_server(lambda path, q: response(body)) as (url, _):
        new, old = list(listing(url)), _old(url, POD_DECODER)
    assert len(new) == len(old) == 3  # 7 is no object: skipped, as in a page
    # the refused item comes as dicts, the clean ones typed (as watch frames do: collector/sources/decode.py)
    assert new[1]["metadata"]["labels"] == 5 and type(new[0]) is PodObject and type(new[2]) is PodObject
    for n, o in zip(new, old, strict=True):
        a, b = normalize(n), normalize(o)
        assert a.record == b.record and a.problems == b.problems


def test_a_server_that_pages_an_unpaginated_list_is_followed() -> None:
    pages = {"": list_body([{"metadata": {"name": "p1"}}], {"resourceVersion": "5", "continue": "c1"},
                           items_first=True, indent=False),
             "c1": list_body([{"metadata": {"name": "p2"}}], {"resourceVersion": "6"}, items_first=False,
                             indent=False)}
    with raw_server(lambda path, q: response(pages[q.get("continue", [""])[0]], chunks=13)) as (url, seen):
        lst = listing(url)
        assert [o.metadata.name for o in lst] == ["p1", "p2"]  # (clean pods: typed)
    assert lst.resource_version == "6" and [q.get("continue") for q in seen] == [None, ["c1"]]
    assert all("limit" not in q for q in seen)


def _fill(n: int) -> list[dict[str, Any]]:
    return [{"metadata": {"name": f"pod-{i:05d}", "namespace": "team", "uid": f"uid-{i}",
                          "annotations": {"note": '{"a": "b"} \\ ' * 300}},
             "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
             "status": {"phase": "Running"}} for i in range(n)]


@pytest.mark.parametrize("chunks", [0, 8192])
def test_the_whole_list_is_read_in_memory_bounded_by_a_read_not_the_list(chunks: int) -> None:
    body = list_body(_fill(5000), {"resourceVersion": "1"}, items_first=False, indent=False)
    assert len(body) > 16 << 20
    with raw_server(lambda path, q: response(body, chunks=chunks)) as (url, _):
        lst = listing(url, decoder=FULL)
        names = []
        tracemalloc.start()
        try:
            for obj in lst:
                names.append(obj["metadata"]["name"])
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert len(names) == 5000 and lst.resource_version == "1"
    assert peak < 4 << 20, f"peak {peak / 2 ** 20:.1f} MiB while reading a {len(body) / 2 ** 20:.0f} MiB list"


# --- errors, as the page path's ------------------------------------------------------------------

BODY = list_body(_fill(30), {"resourceVersion": "3"}, items_first=True, indent=False)


@pytest.mark.parametrize("answer", [
    lambda: response(BODY, length=len(BODY) + 10),  # Content-Length promises more: connection closed
    lambda: cut_chunked(BODY, len(BODY) // 2),  # chunked, cut mid-body
    lambda: response(BODY[:len(BODY) // 2]),  # a whole HTTP answer whose JSON stops short
    lambda: response(BODY[:len(BODY) // 2] + b"]}"),  # ... or goes wrong mid-stream
], ids=["content-length", "chunked", "short", "malformed"])
def test_a_cut_or_malformed_answer_is_a_retryable_error_naming_the_resource(answer: Callable[[], Any]) -> None:
    with raw_server(lambda path, q: answer()) as (url, _), \
            pytest.raises(RetryableSourceError, match=re.escape(POD.path)):
        list(listing(url))


@pytest.mark.parametrize(("body", "message"), [
    (b"[1, 2]", "expected an object"), (b'{"items": {"a": 1}}', "not an array")])
def test_an_answer_that_is_no_list_is_a_permanent_error(body: bytes, message: str) -> None:
    with raw_server(lambda path, q: response(body)) as (url, _), pytest.raises(PermanentSourceError, match=message):
        list(listing(url))


def test_an_item_past_the_bound_fails_the_listing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(listbody, "MAX_ITEM", 2048)
    with raw_server(lambda path, q: response(BODY)) as (url, _), pytest.raises(PermanentSourceError, match="pod-00000"):
        list(listing(url))
