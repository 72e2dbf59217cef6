"""The adapter's state on verl's driver: the validated config, the controllers, and one step of them over verl's
batch. No verl import: the trainer (:mod:`mismatch_ctrl.verl.trainer`) hands it plain tensors.

verl keeps a step's data in TransferQueue as jagged tensors, one row per response (``response_mask``,
``old_log_probs``, ``rollout_log_probs``, ``advantages``: ``values()`` flat, ``offsets()`` per row), which is the
core's own layout: flat 1-D token tensors and per-sequence lengths. Rollout ``r`` of the controllers is verl's
training step ``r + 1`` (verl counts from 1), so schedules in rollouts (``T_d``, calibration) read as on slime.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from ..batch import Segments, TokenBatch
from ..config import ROOT_KEY, Config, load_config
from ..controllers import ControllerSet, restore
from ..correction import CorrectionSpec, apply_correction
from ..errors import ConfigError
from ..state import StateStore
from .checks import CONFIG_KEY, check_verl_config, correction_keys, get

log = logging.getLogger("mismatch_ctrl")

METRIC_PREFIX = "mismatch_ctrl/"
CORRECTION_PREFIX = "mismatch_ctrl/correction/"
STATE_DIR = "mismatch_ctrl"
"""The controller state of ``global_step_N`` lives in ``global_step_N/mismatch_ctrl/state_{N-1:07d}.json``."""


@dataclass
class StepOutput:
    """What one step changes in verl's batch (flat over the step's responses; None: leave verl's value) and the
    metrics to log (``mismatch_ctrl/<name>``, and ``mismatch_ctrl/correction/<name>`` when mismatch_ctrl corrects)."""

    advantages: torch.Tensor | None
    response_mask: torch.Tensor | None
    is_weights: torch.Tensor | None
    metrics: dict[str, float]

    def widened(self, tokens: torch.Tensor, advantages: torch.Tensor, trained_mask: torch.Tensor) -> StepOutput:
        """This output of the ``tokens`` (a boolean selector) of a larger batch, over the larger batch: verl's
        ``advantages`` and ``trained_mask`` elsewhere, weight 0 elsewhere."""
        def put(base: torch.Tensor, part: torch.Tensor | None) -> torch.Tensor | None:
            if part is None:
                return None
            out = base.to(part.dtype, copy=True)
            out[tokens] = part
            return out
        return StepOutput(put(advantages, self.advantages), put(trained_mask, self.response_mask),
                          put(torch.zeros_like(advantages), self.is_weights), self.metrics)


def read_config(cfg: Any) -> Config:
    """The method YAML named by ``mismatch_ctrl.config`` in verl's config, with the architecture defaults of the
    model's ``config.json`` (``actor_rollout_ref.model.path``), checked against verl's settings."""
    path = get(cfg, CONFIG_KEY)
    if not path:
        raise ConfigError(f"verl config has no {CONFIG_KEY}: add +{CONFIG_KEY}=configs/methods/dcgrpo.yaml (the "
                          "YAML with a top-level 'mismatch_ctrl:' key the slime hooks read)")
    model = get(cfg, "actor_rollout_ref.model.path")
    local = model if model and Path(str(model)).exists() else None
    try:
        config = load_config(str(path), hf_config=local)
    except ConfigError as exc:
        if local is None and str(exc).startswith(f"{ROOT_KEY}.architecture:"):
            raise ConfigError(f"{path}: the method's defaults depend on the architecture, and "
                              f"actor_rollout_ref.model.path={model!r} is no local model directory whose config.json "
                              f"tells it: set {ROOT_KEY}.architecture: dense or moe in the YAML") from None
        raise
    check_verl_config(cfg, config)
    return config


class VerlRuntime:
    """The controllers of one verl run and the correction mismatch_ctrl computes (when verl cannot)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.controllers = ControllerSet(config)
        self.core_correction: CorrectionSpec | None = \
            config.correction if config.correction.active and correction_keys(config) is None else None

    @property
    def lr_decay(self) -> bool:
        return self.controllers.lr is not None

    def lr_scale(self, global_step: int) -> float:
        """The LR factor for the update of verl's step ``global_step`` (1.0 without length decay)."""
        return self.controllers.lr_scale(global_step - 1)

    def step(self, global_step: int, sizes: Sequence[int], old_log_probs: torch.Tensor,
             rollout_log_probs: torch.Tensor, response_mask: torch.Tensor, advantages: torch.Tensor,
             trained_mask: torch.Tensor, max_response_length: int | None = None,
             samples: Sequence[bool] | None = None) -> StepOutput:
        """Advance the controllers by verl's step ``global_step`` over the whole batch.

        ``samples`` (one per response; None: all) says which responses are samples: verl pads a batch that its
        data-parallel and mini-batch sizes do not divide with synthetic one-token responses without trained tokens
        (``trainer/ppo/padding_utils.py:144-215``, tagged ``is_padding``), which must not count as sequences in
        ``C_bar``, the mean response length or the mismatch metrics; their outputs stay verl's (weight 0).

        ``response_mask`` is the mask before verl's rollout correction (the tokens both engines scored: ``C_bar`` is
        over them, as on slime); ``advantages`` and ``trained_mask`` are verl's after its correction and GRPO
        (``A_i`` is read at a sequence's trained tokens, where verl writes it; a sequence verl rejected whole has
        none and counts ``A_i = 0``). Returns ``A_i - penalty`` at the trained tokens (0 elsewhere) when DC-GRPO is
        on, and the weights and mask of a correction verl cannot express."""
        if samples is not None and not all(samples):
            device = old_log_probs.device
            tokens = torch.tensor([bool(s) for s in samples], device=device).repeat_interleave(
                torch.tensor(list(sizes), device=device))
            part = self.step(global_step, [n for n, s in zip(sizes, samples) if s], old_log_probs[tokens],
                             rollout_log_probs[tokens], response_mask[tokens], advantages[tokens], trained_mask[tokens],
                             max_response_length)
            return part.widened(tokens, advantages, trained_mask)
        segments = Segments(sizes, device=old_log_probs.device)
        batch = TokenBatch.build(segments, old_log_probs.float(), rollout_log_probs.float(), response_mask,
                                 self.config.nonfinite)
        trained = trained_mask.to(torch.float64)
        sums = segments.sum_rows(torch.stack([advantages.to(torch.float64) * trained, trained]))
        seq_advantages = (sums[:, 0] / sums[:, 1].clamp_min(1.0)).to(torch.float32)
        step = self.controllers.step(global_step - 1, seq_advantages, batch, [float(n) for n in sizes],
                                     max_response_length=max_response_length)
        metrics = {METRIC_PREFIX + name: value for name, value in step.metrics.items()}
        mask = weights = None
        keep = trained_mask.to(advantages.dtype)
        if self.core_correction is not None:
            correction = apply_correction(self.core_correction, batch)
            kept = correction.mask.to(keep.dtype) * (trained_mask != 0)
            keep, mask = kept, kept.to(response_mask.dtype)
            weights = correction.weights.to(advantages.dtype) if self.core_correction.is_level is not None else None
            metrics.update({CORRECTION_PREFIX + name: float(value) for name, value in
                            correction.metrics.summary.items()})
        shaped = None if step.advantages is None else step.advantages.to(advantages.dtype) * keep
        if shaped is None and mask is not None:
            shaped = advantages * keep
        return StepOutput(shaped, mask, weights, metrics)

    # --- state, written with each of verl's checkpoints ------------------------------------------------------

    def save(self, step_folder: str | Path, global_step: int) -> Path:
        """Write the controllers' state after ``global_step`` into ``{step_folder}/mismatch_ctrl/`` (atomic)."""
        return StateStore(Path(step_folder) / STATE_DIR, keep_last=1).save(global_step - 1,
                                                                           self.controllers.state_dict())

    def resume(self, step_folder: str | Path, global_step: int) -> None:
        """Restore the state saved with verl's checkpoint ``global_step_{global_step}`` (validated against the
        configuration as on slime; ``state.resume: fresh`` starts afresh with a warning instead of an error)."""
        rollout = global_step - 1
        self.controllers = restore(self.config, StateStore(Path(step_folder) / STATE_DIR), rollout,
                                   f"verl's step {global_step} (rollout {rollout})")
        if self.controllers.last_rollout is not None:
            log.info("mismatch_ctrl: restored controller state of verl step %d from %s", global_step, step_folder)
