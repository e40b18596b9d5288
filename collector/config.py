"""Settings from a YAML file: every key checked, durations as "90s"/"5m"/"1h"; errors name file and key."""

from __future__ import annotations

import dataclasses
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml

from collector.safeload import UnsafeInput, check_size, yaml_documents
from collector.settings import Settings

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


class ConfigError(ValueError):
    pass


def parse_duration(value: Any, where: str) -> timedelta:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return timedelta(seconds=float(value))
    m = _DURATION.match(str(value))
    if not m:
        raise ConfigError(f"{where}: not a duration: {value!r} (use e.g. 90s, 5m, 1h)")
    return timedelta(seconds=float(m.group(1)) * _UNITS[m.group(2)])


def _build(cls: Any, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        f = fields.get(str(key).replace("-", "_"))
        if f is None:
            raise ConfigError(f"{where}.{key}: unknown setting (known: {', '.join(sorted(fields))})")
        default = getattr(cls(), f.name)
        path = f"{where}.{key}"
        if dataclasses.is_dataclass(default):
            kwargs[f.name] = _build(type(default), value, path)
        elif isinstance(default, timedelta):
            kwargs[f.name] = parse_duration(value, path)
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise ConfigError(f"{path}: expected true or false, got {value!r}")
            kwargs[f.name] = value
        elif isinstance(default, int | float):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"{path}: expected a number, got {value!r}")
            kwargs[f.name] = type(default)(value)
        elif isinstance(default, dict):
            if not isinstance(value, dict):
                raise ConfigError(f"{path}: expected a mapping, got {value!r}")
            # A list value (account → namespaces) is kept as "a,b".
            kwargs[f.name] = {str(k): ",".join(map(str, v)) if isinstance(v, list) else str(v)
                              for k, v in value.items()}
        elif isinstance(default, frozenset):
            if not isinstance(value, list):
                raise ConfigError(f"{path}: expected a list, got {value!r}")
            kwargs[f.name] = frozenset(str(v) for v in value)
        else:
            kwargs[f.name] = str(value)
    return cls(**kwargs)


MAX_CONFIG_BYTES = 1 << 20


def load_settings(path: Path | None) -> Settings:
    """Settings from a YAML file; the same file and schema for `controller` and `explain`.

    Strict: no aliases, no key given twice, every key known, every regex compiled.
    """
    if path is None:
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
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from e
    return settings


_ACCOUNT = re.compile(r"^[a-z0-9]{3,24}$")
_CLOUDS = frozenset({"public", "china", "usgov"})


def _validate(s: Settings) -> None:
    """What a type alone does not say: storage names, clouds, regexes."""
    for cloud in s.storage.clouds:
        if cloud not in _CLOUDS:
            raise ConfigError(f"config.storage.clouds: unknown cloud {cloud!r} (known: {', '.join(sorted(_CLOUDS))})")
    for account in (*s.storage.accounts, *s.storage.account_namespaces):
        if not _ACCOUNT.match(account):
            raise ConfigError(f"config.storage: {account!r} is not a storage account name")
    for profile, regex in s.controller.log_regex_by_profile.items():
        try:
            re.compile(regex)
        except re.error as e:
            raise ConfigError(f"config.controller.log_regex_by_profile.{profile}: bad regex: {e}") from e
