"""Settings from a YAML file: every key checked, durations as "90s"/"5m"/"1h"; errors name file and key."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import yaml
from annotated_types import Ge, Gt
from pydantic import BeforeValidator, Field, Strict, StrictBool, StrictInt, TypeAdapter, ValidationError

from collector.redact import Redactor, compile_rules, install
from collector.safeload import UnsafeInput, check_size, yaml_documents
from collector.settings import Settings

_DURATION = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")  # signed: "-5m" is refused by its bound
_MAX_SECONDS = 100 * 365 * 86400  # a century: past it a timedelta overflows soon, and nothing waits so long
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


class ConfigError(ValueError):
    pass


def parse_duration(value: Any, where: str) -> timedelta:
    try:
        out: timedelta = _duration(value)
        return out
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from e


def _duration(value: Any) -> Any:
    """"90s", "5m", "1h", "250ms", "2d" or a number of seconds; a timedelta passes through."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r} (use e.g. 90s, 5m, 1h)")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        m = _DURATION.match(str(value)) if isinstance(value, str) else None
        if not m:
            raise ValueError(f"not a duration: {value!r} (use e.g. 90s, 5m, 1h)")
        seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if not math.isfinite(seconds) or abs(seconds) > _MAX_SECONDS:
        raise ValueError(f"not a usable duration: {value!r} (at most {_MAX_SECONDS // 86400} days)")
    return timedelta(seconds=seconds)


def _mapping(value: Any) -> Any:
    # A list value (account → namespaces) is kept as "a,b".
    if isinstance(value, dict):
        return {k: ",".join(map(str, v)) if isinstance(v, list) else v for k, v in value.items()}
    return value


# Values are checked by pydantic, one adapter per kind of setting: types (a string is not a list,
# a list is not a number), bounds (no negative window; intervals that must pass, not be zero).
_ZERO = timedelta(0)
_DURATION_T = Annotated[timedelta, BeforeValidator(_duration), Ge(_ZERO)]
_ADAPTERS: dict[str, TypeAdapter[Any]] = {
    "bool": TypeAdapter(StrictBool),
    "int": TypeAdapter(Annotated[StrictInt, Ge(0)]),
    "int+": TypeAdapter(Annotated[StrictInt, Gt(0)]),
    "float": TypeAdapter(Annotated[float, Strict(), Ge(0)]),
    "float+": TypeAdapter(Annotated[float, Strict(), Gt(0)]),
    "duration": TypeAdapter(_DURATION_T),
    "duration+": TypeAdapter(Annotated[timedelta, BeforeValidator(_duration), Gt(_ZERO)]),
    "set": TypeAdapter(Annotated[frozenset[Annotated[str, Field(strict=False)]], Strict(False)]),
    "mapping": TypeAdapter(Annotated[dict[str, str], BeforeValidator(_mapping)]),
    "str": TypeAdapter(Annotated[str, BeforeValidator(lambda v: str(v) if isinstance(v, int | float) else v)]),
}

# Settings that must be positive: zero would stop a loop, expire every lease or make all evidence
# stale. Durations elsewhere may be 0 where documented ("0 turns the source off").
_POSITIVE = frozenset({
    "claims.evidence_max_age", "claims.taucluster_max_age", "claims.scrape_interval", "claims.stall_multiplier",
    "claims.stall_ceiling_multiplier", "claims.stall_window_max",
    "controller.tick", "controller.batch_max", "controller.queue_max", "controller.watch_timeout_s",
    "controller.lease_duration", "controller.lease_renew", "controller.log_tail_lines",
    "controller.log_limit_bytes", "controller.log_quiet_every", "controller.log_poll_concurrency",
    "controller.agents.port", "bundles.history_versions",
})


def _kind(default: Any, key: str) -> str:
    positive = "+" if key in _POSITIVE else ""
    if isinstance(default, timedelta):
        return "duration" + positive
    if isinstance(default, bool):
        return "bool"
    if isinstance(default, int):
        return "int" + positive
    if isinstance(default, float):
        return "float" + positive
    if isinstance(default, Mapping):
        return "mapping"
    if isinstance(default, frozenset):
        return "set"
    return "str"


def _check(kind: str, value: Any, path: str) -> Any:
    try:
        return _ADAPTERS[kind].validate_python(value)
    except ValidationError as e:
        err = e.errors()[0]
        where = "".join(f"[{p}]" if isinstance(p, int) else _seg(p) for p in err["loc"]
                        if p not in ("function-before", "function-after"))
        if err["type"] == "value_error":  # our own check (a duration): its message names the value
            raise ConfigError(f"{path}{where}: {str(err['msg']).removeprefix('Value error, ')}") from None
        if err["type"] in ("greater_than", "greater_than_equal"):
            msg = "must be positive" if kind.endswith("+") else "must not be negative"
        elif err["type"] == "int_type" and isinstance(value, float):
            msg = "expected a whole number"
        else:
            msg = _PLAIN.get(err["type"], str(err["msg"]).lower())
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        raise ConfigError(f"{path}{where}: {msg}, got {shown}") from None


_PLAIN = {
    "frozen_set_type": "expected a list", "bool_type": "expected true or false", "int_type": "expected a number",
    "int_parsing": "expected a number", "int_from_float": "expected a whole number",
    "float_type": "expected a number", "float_parsing": "expected a number", "dict_type": "expected a mapping",
    "string_type": "expected a string",
}


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_./-]{1,100}")


def _seg(key: Any) -> str:
    """One step of a key path: `.name`, or `['odd\\nkey']` so that the error stays one line."""
    k = str(key)
    return f".{k}" if _PLAIN_KEY.fullmatch(k) else f"[{k[:100]!r}]"


def _build(cls: Any, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        f = fields.get(str(key).replace("-", "_"))
        if f is None:
            raise ConfigError(f"{where}{_seg(key)}: unknown setting (known: {', '.join(sorted(fields))})")
        default = getattr(cls(), f.name)
        path = f"{where}{_seg(key)}"
        if dataclasses.is_dataclass(default):
            kwargs[f.name] = _build(type(default), value, path)
        else:
            kwargs[f.name] = _check(_kind(default, path.removeprefix("config.").replace("-", "_")), value, path)
    return cls(**kwargs)


MAX_CONFIG_BYTES = 1 << 20
RUN_SERIES = ("all", "unhealthy")  # exporters.prometheus_fleet.RunSeries (a sibling layer)
MAX_LOG_READS = 32  # API log reads in flight; the client keeps POOL_SIZE (64) connections in all


def load_settings(path: Path | None) -> Settings:
    """Settings from a YAML file; the same file and schema for `controller` and `explain`.

    Strict: no aliases, no key given twice, every key known, every regex compiled.
    """
    if path is None:
        install(Redactor())
        return Settings()
    duplicates: list[str] = []
    try:
        size = path.stat().st_size
        check_size(size, MAX_CONFIG_BYTES, "a settings file")
        docs = list(yaml_documents(path.read_text(), duplicates))
    except (OSError, UnicodeDecodeError, yaml.YAMLError, UnsafeInput) as e:
        raise ConfigError(f"{path}: {e}") from e
    if duplicates:
        raise ConfigError(f"{path}: {duplicates[0].replace('; the last value is used', '')}")
    if len(docs) > 1:
        raise ConfigError(f"{path}: {len(docs)} YAML documents; expected one")
    data = (docs[0] if docs else None) or {}
    try:
        settings: Settings = _build(Settings, data, "config")
        _validate(settings)
        settings = _with_durations(settings)
        redactor = compile_rules(settings.redaction.patterns, settings.redaction.keys)
    except ValueError as e:  # ConfigError, or a redaction pattern RE2 refuses
        raise ConfigError(f"{path}: {e if isinstance(e, ConfigError) else f'config.redaction.patterns: {e}'}") from e
    install(redactor)  # the operator's redaction rules apply to every output of this process
    return settings


def _with_durations(s: Settings) -> Settings:
    """Mappings whose values are durations ("20m"), read as such (the mapping adapter keeps strings)."""
    by_profile = s.claims.stall_ceiling_by_profile
    if not by_profile:
        return s
    where = "config.claims.stall_ceiling_by_profile"
    parsed = {k: parse_duration(v, f"{where}[{k[:100]!r}]") for k, v in by_profile.items()}
    for k, v in parsed.items():
        if v <= timedelta(0):
            raise ConfigError(f"{where}[{k[:100]!r}]: must be positive")
    return dataclasses.replace(s, claims=dataclasses.replace(s.claims, stall_ceiling_by_profile=parsed))


_ACCOUNT = re.compile(r"^[a-z0-9]{3,24}$")
_CLOUDS = frozenset({"public", "china", "usgov"})
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def _validate(s: Settings) -> None:
    """What a type alone does not say: storage names, clouds, regexes."""
    for cloud in s.storage.clouds:
        if cloud not in _CLOUDS:
            raise ConfigError(f"config.storage.clouds: unknown cloud {cloud!r} (known: {', '.join(sorted(_CLOUDS))})")
    for key, accounts in (("accounts", s.storage.accounts), ("account_namespaces", s.storage.account_namespaces)):
        for account in accounts:
            if not _ACCOUNT.match(account):
                raise ConfigError(f"config.storage.{key}: {account[:100]!r} is not a storage account name")
    c = s.controller
    if c.lease_renew >= c.lease_duration:
        raise ConfigError(f"config.controller.lease_renew: must be shorter than config.controller.lease_duration "
                          f"({c.lease_renew.total_seconds():g}s >= {c.lease_duration.total_seconds():g}s)")
    if c.log_poll_concurrency > MAX_LOG_READS:  # beside the watches, within the client's connection pool
        raise ConfigError(f"config.controller.log_poll_concurrency: at most {MAX_LOG_READS}, "
                          f"got {c.log_poll_concurrency}")
    if c.run_series not in RUN_SERIES:
        raise ConfigError(f"config.controller.run_series: expected one of {', '.join(RUN_SERIES)}, "
                          f"got {c.run_series[:100]!r}")
    for ns in sorted(c.environment_namespaces):
        if not _NAMESPACE.match(ns):
            raise ConfigError(f"config.controller.environment_namespaces: {ns[:100]!r} is not a namespace name")
    for profile, regex in s.controller.log_regex_by_profile.items():
        try:
            re.compile(regex)
        except re.error as e:
            raise ConfigError(f"config.controller.log_regex_by_profile.{profile}: bad regex: {e}") from e
