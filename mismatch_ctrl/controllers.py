"""All stateful controllers of one configuration, advanced together once per rollout.

:meth:`ControllerSet.step` is the framework-free body of slime's advantage hook (ARCHITECTURE.md, data flow step 3):
mismatch metrics -> DC-GRPO shaping with the current lambda -> dual update -> surge detector and LR scale ->
ACRL band. The slime adapter, the CPU lab and ``mismatch-ctrl analyze`` all call it, so the three agree.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from .acrl import BandController, sequence_level_discrepancy
from .batch import TokenBatch
from .config import Config
from .correction import CorrectionSpec
from .dcgrpo import LagrangeController, shape_advantages
from .dist import Reducer, local_reduce
from .errors import StateError
from .lr_schedule import LengthTriggeredLR, SurgeDetector
from .metrics import mismatch_metrics


@dataclass(frozen=True)
class RolloutStep:
    """What one rollout produced: DC-GRPO-shaped token advantages (``[T]``; None when DC-GRPO is off, the
    baseline advantages stand) and the metrics to log."""

    advantages: torch.Tensor | None
    metrics: dict[str, float]


class ControllerSet:
    """DC-GRPO multiplier, LR-decay schedule and ACRL band (each only if enabled) and the response-length surge
    detector (always: an early warning of collapse for every method, and the source of ``period: auto``), with one
    state dict."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.dcgrpo = LagrangeController(config.dcgrpo) if config.dcgrpo.enabled else None
        self.surge = SurgeDetector(config.lr_decay.surge)
        self.lr = LengthTriggeredLR(config.lr_decay, self.surge) if config.lr_decay.enabled else None
        self.acrl = BandController(config.acrl) if config.acrl.enabled else None
        self.last_rollout: int | None = None

    def correction(self) -> CorrectionSpec:
        """The IS/RS settings for the training steps of the current rollout (ACRL supplies the token clip band)."""
        if self.acrl is None:
            return self.config.correction
        band = self.acrl.correction()
        return dataclasses.replace(self.config.correction, is_level=band.is_level, is_mode=band.is_mode,
                                   is_low=band.is_low, is_high=band.is_high)

    def lr_scale(self, rollout_id: int) -> float:
        """LR multiplier for the optimizer steps of ``rollout_id`` (1.0 without length decay)."""
        return self.lr.scale(rollout_id) if self.lr is not None else 1.0

    def step(
        self,
        rollout_id: int,
        seq_advantages: torch.Tensor | None,
        batch: TokenBatch | None,
        mean_response_length: float,
        max_response_length: float | None = None,
        seq_reduce: Reducer = local_reduce,
        batch_reduce: Reducer = local_reduce,
    ) -> RolloutStep:
        """Advance every controller by one rollout.

        ``seq_advantages`` are the per-sequence baseline advantages ``[N]`` (GRPO: the normalised rewards);
        ``batch`` holds both engines' log-probs (None if the training engine's are unavailable: only allowed when no
        enabled controller needs them); ``mean_response_length`` is the global mean over the rollout batch.
        Metrics: the section-6 mismatch metrics and ``discrepancy`` (``C_bar``) whenever ``batch`` is given; with
        DC-GRPO ``lambda`` (the multiplier that shaped this rollout), ``lambda_next``, ``eps`` (absent while
        ``eps: auto`` calibrates), ``violation``, ``eps_floor``, ``penalty_abs_mean``, ``penalty_share``; the LR scale
        and surge detector; the ACRL band.
        """
        if batch is None and self.config.needs_train_log_probs:
            raise ValueError("DC-GRPO and ACRL need the training engine's log-probs of this rollout")
        metrics: dict[str, Any] = {"mean_response_length": mean_response_length}
        shaped_advantages = None
        if batch is not None:
            metrics.update(mismatch_metrics(batch, seq_reduce).summarize(batch_reduce))
            ctrl = self.dcgrpo
            if ctrl is None:
                measured = shape_advantages(batch, None, self.config.dcgrpo, 0.0, 0.0, seq_reduce, batch_reduce)
                metrics["discrepancy"] = measured.discrepancy
            else:
                lam, eps, calibrating = ctrl.shaping_lambda, ctrl.eps, ctrl.calibrating
                shaped = shape_advantages(batch, seq_advantages, self.config.dcgrpo, lam, eps or 0.0, seq_reduce,
                                          batch_reduce)
                shaped_advantages = shaped.advantages
                ctrl.update(shaped.discrepancy)
                violation = None if eps is None or shaped.discrepancy is None else shaped.discrepancy - eps
                metrics.update({"lambda": lam}, lambda_next=ctrl.lam, eps=eps, eps_floor=ctrl.floor,
                               eps_calibrating=float(calibrating), discrepancy=shaped.discrepancy,
                               violation=violation, penalty_abs_mean=shaped.penalty_abs_mean,
                               penalty_share=shaped.penalty_share)
        surge = self.surge
        surge.update(rollout_id, mean_response_length, max_response_length)
        metrics.update(surge_ratio=surge.ratio, surge_baseline=surge.baseline, surge_threshold=surge.threshold,
                       surge_triggered=float(surge.triggered), surge_onset=surge.onset)
        if self.lr is not None:
            metrics["lr_period"] = self.lr.period
        metrics["lr_scale"] = self.lr_scale(rollout_id)
        if self.acrl is not None:
            self.acrl.update(sequence_level_discrepancy(batch, seq_reduce, batch_reduce))
            metrics.update(acrl_c=self.acrl.c, acrl_discrepancy=self.acrl.last, acrl_reference=self.acrl.reference)
        self.last_rollout = rollout_id
        return RolloutStep(shaped_advantages, {k: float(v) for k, v in metrics.items() if v is not None})

    def state_dict(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot of the state (restored exactly by ``load_state_dict``)."""
        return {
            "last_rollout": self.last_rollout,
            "dcgrpo": None if self.dcgrpo is None else self.dcgrpo.state_dict(),
            "surge": self.surge.state_dict(),
            "acrl": None if self.acrl is None else self.acrl.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a snapshot taken by ``state_dict``."""
        for key in ("dcgrpo", "surge", "acrl"):
            controller = getattr(self, key)
            if key not in state:
                raise StateError(f"saved state has no {key!r} entry")
            if (state[key] is None) != (controller is None):
                raise StateError(
                    f"saved state has {key} {'disabled' if state[key] is None else 'enabled'} but the configuration "
                    f"has it {'disabled' if controller is None else 'enabled'}: resume with the method the run "
                    "started with, or start the controllers afresh with --finetune or a new --save directory")
            if controller is not None:
                try:
                    controller.load_state_dict(state[key])
                except (KeyError, TypeError, ValueError) as exc:
                    raise StateError(f"saved {key} state is corrupt or from another version: {exc!r}") from None
        self.last_rollout = state.get("last_rollout")
