"""Settings validation (pydantic adapters per kind of value): every wrong value is one line naming
its key; no traceback for any YAML value in any known key."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.config import ConfigError, load_settings
from collector.settings import Settings


def _load(tmp_path: Path, text: str) -> Settings:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return load_settings(p)


@pytest.mark.parametrize(("text", "message"), [
    ("taugrid: {run_phases: Running}", "config.taugrid.run_phases: expected a list, got 'Running'"),
    ("taugrid: {run_phases: 5}", "config.taugrid.run_phases: expected a list, got 5"),
    ("taugrid: {run_phases: [Running, 5]}", "config.taugrid.run_phases[1]: expected a string"),
    ("claims: {restart_window: -5m}", "config.claims.restart_window: must not be negative, got '-5m'"),
    ("claims: {event_horizon: -1}", "config.claims.event_horizon: must not be negative, got -1"),
    ("controller: {tick: 0}", "config.controller.tick: must be positive, got 0"),
    ("controller: {lease_duration: 0s}", "config.controller.lease_duration: must be positive"),
    ("controller: {batch_max: 0}", "config.controller.batch_max: must be positive, got 0"),
    ("controller: {batch_max: 2.5}", "config.controller.batch_max: expected a whole number, got 2.5"),
    ("controller: {leader_election: 'yes'}", "config.controller.leader_election: expected true or false"),
    ("claims: {stall_multiplier: true}", "config.claims.stall_multiplier: expected a number, got True"),
    ("claims: {stall_floor: 5 parsecs}", "config.claims.stall_floor: not a duration: '5 parsecs'"),
    ("controller: {lease_renew: 30s}",
     "config.controller.lease_renew: must be shorter than config.controller.lease_duration"),
    ("controller: {log_poll_concurrency: 0}", "config.controller.log_poll_concurrency: must be positive, got 0"),
    ("controller: {log_poll_concurrency: 100}", "config.controller.log_poll_concurrency: at most 32, got 100"),
    ("controller: {ray_dashboards: [a]}", "config.controller.ray_dashboards: expected a mapping"),
    ("controller: {agents: {port: http}}", "config.controller.agents.port: expected a number, got 'http'"),
    ("claims: {evidence_max_age: 100000000000000}", "config.claims.evidence_max_age: not a usable duration"),
    ("claims: {evidence_max_age: .nan}", "config.claims.evidence_max_age: not a usable duration"),
    ("claims: 5", "config.claims: expected a mapping"),
])
def test_wrong_values_are_one_line_naming_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, text)
    assert message in str(e.value)
    assert "\n" not in str(e.value) and str(e.value).startswith(str(tmp_path / "c.yaml"))


def test_good_values_still_load(tmp_path: Path) -> None:
    s = _load(tmp_path, "taugrid: {run_phases: [Running, Done]}\nclaims: {stall_floor: 90s, stall_multiplier: 2}\n"
                        "controller: {log_poll_interval: 0, tick: 250ms, ray_dashboards: {team/r: 'http://x'}}\n"
                        "storage: {account_namespaces: {acct123: [a, b]}}\n")
    assert s.taugrid.run_phases == frozenset({"Running", "Done"})
    assert s.claims.stall_floor == timedelta(seconds=90) and s.claims.stall_multiplier == 2.0
    assert s.controller.log_poll_interval == timedelta(0) and s.controller.tick == timedelta(milliseconds=250)
    assert s.storage.account_namespaces == {"acct123": "a,b"}


def _keys(cls: type, prefix: str = "") -> list[str]:
    out = []
    for f in dataclasses.fields(cls):
        default = getattr(cls(), f.name)
        if dataclasses.is_dataclass(default):
            out += _keys(type(default), f"{prefix}{f.name}.")
        else:
            out.append(prefix + f.name)
    return out


KEYS = _keys(Settings)
_scalar = (st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=True) | st.text(max_size=12)
           | st.sampled_from(["5m", "-1s", "0", "90s", "1h", "Running", "1e9"]))
_value = st.recursive(_scalar, lambda k: st.lists(k, max_size=3) | st.dictionaries(st.text(max_size=5), k, max_size=3),
                      max_leaves=6)


@settings(max_examples=200, deadline=None)
@given(key=st.sampled_from(KEYS), value=_value)
def test_any_value_in_any_key_loads_or_is_one_clear_line(tmp_path_factory: pytest.TempPathFactory, key: str,
                                                          value: object) -> None:
    doc: dict[str, object] = {}
    node = doc
    *parents, last = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})  # type: ignore[assignment]
    node[last] = value
    p = tmp_path_factory.mktemp("cfg") / "c.yaml"
    p.write_text(yaml.safe_dump(doc))
    try:
        load_settings(p)
    except ConfigError as e:
        text = str(e)
        assert "\n" not in text and f"config.{key}" in text, text
