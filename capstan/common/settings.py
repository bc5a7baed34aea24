"""Map plain dictionaries (from YAML or JSON) onto the frozen settings dataclasses.

Every subsystem keeps its settings in one frozen dataclass whose fields document unit and
default. `settings_from_mapping` builds one from a mapping and refuses unknown keys by name,
so a typo in a config file is an error rather than a silently ignored line.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from capstan.common.errors import ConfigError

T = TypeVar("T")


def settings_from_mapping(cls: type[T], values: Mapping[str, Any], where: str = "") -> T:
    """Build the dataclass `cls` from `values`; unknown keys and wrong types raise ConfigError."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    prefix = f"{where}." if where else ""
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(
            f"unknown setting {prefix}{unknown[0]!s}; known settings: {', '.join(sorted(fields))}"
        )
    kwargs = {name: _coerce(hints[name], raw, f"{prefix}{name}") for name, raw in values.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where or cls.__name__}: {exc}") from exc


def _coerce(hint: Any, raw: Any, key: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if raw is None:
            return None
        return _coerce(options[0], raw, key)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(raw) if not isinstance(raw, str) else hint[raw.upper()]
        except (KeyError, ValueError):
            names = ", ".join(m.name for m in hint)
            raise ConfigError(f"{key}: {raw!r} is not one of {names}") from None
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{key}: expected a mapping of settings, got {raw!r}")
        return settings_from_mapping(hint, raw, key)
    if hint is bool:
        if isinstance(raw, bool):
            return raw
        raise ConfigError(f"{key}: expected true or false, got {raw!r}")
    if hint in (int, float):
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            raise ConfigError(f"{key}: expected a number, got {raw!r}")
        if hint is int and isinstance(raw, float) and not raw.is_integer():
            raise ConfigError(f"{key}: expected a whole number, got {raw!r}")
        return hint(raw)
    if hint is str:
        if not isinstance(raw, str):
            raise ConfigError(f"{key}: expected a string, got {raw!r}")
        return raw
    return raw


def _yaml_error_place(exc: yaml.YAMLError) -> str:
    """Where and what, on one line (PyYAML's own text spans several, with a caret)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f" at line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
    return f": {' '.join(str(exc).split())}"


def settings_from_yaml(cls: type[T], text: str, where: str = "config") -> T:
    """Parse a YAML config document into `cls`; errors name the offending key."""
    return settings_from_mapping(cls, _yaml_mapping(text, where))


def _yaml_mapping(text: str, where: str) -> dict[str, Any]:
    try:
        loaded: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML{_yaml_error_place(exc)}") from None
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{where}: expected a mapping of settings at the top level")
    return loaded


def load_settings_file(
    cls: type[T], path: Path | None, what: str, overrides: Sequence[str] = ()
) -> T:
    """`settings_from_yaml` of the file at `path` (`what` names it in errors; None: no file),
    with `overrides` (`--set` arguments) applied on top."""
    loaded: dict[str, Any] = {}
    if path is not None:
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read {what} {path}: {exc.strerror}") from None
        loaded = _yaml_mapping(text, str(path))
    for override in overrides:
        _apply_override(loaded, override)
    return settings_from_mapping(cls, loaded)


def _apply_override(values: dict[str, Any], override: str) -> None:
    """`section.key=value`: the value is read as a YAML scalar (`8`, `true`, `text`), so it
    takes the same types as the file. Kubernetes expands `$(POD_IP)` in a container's args
    before the process sees them, which is how one ConfigMap serves every pod."""
    key, eq, raw = override.partition("=")
    path = key.strip().split(".")
    if not eq or not all(path):
        raise ConfigError(
            f"--set {override!r}: expected key=value, e.g. store.flush_mode=SYNC_FLUSH"
        )
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    if isinstance(value, dict | list):
        value = raw  # a scalar setting; leave the text for the type check to name
    holder = values
    for name in path[:-1]:
        inner = holder.setdefault(name, {})
        if not isinstance(inner, dict):
            raise ConfigError(f"--set {override!r}: {name} is not a section")
        holder = inner
    holder[path[-1]] = value
