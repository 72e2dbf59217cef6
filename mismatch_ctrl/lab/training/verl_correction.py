"""verl 0.9.1's own rollout correction beside ours on one lab rollout: how far verl's result lies from ours.

For a correction preset verl computes natively (its row of :data:`~mismatch_ctrl.verl_vocabulary.PRESET_KEYS`, the
adapter's :func:`~mismatch_ctrl.verl.checks.correction_keys`), the lab through verl trains with our correction (the
slime hook, as every lab run does) and, on each rollout's batch, also calls verl's
``compute_rollout_correction_and_rejection_mask`` (``verl/trainer/ppo/rollout_corr_helper.py:786-901``, what verl's
driver runs in ``_compute_advantage`` through ``compute_rollout_correction_and_add_to_batch``, ``:1013-1067``) with
the preset's keys, on the same old and rollout log-probs and response mask, right-padded as verl holds them. Ours is
:func:`~mismatch_ctrl.correction.apply_correction` of the same spec on the same tokens (the core the slime hook and
the verl adapter call). Per rollout, with ``w`` a token's weight (verl: ``rollout_is_weights``, 1 without IS; ours:
the correction's weights) and "kept" a token in the mask after rejection (verl: its ``response_mask``):

- ``correction_gap/weight_abs_max``: ``max |w_verl - w_ours|`` over the tokens both keep (0 if none);
- ``correction_gap/weight_rel_max``: ``max |w_verl - w_ours| / max(|w_verl|, |w_ours|)`` there (0 where both are 0);
- ``correction_gap/keep_differs``: the tokens one side keeps and the other drops, ``correction_gap/kept_by_verl_only``
  those verl keeps (IcePop: verl keeps an out-of-band token in ``response_mask`` at weight 0, ours drops it);
- ``correction_gap/tokens``: the response tokens compared;
- ``rollout_corr/<name>``: verl's own metrics of that call, named as verl's logger names them, beside
  ``correction/<name>``: ours over the same batch (the names of metrics.md's TIS table).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from torch import Tensor
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

from ...batch import Segments, TokenBatch
from ...config import build_config
from ...correction import CorrectionSpec, apply_correction
from ...presets import PRESETS
from ...verl.checks import correction_keys
from ...verl_vocabulary import NEAREST, PRESET_KEYS

GAP = "correction_gap/"
OURS = "correction/"


def native_correction(section: Mapping[str, Any], num_experts: int) -> tuple[CorrectionSpec, dict[str, Any]] | None:
    """The correction of a lab method's ``section`` and verl 0.9.1's ``rollout_correction`` keys for it (the adapter's
    one table), or None without a correction. ValueError naming the preset when verl cannot express it."""
    config = build_config(dict(section), num_experts=num_experts)
    if not config.correction.active:
        return None
    keys = correction_keys(config)
    if keys is None:
        native = ", ".join(name for name, row in PRESET_KEYS.items() if row is not None and PRESETS[name].active)
        nearest = NEAREST.get(config.correction_preset, "none")
        raise ValueError(f"correction {config.correction_preset!r} has no verl 0.9.1 equivalent (nearest: {nearest}), "
                         "so there is no verl result to compare with; the lab through verl compares the presets verl "
                         f"computes natively: {native}")
    return config.correction, keys


def _padded(flat: Tensor, sizes: list[int]) -> Tensor:
    """A flat ``[T]`` tensor as right-padded ``[B, max(sizes)]`` rows (0 in the padding), verl's padded layout."""
    return torch.nn.utils.rnn.pad_sequence(list(torch.split(flat, sizes)), batch_first=True)


def correction_gap(spec: CorrectionSpec, keys: Mapping[str, Any], sizes: Sequence[int], old_log_probs: Tensor,
                   rollout_log_probs: Tensor, mask: Tensor, nonfinite: str = "mask") -> dict[str, float]:
    """verl's correction (``keys``) against ours (``spec``) on one batch of flat ``[T]`` tokens, sequence ``i`` owning
    ``sizes[i]`` of them: the module docstring's metrics."""
    sizes = [int(n) for n in sizes]
    old, rollout = old_log_probs.float(), rollout_log_probs.float()
    ours = apply_correction(spec, TokenBatch.build(Segments(sizes, old.device), old, rollout, mask, nonfinite))
    weights, verl_mask, verl_metrics = compute_rollout_correction_and_rejection_mask(
        old_log_prob=_padded(old, sizes), rollout_log_prob=_padded(rollout, sizes),
        response_mask=_padded(mask.long(), sizes), **keys)
    lengths = torch.tensor(sizes, device=old.device)
    tokens = torch.arange(max(sizes), device=old.device)[None, :] < lengths[:, None]
    verl_kept = verl_mask[tokens] != 0
    verl_w = weights.batch["rollout_is_weights"][tokens] if weights is not None else torch.ones_like(old)
    ours_kept = ours.mask != 0
    both = verl_kept & ours_kept
    diff = (verl_w - ours.weights.to(verl_w.dtype)).abs()[both]
    scale = torch.maximum(verl_w.abs(), ours.weights.to(verl_w.dtype).abs())[both]
    relative = torch.where(scale > 0, diff / scale.clamp_min(torch.finfo(scale.dtype).tiny), torch.zeros_like(diff))
    out = {GAP + "weight_abs_max": float(diff.max()) if diff.numel() else 0.0,
           GAP + "weight_rel_max": float(relative.max()) if relative.numel() else 0.0,
           GAP + "keep_differs": float((verl_kept != ours_kept).sum()),
           GAP + "kept_by_verl_only": float((verl_kept & ~ours_kept).sum()),
           GAP + "tokens": float(mask.numel())}
    out.update({name: float(value) for name, value in verl_metrics.items()})
    out.update({OURS + name: float(value) for name, value in ours.metrics.summary.items()})
    return out


def gap_report(rows: list[dict], method: str) -> str:
    """verl's correction against ours, as a lab run through verl logged it (its ``metrics.jsonl`` records): one line
    per rollout, the largest gaps over the run, and the mean over the rollouts of verl's ``rollout_corr/*`` and our
    ``correction/*`` metrics."""
    gap = GAP
    lines = [f"\ncorrection {method}: verl 0.9.1's own against ours (tokens both keep; keep/drop decisions)",
             f"{'rollout':>7} {'tokens':>7} {'|dw| max':>10} {'rel max':>10} {'keep differs':>13} {'verl only':>10}"]
    for row in rows:
        lines.append(f"{row['step']:>7} {row[gap + 'tokens']:>7.0f} {row[gap + 'weight_abs_max']:>10.3g} "
                     f"{row[gap + 'weight_rel_max']:>10.3g} {row[gap + 'keep_differs']:>13.0f} "
                     f"{row[gap + 'kept_by_verl_only']:>10.0f}")
    differs = sum(row[gap + "keep_differs"] for row in rows)
    tokens = sum(row[gap + "tokens"] for row in rows)
    lines.append(f"over {len(rows)} rollouts: weights differ by at most "
                 f"{max(row[gap + 'weight_abs_max'] for row in rows):.3g} (relative "
                 f"{max(row[gap + 'weight_rel_max'] for row in rows):.3g}) at the tokens both keep; the keep/drop "
                 f"decision differs at {differs:.0f} of {tokens:.0f} tokens "
                 f"({sum(row[gap + 'kept_by_verl_only'] for row in rows):.0f} kept by verl only)")
    for title, prefix in (("verl's rollout_corr/* (mean over rollouts)", "rollout_corr/"),
                          ("ours, correction/* over the same batches (mean over rollouts)", OURS)):
        lines.append(title)
        names = sorted(key for key in rows[0] if key.startswith(prefix))
        lines += [f"  {name:<48} {sum(float(r[name]) for r in rows) / len(rows):.6g}" for name in names]
    return "\n".join(lines)

