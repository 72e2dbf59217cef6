"""verl 0.9.1's rollout-correction vocabulary and our :class:`~mismatch_ctrl.correction.CorrectionSpec`, both ways.

verl's keys (``algorithm.rollout_correction``, ``verl/trainer/config/algorithm/rollout_correction.yaml`` and
``verl/trainer/ppo/rollout_corr_helper.py`` in the 0.9.1 wheel), with ``l = log pi_train - log mu_rollout`` clamped to
``[-20, 20]`` and ``rho = exp(l)``:

- ``rollout_is``: ``token`` (weight ``rho``) or ``sequence`` (``exp(sum_t m l)``); ``rollout_is_threshold`` a number
  ``C`` (TIS: ``min(w, C)``) or a ``"lo_hi"`` string (IcePop: ``w`` inside ``[lo, hi]``, 0 outside; ``lo > 0``);
  ``rollout_is_batch_normalize``.
- ``rollout_rs``: comma-joined options, each with its own threshold (or one shared): ``token_k1`` / ``seq_sum_k1`` /
  ``seq_mean_k1`` keep ``log lo <= -stat <= log hi`` for the token's ``l``, the sequence's ``sum l`` or mean ``l``,
  i.e. the ratio (token, sequence product, geometric mean) within ``[1/hi, 1/lo]``; ``*_k2`` / ``*_k3`` keep
  ``stat <= threshold`` (``k2 = l^2 / 2``, ``k3 = rho - 1 - l``). Rejection removes tokens from ``response_mask``.

So our band ``[low, high]`` on a ratio is verl's k1 threshold ``"1/high_1/low"``, our ``rs_k3_max`` is
``seq_mean_k3``, and our IS stage maps when its mode is ``truncate`` or ``mask`` with a lower bound above 0. verl has
no veto, no geometric IS level and no ``clip`` mode (weights clamped from below). :func:`verl_keys` is the one place
that decides; :data:`PRESET_KEYS` is its table over our presets. verl before 0.7.1 spoke another vocabulary
(``rollout_rs: token/sequence/geometric``, ``rollout_rs_threshold_lower``, ``rollout_token_veto_threshold``; removed
in verl #4544): :func:`from_verl_keys` names the 0.9.1 spelling of those.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from .correction import CorrectionSpec
from .errors import ConfigError
from .formatting import brief
from .presets import PRESETS

VERL_VERSION = "0.9.1"
"""The verl release the adapter and this vocabulary were read from and tested against."""

VERL_KEYS = ("rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs", "rollout_rs_threshold")
"""The keys of verl 0.9.1's ``algorithm.rollout_correction`` that decide weights and rejection."""

REMOVED_KEYS = {
    "rollout_rs_threshold_lower": "give both bounds in rollout_rs_threshold as 'lo_hi' (k1 options)",
    "rollout_token_veto_threshold": "verl 0.9.1 has no veto; use our preset geo_mis (mismatch_ctrl runs it)",
}
"""Keys verl removed in #4544 (0.7.1), with the 0.9.1 way to say the same."""

_RS_OPTION = {"token": "token_k1", "sequence": "seq_sum_k1", "geometric": "seq_mean_k1"}
_RS_LEVEL = {option: level for level, option in _RS_OPTION.items()}
K3_OPTION = "seq_mean_k3"


def _band(low: float | None, high: float | None) -> str | None:
    """verl's k1 threshold for our ratio band ``[low, high]``: ``"1/high_1/low"`` (None if a side is open)."""
    if low is None or high is None or not low > 0:
        return None
    return f"{1.0 / high!r}_{1.0 / low!r}"


def verl_keys(spec: CorrectionSpec) -> dict[str, Any] | None:
    """verl 0.9.1 ``algorithm.rollout_correction`` values giving ``spec``'s weights and rejections (for every key in
    :data:`VERL_KEYS`), or None when verl cannot express it (a veto, a geometric IS level, ``clip`` mode, an IS mask
    or RS band with a lower bound of 0 or an open side)."""
    if spec.veto is not None or spec.is_level == "geometric" or spec.is_mode == "clip":
        return None
    keys: dict[str, Any] = {"rollout_is": spec.is_level, "rollout_is_threshold": 2.0,
                            "rollout_is_batch_normalize": spec.batch_normalize, "rollout_rs": None,
                            "rollout_rs_threshold": None}
    if spec.is_level is not None:
        low, high = spec.is_bounds
        if spec.is_mode == "truncate":
            keys["rollout_is_threshold"] = float(high)
        elif low > 0:
            keys["rollout_is_threshold"] = f"{low!r}_{high!r}"
        else:
            return None
    options, thresholds = [], []
    if spec.rs_level is not None:
        band = _band(spec.rs_low, spec.rs_high)
        if band is None:
            return None
        options.append(_RS_OPTION[spec.rs_level])
        thresholds.append(band)
    if spec.rs_k3_max is not None:
        options.append(K3_OPTION)
        thresholds.append(repr(float(spec.rs_k3_max)))
    if options:
        keys["rollout_rs"] = ",".join(options)
        keys["rollout_rs_threshold"] = thresholds[0] if len(thresholds) == 1 else ",".join(thresholds)
    return keys


def _number(value: Any, path: str) -> float:
    try:
        result = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        result = math.nan
    if not math.isfinite(result) or result <= 0:
        raise ConfigError(f"{path}: expected a number > 0 (verl 0.9.1's threshold), got {brief(value)}")
    return result


def _pair(spec: Any, path: str) -> tuple[float | None, float]:
    """``(lo, hi)`` of a verl threshold: a number is ``(None, hi)``, ``"lo_hi"`` both."""
    if isinstance(spec, str) and "_" in spec:
        lo, hi = spec.split("_", 1)
        return _number(lo, path), _number(hi, path)
    return None, _number(spec, path)


def from_verl_keys(section: Mapping[str, Any], path: str) -> dict[str, Any]:
    """``section`` (a ``correction:`` section) with verl 0.9.1's keys replaced by the :class:`CorrectionSpec` fields
    they mean (the inverse of :func:`verl_keys`); other keys are left for the caller. A verl option our spec cannot
    express (k2, ``seq_sum_k3``, ``seq_max_*``, ``token_k3``) and a key verl removed are errors naming the fix."""
    for key, fix in REMOVED_KEYS.items():
        if key in section:
            raise ConfigError(f"{path}.{key}: verl removed this key in 0.7.1 (#4544); {fix}")
    if not any(key in section for key in VERL_KEYS):
        return dict(section)
    out: dict[str, Any] = {}
    level = section.get("rollout_is")
    if level is not None:
        if level not in ("token", "sequence"):
            raise ConfigError(f"{path}.rollout_is: expected token, sequence or null (verl 0.9.1), got {brief(level)}")
        lo, hi = _pair(section.get("rollout_is_threshold", 2.0), f"{path}.rollout_is_threshold")
        out.update(is_level=level, is_high=hi, is_mode="truncate" if lo is None else "mask")
        if lo is not None:
            out["is_low"] = lo
    if section.get("rollout_is_batch_normalize") is not None:
        out["batch_normalize"] = section["rollout_is_batch_normalize"]
    rs = section.get("rollout_rs")
    if rs is not None:
        options = [o.strip() for o in str(rs).split(",") if o.strip()]
        raw = section.get("rollout_rs_threshold")
        if raw is None:
            raise ConfigError(f"{path}.rollout_rs_threshold: required with rollout_rs (verl raises without it)")
        specs = [s.strip() for s in str(raw).split(",")] if isinstance(raw, str) else [raw]
        if len(specs) not in (1, len(options)):
            raise ConfigError(f"{path}.rollout_rs_threshold: give one threshold or one per rollout_rs option "
                              f"({len(options)}), got {brief(raw)}")
        for option, spec in zip(options, specs * len(options) if len(specs) == 1 else specs):
            where = f"{path}.rollout_rs_threshold ({option})"
            if option in _RS_LEVEL and "rs_level" not in out:
                lo, hi = _pair(spec, where)  # a k1 threshold without '_' is hi, with lo = 1 / hi (as verl reads it)
                out.update(rs_level=_RS_LEVEL[option], rs_low=1.0 / hi, rs_high=hi if lo is None else 1.0 / lo)
            elif option == K3_OPTION and "rs_k3_max" not in out:
                out["rs_k3_max"] = _pair(spec, where)[1]
            else:
                raise ConfigError(
                    f"{path}.rollout_rs: option {option!r} has no mismatch_ctrl equivalent (ours: one of "
                    f"{', '.join(_RS_LEVEL)} and {K3_OPTION}, each once); set it in verl's own "
                    "algorithm.rollout_correction instead, or use one of our presets")
    for field in out:
        if field in section:
            given = ", ".join(k for k in VERL_KEYS if k in section)
            raise ConfigError(f"{path}.{field}: given with verl's keys ({given}) that set it too; use one vocabulary")
    return {**{k: v for k, v in section.items() if k not in VERL_KEYS}, **out}


PRESET_KEYS: dict[str, dict[str, Any] | None] = {name: verl_keys(spec) for name, spec in PRESETS.items()}
"""Our preset -> verl 0.9.1's ``rollout_correction`` values (None: verl cannot express it; mismatch_ctrl runs it on
verl's driver). Computed by :func:`verl_keys`, so the table and the rule cannot disagree."""

NEAREST = {
    "geo_mis": "rollout_rs=seq_mean_k1 with the same band (verl has no veto)",
    "geo_rs_token_tis": "rollout_is=token, rollout_is_threshold=2.0, rollout_rs=seq_mean_k1 with the same band "
                        "(verl has no veto)",
    "seq_mis": "rollout_is=sequence with a lower bound above 0 (verl refuses 0)",
}
"""For each preset verl cannot express, its nearest verl setting (docs/verl.md)."""
