"""Validate the fields of a loaded dump: each reader returns the field in the form the analysis uses, or raises a
:class:`DumpError` that names the file, the sample and the field.

Token columns (:func:`token_column`) are flat float tensors of the response's length, never larger in memory than
the file that held them (:func:`float_tensor`, :func:`constant_mask`); lengths (:func:`length_column`) are integers
between 0 and :data:`MAX_TOKENS`; ids (:func:`integer`) and flags (:func:`flag`) are Python or numpy integers, never
bools posing as numbers; rewards (:func:`float_list`) are sequences of numbers or nothing.
"""

from __future__ import annotations

from numbers import Integral
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...formatting import brief
from .schema import MAX_TOKENS, DumpError


def token_column(rows: list[dict[str, Any]], key: str, n_tokens: list[int], path: Path, label: str
            ) -> list[torch.Tensor] | None:
    """Per-sample 1-D tensors of ``key`` with ``n_tokens[i]`` entries each, or None if no sample has it."""
    present = [row.get(key) is not None for row in rows]
    if not any(present):
        return None
    if not all(present):
        raise DumpError(f"{path}: {key} is present for only {sum(present)} of {len(rows)} samples")
    out = []
    for i, (row, n) in enumerate(zip(rows, n_tokens)):
        if key.endswith("log_probs") and not _floating(row[key]):
            kind = "complex numbers" if _complex(row[key]) else "integers"
            raise DumpError(f"{path}: sample {i} ({label} {row.get('rollout_position', i)}): {key} holds {kind} "
                            f"({_dtype_name(row[key])}), not floating-point log-probs: the dump is not what slime "
                            "writes (token ids or masks under the wrong key?); re-dump it")
        tensor = float_tensor(row[key], path, f"sample {i}: {key}")
        if tensor.numel() != n:
            raise DumpError(f"{path}: sample {i} ({label} {row.get('rollout_position', i)}): {key} has "
                            f"{tensor.numel()} tokens but the response has {n}; the dump must hold full-length "
                            "response tensors (context-parallel shards gathered)")
        out.append(tensor)
    return out


def _floating(value: Any) -> bool:
    """Whether log-probs are floating point: a float tensor or array, or a list with a float (an empty list too)."""
    if torch.is_tensor(value) or isinstance(value, np.ndarray):
        return value.dtype.is_floating_point if torch.is_tensor(value) else np.issubdtype(value.dtype, np.floating)
    return not isinstance(value, (list, tuple)) or not value or any(isinstance(v, float) for v in value)


def _complex(value: Any) -> bool:
    """Whether a tensor, an array or a list holds complex numbers."""
    if torch.is_tensor(value):
        return value.is_complex()
    if isinstance(value, np.ndarray):
        return np.iscomplexobj(value)
    return isinstance(value, (list, tuple)) and any(isinstance(v, complex) for v in value)


def _dtype_name(value: Any) -> str:
    return str(value.dtype) if hasattr(value, "dtype") else "a list of integers"


def constant_mask(value: float, n: int) -> torch.Tensor:
    """A default mask of ``n`` tokens that takes no memory (a stride-0 view): a response length read from a file
    must not allocate more than the file holds."""
    return torch.full((1,), value).expand(n)


def float_tensor(value: Any, path: Path, what: str) -> torch.Tensor:
    """``value`` as a flat float tensor; a tensor whose elements overlap in memory (a stride-0 ``expand``, which
    slime never writes) is refused: copying it would take memory the file does not hold."""
    if torch.is_tensor(value) and value.untyped_storage().nbytes() < value.numel() * value.element_size():
        raise DumpError(f"{path}: {what} is a tensor of {value.numel()} elements stored in "
                        f"{value.untyped_storage().nbytes()} bytes (overlapping elements); re-dump it with slime")
    try:
        return torch.as_tensor(value).detach().reshape(-1).float()  # a dumped tensor that requires grad too
    except (TypeError, ValueError, RuntimeError):
        raise DumpError(f"{path}: {what} is not a list of numbers or a tensor ({type(value).__name__})") from None


def integer(value: Any) -> int | None:
    """``value`` if it is an integer (Python or numpy, not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        return None
    return int(value)


def flag(value: Any, path: Path, what: str) -> bool:
    """A 0/1 flag of a sample (``truncated``, ``remove_sample``): a bool or the integer 0 or 1, Python or numpy."""
    if isinstance(value, (bool, np.bool_)) or integer(value) in (0, 1):
        return bool(value)
    raise DumpError(f"{path}: {what} must be true/false or 0/1, got {brief(value, 40)}")


def length_column(rows: list[dict[str, Any]], key: str, path: Path) -> list[int]:
    """The integer ``key`` (a response length) of every sample, each between 0 and :data:`MAX_TOKENS`."""
    try:
        lengths = [_count(row[key]) for row in rows]
    except (KeyError, TypeError, ValueError, OverflowError):
        raise DumpError(f"{path}: every sample needs an integer '{key}'") from None
    if None in lengths:
        i = lengths.index(None)
        raise DumpError(f"{path}: sample {i}: {key} must be an integer, got {brief(rows[i][key], 40)} "
                        f"({type(rows[i][key]).__name__}); slime writes one int per sample: re-dump it")
    if lengths and not 0 <= min(lengths) <= max(lengths) <= MAX_TOKENS:
        bad = min(lengths) if min(lengths) < 0 else max(lengths)
        raise DumpError(f"{path}: {key} must be between 0 and {MAX_TOKENS}, got {brief(bad, 40)}")
    return lengths


def _count(value: Any) -> int | None:
    """A length: a Python or numpy integer or a 0-d integer tensor (never a bool, a float or a string), else None."""
    if torch.is_tensor(value) and value.dim() == 0 and not value.is_floating_point() and not value.is_complex() \
            and value.dtype != torch.bool:
        return int(value)
    return integer(value)


def reward_list(values: Any, path: Path, what: str) -> tuple[list[float] | None, str | None]:
    """The per-sample rewards ``values`` as floats (:func:`float_list`), or None and a note naming the dump, the first
    sample whose value is not a number, and the value (``what``: the field's name)."""
    floats = float_list(values)
    if floats is not None or values is None:
        return floats, None
    items = None if isinstance(values, (str, bytes)) else _items(values)
    if items is None:
        return None, f"{path}: {what} is {brief(values, 40)}, not a list of numbers"
    found = next(((i, v) for i, v in enumerate(items) if float_list([v]) is None), None)
    if found is None:
        return None, f"{path}: {what} is {brief(values, 40)}, not a list of numbers"
    return None, f"{path}: sample {found[0]}: {what} is {brief(found[1], 40)}, not a number"


def _items(values: Any) -> list[Any] | None:
    try:
        return list(values)
    except TypeError:
        return None


def float_list(values: Any) -> list[float] | None:
    """Floats of a sequence of numbers (None if it is not one; a string is neither a sequence nor a number here, a
    boolean no number)."""
    if values is None or isinstance(values, (str, bytes)):
        return None
    try:
        items = list(values)
        if any(isinstance(v, (str, bytes, bool, np.bool_)) for v in items):  # True is no reward (as in the hooks)
            return None
        return [float(v) for v in items]
    except (TypeError, ValueError, OverflowError, RuntimeError):
        return None
