"""slime's current rollout-correction keys (examples/train_infer_mismatch_helper/mis.yaml at slime 624b824a) configure
the correction slime's mis.py applies; the older mis_* keys still work.

The expectations restate compute_mis_weights in words: truncate ignores the lower bound; a null RS bound takes the TIS
bound (lower: tis_lower_bound, else 1 / tis_upper_bound); the veto lives in the RS stage; use_tis: false returns
before any weighting or rejection.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch

from mismatch_ctrl.batch import TokenBatch
from mismatch_ctrl.config import build_config, load_config
from mismatch_ctrl.correction import CorrectionSpec, apply_correction
from mismatch_ctrl.errors import ConfigError
from mismatch_ctrl.presets import PRESETS

# The keys and values of slime's examples/train_infer_mismatch_helper/mis.yaml at 624b824a (comments dropped).
SLIME_MIS_YAML = """\
mismatch_ctrl:
  name: slime_mis_example
  correction:
    use_tis: true
    use_rs: true
    tis_level: "token"
    rs_level: "token"
    tis_mode: "truncate"
    tis_lower_bound: 0.5
    tis_upper_bound: 2.0
    rs_lower_bound: null
    rs_upper_bound: null
    rs_veto_threshold: 1.0e-4
    tis_batch_normalize: true
"""
EXAMPLE = dict(use_tis=True, use_rs=True, tis_level="token", rs_level="token", tis_mode="truncate",
               tis_lower_bound=0.5, tis_upper_bound=2.0, rs_lower_bound=None, rs_upper_bound=None,
               rs_veto_threshold=1.0e-4, tis_batch_normalize=True)


def correction(section: dict) -> CorrectionSpec:
    return build_config({"correction": section}).correction


def test_slimes_example_file_loads_as_token_tis_plus_token_rs_and_veto(tmp_path) -> None:
    path = tmp_path / "mis.yaml"
    path.write_text(SLIME_MIS_YAML)
    loaded = load_config(path)
    # token TIS truncated at 2, then reject tokens outside [0.5, 2] (the TIS bounds), veto 1e-4, batch-normalised.
    expected = replace(PRESETS["token_tis"], rs_level="token", rs_low=0.5, rs_high=2.0, veto=1.0e-4,
                       batch_normalize=True)
    assert loaded.correction == expected
    assert loaded.correction_preset == "none"


@pytest.mark.parametrize("changes, preset", [
    (dict(use_rs=False, tis_batch_normalize=False), "token_tis"),  # slime's --use-tis vanilla weight
    (dict(use_rs=False, tis_mode="mask", tis_batch_normalize=False), "token_mis"),  # IcePop [0.5, 2]
    (dict(use_rs=False, tis_mode="mask", tis_level="sequence", tis_lower_bound=0.0, tis_batch_normalize=False),
     "seq_mis"),
    (dict(use_rs=False, tis_level="sequence", tis_lower_bound=None, tis_batch_normalize=False), "seq_tis"),
    (dict(rs_level="geometric", rs_lower_bound=0.999, rs_upper_bound=1.001, tis_batch_normalize=False),
     "geo_rs_token_tis"),
    (dict(use_tis=False), "none"),  # slime returns before weighting and rejection: use_rs is ignored
])
def test_slime_keys_give_the_equivalent_preset(changes: dict, preset: str) -> None:
    assert correction({**EXAMPLE, **changes}) == PRESETS[preset]


def test_bounds_defaults_follow_mis_py() -> None:
    # Null lower TIS bound: 1 / upper, for clip mode and for the RS band (even in truncate mode).
    spec = correction({**EXAMPLE, "tis_lower_bound": None, "tis_upper_bound": 4.0})
    assert (spec.is_low, spec.rs_low, spec.rs_high) == (None, 0.25, 4.0)
    clip = correction({**EXAMPLE, "tis_mode": "clip", "tis_lower_bound": None, "tis_upper_bound": 4.0})
    assert clip.is_bounds == (0.25, 4.0)
    explicit = correction({**EXAMPLE, "rs_lower_bound": 0.8, "rs_upper_bound": 1.25, "rs_level": "sequence"})
    assert (explicit.rs_level, explicit.rs_low, explicit.rs_high) == ("sequence", 0.8, 1.25)
    # use_rs: false drops the veto with the RS stage.
    assert correction({**EXAMPLE, "use_rs": False}).veto is None
    assert correction({**EXAMPLE, "rs_veto_threshold": "1e-3"}).veto == 1e-3  # PyYAML's string for 1e-3


@pytest.mark.parametrize("section, fragment", [
    ({"tis_level": "token"}, "correction.use_tis: slime's mis.py reads it"),
    ({**EXAMPLE, "use_rs": None}, "correction.use_rs: slime's mis.py reads it when use_tis is true"),
    ({**EXAMPLE, "tis_mode": "cap"}, "correction.tis_mode: expected one of truncate, clip, mask, got 'cap'"),
    ({**EXAMPLE, "rs_level": None}, "correction.rs_level: slime's mis.py reads it when use_rs is true"),
    ({**EXAMPLE, "use_tis": "yes"}, "correction.use_tis: expected true/false, got 'yes'"),
    ({**EXAMPLE, "tis_upper_bound": 0}, "correction.tis_upper_bound: must be > 0"),
    ({**EXAMPLE, "rs_veto_threshold": "often"}, "correction.rs_veto_threshold: expected a finite number or null"),
    ({**EXAMPLE, "preset": "geo_mis"}, "mixes slime's mis.yaml keys"),
    ({**EXAMPLE, "mis_level": "token"}, "mixes slime's mis.yaml keys"),
    ({**EXAMPLE, "tis_modes": "mask"}, "correction.tis_modes: unknown key; did you mean 'tis_mode'?"),
])
def test_bad_slime_keys_name_the_key(section: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(").replace("?", r"\?")):
        correction(section)


@pytest.mark.parametrize("changes, key, fragments", [
    (dict(use_rs=False, tis_upper_bound=0.5), "tis_upper_bound",
     ["need the lower bound <= 1 <= tis_upper_bound", "got 0, 0.5", "e.g. tis_upper_bound: 2.0"]),
    (dict(use_rs=False, tis_mode="clip", tis_lower_bound=None, tis_upper_bound=0.5),
     "tis_lower_bound (null: 1 / tis_upper_bound)", ["need 0 <= tis_lower_bound < tis_upper_bound, got 2.0, 0.5"]),
    (dict(use_rs=False, tis_mode="clip", tis_lower_bound=1.5), "tis_lower_bound", ["got 1.5, 2"]),
    (dict(tis_mode="clip", tis_lower_bound=1.5), "rs_lower_bound (null: tis_lower_bound)",
     ["need rs_lower_bound < 1 < rs_upper_bound", "e.g. rs_lower_bound: 0.999, rs_upper_bound: 1.001"]),
    (dict(rs_lower_bound=3.0), "rs_lower_bound", ["need rs_lower_bound < rs_upper_bound, got 3.0, 2.0"]),
    (dict(tis_lower_bound=None, tis_upper_bound=1e-4), "rs_lower_bound (null: 1 / tis_upper_bound)",
     ["need rs_lower_bound < rs_upper_bound, got 10000.0, 0.0001"]),
    (dict(rs_upper_bound=0.9), "rs_upper_bound", ["got rs_upper_bound=0.9"]),
    (dict(rs_veto_threshold=2.0), "rs_veto_threshold", ["must be in (0, 1) or null"]),
])
def test_a_bad_value_in_slimes_vocabulary_is_named_in_it(changes: dict, key: str, fragments: list[str]) -> None:
    """Bounds that pass the type checks but make no correction: the error names the key the file has (or the one the
    value was defaulted from) and a fix in slime's vocabulary, never our own field names."""
    with pytest.raises(ConfigError) as err:
        correction({**EXAMPLE, **changes})
    message = str(err.value)
    assert message.startswith(f"mismatch_ctrl.correction.{key}: "), message
    assert all(fragment in message for fragment in fragments), message
    assert not re.search(r"\b(is_low|is_high|rs_low|rs_high|veto|is_level|is_mode)\b", message), message


def test_rs_level_alone_is_our_own_key() -> None:
    """rs_level belongs to both vocabularies; without another slime key it is CorrectionSpec's (no use_tis needed)."""
    spec = correction({"rs_level": "geometric", "rs_low": 0.999, "rs_high": 1.001, "veto": 1.0e-4})
    assert spec == PRESETS["geo_mis"]
    with pytest.raises(ConfigError, match="mixes slime's mis.yaml keys .* with rs_low"):
        correction({**EXAMPLE, "rs_low": 0.9})


def test_old_mis_keys_still_work() -> None:
    spec = correction({"mis_level": "sequence", "mis_mode": "mask", "mis_lower_bound": 0.0, "mis_upper_bound": 2.0})
    assert spec == PRESETS["seq_mis"]


def slime_mis_reference(train: list[torch.Tensor], rollout: list[torch.Tensor], masks: list[torch.Tensor],
                        keys: dict) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """compute_mis_weights of slime's mis.py, written out per sequence: (weights, modified masks). Independent of
    mismatch_ctrl's vectorised code."""
    low = keys["tis_lower_bound"] if keys["tis_lower_bound"] is not None else 1.0 / keys["tis_upper_bound"]
    rs_low = keys["rs_lower_bound"] if keys["rs_lower_bound"] is not None else low
    rs_high = keys["rs_upper_bound"] if keys["rs_upper_bound"] is not None else keys["tis_upper_bound"]

    def level_log_ratio(diff: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
        if level == "token":
            return diff
        total = (diff * mask).sum()
        return (total if level == "sequence" else total / mask.sum().clamp_min(1)).expand_as(diff)

    weights_out, masks_out = [], []
    for t, r, m in zip(train, rollout, masks):
        diff, keep = t - r, m.clone()
        w = level_log_ratio(diff, m, keys["tis_level"]).clamp(-20, 20).exp()
        if keys["tis_mode"] == "truncate":
            w = w.clamp(0, keys["tis_upper_bound"]) * m
        elif keys["tis_mode"] == "clip":
            w = w.clamp(low, keys["tis_upper_bound"]) * m
        else:
            keep = keep * ((w >= low) & (w <= keys["tis_upper_bound"])).float()
            w = w * m
        if keys["use_rs"]:
            rs = level_log_ratio(diff, m, keys["rs_level"]).clamp(-20, 20).exp()
            keep = keep * ((rs >= rs_low) & (rs <= rs_high)).float()
            if keys["rs_veto_threshold"] is not None and bool(((diff < torch.log(torch.tensor(
                    keys["rs_veto_threshold"]))) & m.bool()).any()):
                keep = torch.zeros_like(keep)
        weights_out.append(w)
        masks_out.append(keep)
    if keys["tis_batch_normalize"]:  # mean 1 over the trained tokens (token) or the sequences, before rejection
        if keys["tis_level"] == "token":
            mean = sum((w * m).sum() for w, m in zip(weights_out, masks)) / sum(m.sum() for m in masks)
        else:
            mean = sum((w * m).sum() / m.sum() for w, m in zip(weights_out, masks)) / len(masks)
        weights_out = [w / mean for w in weights_out]
    return weights_out, masks_out


@pytest.mark.parametrize("changes", [
    dict(),
    dict(tis_mode="mask", rs_level="sequence", rs_lower_bound=0.5, rs_upper_bound=3.0),
    dict(tis_level="sequence", tis_mode="clip", rs_level="geometric", rs_lower_bound=0.8, rs_upper_bound=1.25),
    dict(tis_batch_normalize=False),
    dict(tis_batch_normalize=False, tis_mode="mask", rs_level="sequence", rs_lower_bound=0.5, rs_upper_bound=3.0),
    dict(tis_batch_normalize=False, tis_level="geometric", tis_mode="clip", tis_lower_bound=None,
         tis_upper_bound=1.2, rs_level="geometric", rs_veto_threshold=0.05),
    dict(tis_batch_normalize=False, use_rs=False, tis_level="sequence", tis_upper_bound=3.0),
])
def test_the_translated_spec_corrects_like_slimes_mis_py(changes: dict) -> None:
    keys = {**EXAMPLE, **changes}
    gen = torch.Generator().manual_seed(7)
    lengths = [5, 1, 9, 4, 7, 3, 12, 6, 2, 8]
    rollout = [-torch.rand(n, generator=gen, dtype=torch.float32) * 3 for n in lengths]
    # Log-probabilities stay below 0 (TokenBatch rejects a probability above 1).
    train = [(r + torch.randn(n, generator=gen, dtype=torch.float32) * 0.8).clamp(max=-1e-3)
             for r, n in zip(rollout, lengths)]
    masks = [(torch.rand(n, generator=gen) > 0.2).float() for n in lengths]
    masks[1] = torch.ones(1)
    want_weights, want_masks = slime_mis_reference(train, rollout, masks, keys)

    batch = TokenBatch.from_lists(train, rollout, masks)
    got = apply_correction(correction(keys), batch)
    kept = torch.cat(want_masks)
    assert 0 < kept.sum() < torch.cat(masks).sum() or not keys["use_rs"]  # the case rejects some tokens, not all
    assert torch.equal(got.mask, kept)
    # slime keeps the weight of a rejected token but masks it out of the loss; compare where the loss sees it.
    assert torch.allclose(got.weights * kept, torch.cat(want_weights) * kept)
