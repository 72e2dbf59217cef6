"""Typed reading of a config section: each value checked against its dataclass field's type hint (booleans,
integers of 64 bits, finite floats, literals, unions), unknown keys refused with the closest valid one, and each
section's own ``problems()`` raised, every message naming the key's full path."""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from typing import Any, Literal, Mapping, Union

from ..errors import ConfigError
from ..formatting import brief, clip


def reject_unknown(data: Mapping[str, Any], known: tuple[str, ...], path: str) -> None:
    for key in data:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(f"{path}.{clip(str(key), 60)}: unknown key; {hint}valid keys: {', '.join(known)}")


def build_section(cls: type, data: Any, path: str, base: Any = None, extra_keys: tuple[str, ...] = (),
           names: Mapping[str, str] | None = None) -> Any:
    """``cls`` from ``data`` over ``base``; the first of its ``problems()`` raised. ``names``: the key the user wrote
    for each field (slime's mis.yaml vocabulary), used for the field in the error's path and its message."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a mapping of keys, got {brief(data)}")
    hints = typing.get_type_hints(cls)
    fields = tuple(f.name for f in dataclasses.fields(cls))
    reject_unknown(data, fields + extra_keys, path)
    values = {k: coerce(hints[k], v, f"{path}.{k}") for k, v in data.items() if k in fields}
    obj = dataclasses.replace(base, **values) if base is not None else cls(**values)
    for key, message in obj.problems() if hasattr(obj, "problems") else ():
        if names:
            key = names.get(key, key)
            message = re.sub(r"\b(" + "|".join(map(re.escape, names)) + r")\b",
                             lambda m: names[m.group(1)].split(" (")[0], message)
        raise ConfigError(f"{path}.{key}: {message}")
    return obj


def _describe(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string", type(None): "null"}.get(
        tp, getattr(tp, "__name__", str(tp)))


_INT_MAX = 2**63 - 1
"""The largest integer setting: counts of rollouts or files, reported as float metrics and stored as JSON numbers."""
_FLOAT_MAX = 1.7976931348623157e308
"""The largest finite float: an integer above it (a YAML number of 309 digits) is read as infinite, not an overflow."""

FLOAT32_MAX = 3.4028234663852886e38
"""The largest float32: every number setting reaches the hooks' float32 tensors (a bound, a multiplier), where a larger
one is infinite, or an error mid-run (``clamp`` and ``add(alpha=...)`` refuse it)."""

YAML_SWITCHES = {False: "off", True: "on"}
"""What a setting whose values include ``off`` (``eps_guard``, ``drift_guard``) reads from YAML's bare ``off``."""


class _NumberOutOfRange(ConfigError):
    """A number that is NaN or infinite, or an integer beyond 64 bits: reported as such, not as a type mismatch of a
    union's other options."""


def coerce(tp: Any, value: Any, path: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return build_section(tp, value if value is not None else {}, path)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for option in args:
            if option is type(None):
                continue
            try:
                return coerce(option, value, path)
            except _NumberOutOfRange:
                raise
            except ConfigError:
                continue
    elif origin is Literal:
        if isinstance(value, bool) and YAML_SWITCHES[value] in args:  # YAML 1.1 reads a bare off / on as a boolean
            return YAML_SWITCHES[value]
        if value in args:
            return value
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if abs(value) > _INT_MAX:
                raise _NumberOutOfRange(f"{path}: must be an integer of at most 64 bits (|value| < 2^63), got "
                                        f"{brief(value)}")
            return value
    elif tp is float:
        number = value
        if isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                number = None
        if isinstance(number, (int, float)) and not isinstance(number, bool):
            if isinstance(number, int) and abs(number) > _FLOAT_MAX:  # an integer beyond float range
                number = math.inf if number > 0 else -math.inf
            if not math.isfinite(number):
                raise _NumberOutOfRange(f"{path}: must be a finite number, got {brief(value)}")
            if abs(number) > FLOAT32_MAX:
                raise _NumberOutOfRange(f"{path}: must be at most {FLOAT32_MAX:.4g} in magnitude, the largest float32 "
                                        f"(the hooks compute in float32, where this number is infinite), got "
                                        f"{brief(value)}")
            return float(number)
    elif tp is str:
        if isinstance(value, str):
            return value
    raise ConfigError(f"{path}: expected {_describe(tp)}, got {brief(value)}")
