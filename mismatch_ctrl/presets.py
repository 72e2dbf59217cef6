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
"""

from __future__ import annotations

from .correction import CorrectionSpec

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
    # slime examples/train_infer_mismatch_helper/mis.yaml
    "mis_level": "is_level",
    "mis_mode": "is_mode",
    "mis_lower_bound": "is_low",
    "mis_upper_bound": "is_high",
    "mis_veto_threshold": "veto",
    # verl algorithm.rollout_correction
    "rollout_is": "is_level",
    "rollout_is_threshold": "is_high",
    "rollout_is_batch_normalize": "batch_normalize",
    "rollout_rs": "rs_level",
    "rollout_rs_threshold": "rs_high",
    "rollout_rs_threshold_lower": "rs_low",
    "rollout_token_veto_threshold": "veto",
}
"""Correction-section keys accepted under the names of slime's mis.yaml and verl's rollout_correction."""


def canonical_preset(name: str) -> str:
    """The canonical preset name for ``name`` or an alias; raises ``KeyError`` if unknown."""
    name = PRESET_ALIASES.get(name, name)
    if name not in PRESETS:
        raise KeyError(name)
    return name
