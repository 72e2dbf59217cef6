"""Named rollout-correction presets (ALGORITHMS.md section 3) and the aliases users know from slime and verl.

=====================  ==========================================================================================
preset                 expands to
=====================  ==========================================================================================
``none``               metrics only
``token_tis``          token IS, truncate at 2
``token_mis``          token IS, mask to [0.5, 2] (= slime's ``icepop``)
``seq_tis``            sequence IS, truncate at 2
``seq_mis``            sequence IS, mask to [0, 2]
``geo_mis``            geometric rejection outside [0.999, 1.001] + veto 1e-4 (Geo-RS [003]; verl's
                       ``decoupled_geo_rs``). No IS weight: inside the band the geometric ratio is 1 within 0.1%.
``geo_rs_token_tis``   the ``geo_mis`` filter, then token IS truncated at 2
``k3_rs``              reject a sequence whose mean K3 exceeds 0.01
=====================  ==========================================================================================

The correction section also takes the keys of the pinned slime's ``examples/train_infer_mismatch_helper/mis.yaml``
(:func:`from_slime_mis`), the older ``mis_*`` names (:data:`FIELD_ALIASES`) and verl 0.9.1's ``rollout_*`` keys
(:mod:`mismatch_ctrl.verl_vocabulary`).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from .correction import LEVELS, MODES, CorrectionSpec
from .errors import ConfigError
from .formatting import brief

_GEO_RS = dict(rs_level="geometric", rs_low=0.999, rs_high=1.001, veto=1.0e-4)

PRESETS: dict[str, CorrectionSpec] = {
    "none": CorrectionSpec(),
    "token_tis": CorrectionSpec(is_level="token", is_mode="truncate", is_high=2.0),
    "token_mis": CorrectionSpec(is_level="token", is_mode="mask", is_low=0.5, is_high=2.0),
    "seq_tis": CorrectionSpec(is_level="sequence", is_mode="truncate", is_high=2.0),
    "seq_mis": CorrectionSpec(is_level="sequence", is_mode="mask", is_low=0.0, is_high=2.0),
    "geo_mis": CorrectionSpec(**_GEO_RS),
    "geo_rs_token_tis": CorrectionSpec(is_level="token", is_mode="truncate", is_high=2.0, **_GEO_RS),
    "k3_rs": CorrectionSpec(rs_k3_max=0.01),
}

PRESET_ALIASES: dict[str, str] = {
    "icepop": "token_mis",
    "geo_rs": "geo_mis",
    "decoupled_token_is": "token_tis",
    "decoupled_seq_is": "seq_tis",
    "decoupled_geo_rs": "geo_mis",
    "disabled": "none",
}

FIELD_ALIASES: dict[str, str] = {
    # older slime examples/train_infer_mismatch_helper/mis.yaml
    "mis_level": "is_level",
    "mis_mode": "is_mode",
    "mis_lower_bound": "is_low",
    "mis_upper_bound": "is_high",
    "mis_veto_threshold": "veto",
}
"""Correction-section keys accepted under the names of slime's older mis.yaml. verl 0.9.1's ``rollout_*`` keys
mean values, not just names (a ``"lo_hi"`` threshold, ``seq_mean_k3``): :func:`mismatch_ctrl.verl_vocabulary.
from_verl_keys` translates them."""


def canonical_preset(name: str) -> str:
    """The canonical preset name for ``name`` or an alias; raises ``KeyError`` if unknown."""
    name = PRESET_ALIASES.get(name, name)
    if name not in PRESETS:
        raise KeyError(name)
    return name


SLIME_MIS_KEYS = ("use_tis", "use_rs", "tis_level", "rs_level", "tis_mode", "tis_lower_bound", "tis_upper_bound",
                  "rs_lower_bound", "rs_upper_bound", "rs_veto_threshold", "tis_batch_normalize")
"""The keys of ``examples/train_infer_mismatch_helper/mis.yaml`` in slime 624b824a. ``rs_level`` is one of our own
:class:`CorrectionSpec` keys too (same meaning): a section is read in slime's vocabulary when it has any other."""

_CANONICAL_KEYS = frozenset(CorrectionSpec.__dataclass_fields__).union(FIELD_ALIASES).difference(SLIME_MIS_KEYS)


def from_slime_mis(section: Mapping[str, Any], path: str) -> tuple[dict[str, Any], dict[str, str]]:
    """``section`` with the :data:`SLIME_MIS_KEYS` replaced by the :class:`CorrectionSpec` fields of the correction
    slime's ``mis.py`` (``compute_mis_weights``, slime 624b824a) applies for them; and, so that a problem with a value
    is named as the file writes it, the key each field came from (``{field: key}``, with the key's default where the
    value was defaulted, e.g. ``rs_lower_bound (null: tis_lower_bound)``; empty for a section in our vocabulary).

    What ``compute_mis_weights`` does, and so what this configures:

    - ``use_tis: false``: metrics only. slime returns before any weighting *and before rejection*, so ``use_rs`` and
      every bound are ignored too: the result is preset ``none``.
    - ``use_tis: true``: IS weights at ``tis_level`` with ``tis_mode``: ``truncate`` ``min(rho, tis_upper_bound)``
      (``tis_lower_bound`` unused), ``clip`` / ``mask`` within ``[tis_lower_bound, tis_upper_bound]``, the lower
      bound defaulting to ``1 / tis_upper_bound`` (our ``is_low`` default too).
    - ``use_rs: true`` (read only with ``use_tis``): reject at ``rs_level`` outside ``[rs_lower_bound,
      rs_upper_bound]``; a null bound takes the TIS bound (lower: ``tis_lower_bound``, else ``1 / tis_upper_bound``,
      also in truncate mode). ``rs_veto_threshold`` vetoes a sequence with any token ratio below it; slime applies
      the veto only inside the RS stage, so ``use_rs: false`` drops it.
    - ``tis_batch_normalize``: weights rescaled to mean 1 over the batch (slime raises for the geometric level; we
      normalise over sequences there).

    slime reads these keys as attributes without defaults, so the ones the flags switch on are required here:
    ``use_tis``; with it ``use_rs``, ``tis_level``, ``tis_mode``, ``tis_upper_bound``; with ``use_rs`` also
    ``rs_level``. Bounds and the veto may be null; ``tis_batch_normalize`` defaults to false. Mixing these keys with
    a preset or with the canonical / aliased keys is an error (one vocabulary per file); other keys are left for the
    caller's unknown-key check.
    """
    if not any(key in section for key in SLIME_MIS_KEYS if key != "rs_level"):
        return dict(section), {}
    given = {key: section[key] for key in SLIME_MIS_KEYS if key in section}
    rest = {key: value for key, value in section.items() if key not in given}
    mixed = sorted(key for key in rest
                   if key in _CANONICAL_KEYS or (key == "preset" and rest[key] not in (None, "none")))
    if mixed:
        raise ConfigError(f"{path}: mixes slime's mis.yaml keys ({', '.join(given)}) with {', '.join(mixed)}; "
                          "use one vocabulary: either slime's keys alone or preset/is_*/rs_* keys")
    keys = _SlimeKeys(given, path)
    if not keys.flag("use_tis", "first (false: metrics only)"):
        return rest, {}
    use_rs = keys.flag("use_rs", "when use_tis is true")
    mode = keys.choice("tis_mode", MODES, "when use_tis is true")
    tis_high = keys.number("tis_upper_bound", "when use_tis is true")
    if not tis_high > 0:
        raise ConfigError(f"{path}.tis_upper_bound: must be > 0, got {tis_high}")
    tis_low = keys.number("tis_lower_bound")
    low_default = ("tis_lower_bound", tis_low) if tis_low is not None else ("1 / tis_upper_bound", 1.0 / tis_high)
    fields: dict[str, Any] = {
        "is_level": keys.choice("tis_level", LEVELS, "when use_tis is true"),
        "is_mode": mode,
        "is_high": tis_high,
        "is_low": None if mode == "truncate" else tis_low,
        "batch_normalize": keys.flag("tis_batch_normalize", default=False),
    }
    names = {"is_level": "tis_level", "is_mode": "tis_mode", "is_high": "tis_upper_bound",
             "is_low": "the lower bound (0 in truncate mode)" if mode == "truncate" else
             "tis_lower_bound" if tis_low is not None else "tis_lower_bound (null: 1 / tis_upper_bound)",
             "batch_normalize": "tis_batch_normalize"}
    if use_rs:
        fields.update(rs_level=keys.choice("rs_level", LEVELS, "when use_rs is true"),
                      veto=keys.number("rs_veto_threshold"))
        names.update(rs_level="rs_level", veto="rs_veto_threshold")
        for field, key, (default_name, default) in (("rs_low", "rs_lower_bound", low_default),
                                                    ("rs_high", "rs_upper_bound", ("tis_upper_bound", tis_high))):
            given = keys.number(key)
            fields[field] = given if given is not None else default
            names[field] = key if given is not None else f"{key} (null: {default_name})"
    return {**rest, **fields}, names


class _SlimeKeys:
    """Typed reads of slime's mis.yaml keys; errors name the key as the user wrote it."""

    def __init__(self, given: Mapping[str, Any], path: str):
        self.given, self.path = given, path

    def _required(self, key: str, why: str) -> Any:
        if self.given.get(key) is None:
            raise ConfigError(f"{self.path}.{key}: slime's mis.py reads it {why}; set it (see slime's "
                              "examples/train_infer_mismatch_helper/mis.yaml)")
        return self.given[key]

    def flag(self, key: str, why: str = "", default: bool | None = None) -> bool:
        value = self.given.get(key, default) if default is not None else self._required(key, why)
        if not isinstance(value, bool):
            raise ConfigError(f"{self.path}.{key}: expected true/false, got {brief(value)}")
        return value

    def choice(self, key: str, options: tuple[str, ...], why: str) -> str:
        value = self._required(key, why)
        if value not in options:
            raise ConfigError(f"{self.path}.{key}: expected one of {', '.join(options)}, got {brief(value)}")
        return value

    def number(self, key: str, why: str = "") -> float | None:
        """A finite float (``1e-4`` strings accepted); null allowed unless ``why`` makes the key required."""
        value = self._required(key, why) if why else self.given.get(key)
        if value is None:
            return None
        result = None
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            try:
                result = float(value)
            except ValueError:
                pass
        if result is None or not math.isfinite(result):
            raise ConfigError(f"{self.path}.{key}: expected a finite number or null, got {brief(value)}")
        return result
