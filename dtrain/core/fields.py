"""Config fields: a default declared with the rule its value must follow, and the checks
that turn a TOML table into a section (types coerced, rules applied, errors as one line).

The mechanism only; the schema (the sections and their fields) is
:mod:`dtrain.core.config.schema`.
"""
from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Any

from dtrain.core.errors import ConfigError


def opt(default: Any, rule: str | Callable[[], str], check: Callable[[Any], bool],
        doc: str = "") -> Any:
    """A field of ``default`` whose values must pass ``check``; ``rule`` (or its result)
    says so in errors, ``doc`` what it is for."""
    return field(default=default, metadata={"rule": rule, "check": check, "doc": doc})


def choice(default: str, *options: str, doc: str = "") -> Any:
    return opt(default, "one of " + ", ".join(repr(o) for o in options),
               lambda v: v in options, doc)


def at_least(default: int | float, low: int | float, doc: str = "") -> Any:
    return opt(default, f">= {low}", lambda v: v >= low, doc)


def positive(default: float, doc: str = "") -> Any:
    return opt(default, "> 0", lambda v: v > 0 and math.isfinite(v), doc)


def unit_open(default: float, doc: str = "") -> Any:
    return opt(default, "in [0, 1)", lambda v: 0 <= v < 1, doc)


def free(default: Any, doc: str = "") -> Any:
    return opt(default, "", lambda v: True, doc)


# --- checking a table against a section -----------------------------------------------

def _coerce(key: str, value: Any, hint: Any, source: str) -> Any:
    """Check the TOML value's type against the field's annotation."""
    def bad(expected: str) -> ConfigError:
        return ConfigError(f"{key} = {value!r} in {source}: expected {expected}")

    origin = typing.get_origin(hint)
    if hasattr(hint, "coerce"):                    # a type of its own (a layer spec)
        try:
            return hint.coerce(value)
        except ValueError as exc:
            raise ConfigError(f"{key} in {source}: {exc}") from None
    if origin is tuple:
        (item,) = {a for a in typing.get_args(hint) if a is not Ellipsis}
        if not isinstance(value, (list, tuple)):
            raise bad(f"a list of {item.__name__}")
        return tuple(_coerce(key, v, item, source) for v in value)
    if hint is bool:
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("an integer")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad("a number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise bad("a string")
        return value
    raise TypeError(f"unsupported config type {hint!r}")  # a bug in the schema


def build(cls: type, name: str, values: Mapping[str, Any], source: str) -> Any:
    """Section ``[name]`` of ``source``: ``cls`` made from ``values``, each coerced to its
    field's type and checked against its rule; the first problem is a :class:`ConfigError`."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in values.items():
        if key not in fields:
            raise ConfigError(f"unknown key '{name}.{key}' in {source}; "
                              f"known keys in [{name}]: {', '.join(fields)}")
        full = f"{name}.{key}"
        meta = fields[key].metadata
        if isinstance(value, bool) and hints[key] is str and meta["check"]("true") \
                and meta["check"]("false"):
            value = "true" if value else "false"     # a switch that also has other settings
        value = _coerce(full, value, hints[key], source)
        if not meta["check"](value):
            rule = meta["rule"]() if callable(meta["rule"]) else meta["rule"]
            raise ConfigError(f"{full} = {show(value)} in {source}: must be {rule}")
        kwargs[key] = value
    return cls(**kwargs)


def show(value: Any) -> str:
    """A value as it would be written in TOML."""
    if isinstance(value, tuple):
        return "[" + ", ".join(show(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if dataclasses.is_dataclass(value):
        return "{" + ", ".join(f"{k} = {show(v)}" for k, v in
                               dataclasses.asdict(value).items()) + "}"
    return repr(value) if isinstance(value, str) else str(value)
