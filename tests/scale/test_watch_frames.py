"""Any watch frame — well-formed, truncated or hostile — ends in an event applied or a SourceError
naming the resource: never another exception out of the reflector's decode-and-apply step."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.controller import Controller
from collector.settings import Settings
from collector.sources.decode import decoder_for
from collector.sources.kube_api import Resource, SourceError
from collector.sources.watch import Reflector

POD = Resource("Pod", "", "v1", "pods")
_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=8)
_json = st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False,
                     allow_infinity=False) | _text | st.sampled_from(["ADDED", "MODIFIED", "DELETED", "BOOKMARK",
                                                                      "ERROR", "Pod", "v1", "410", "Running"]),
                     lambda k: st.lists(k, max_size=3) | st.dictionaries(
                         st.sampled_from(["type", "object", "metadata", "name", "namespace", "resourceVersion",
                                          "status", "spec", "code", "message", "kind"]) | _text, k, max_size=4),
                     max_leaves=12)


def _reflector() -> tuple[Reflector, Controller]:
    c = Controller(None, Settings(), lambda: datetime(2026, 1, 10, tzinfo=UTC))  # type: ignore[arg-type]
    return Reflector(None, POD, c.watch, c.now, decoder=decoder_for("v1", "Pod")), c  # type: ignore[arg-type]


def _feed(line: bytes) -> None:
    r, c = _reflector()
    try:
        event: Any = r.decoder.event(line)
        r._apply(event)
        c.watch.flush(POD)
    except orjson.JSONDecodeError:
        pass  # the reflector turns this into a SourceError naming the resource
    except SourceError as e:
        assert "pods" in str(e)


@settings(max_examples=300, deadline=None)
@given(frame=_json)
def test_structured_frames(frame: Any) -> None:
    _feed(orjson.dumps(frame))


@settings(max_examples=200, deadline=None)
@given(frame=_json, cut=st.integers(0, 200), noise=st.binary(max_size=8))
def test_cut_and_noisy_frames(frame: Any, cut: int, noise: bytes) -> None:
    data = orjson.dumps({"type": "MODIFIED", "object": frame})
    _feed(data[:cut] + noise)
