"""All stateful controllers of one configuration, advanced together once per rollout.

:meth:`ControllerSet.step` is the framework-free body of slime's advantage hook (ARCHITECTURE.md, data flow step 3):
one statistics table of the batch (:mod:`mismatch_ctrl.seqstats`) and one batch reduction for the mismatch metrics,
DC-GRPO's ``C_bar`` and penalty, ACRL's discrepancy and the mean response length -> DC-GRPO shaping with the current
lambda -> dual update -> surge detector and LR scale -> ACRL band. The slime adapter, the CPU lab and
``mismatch-ctrl analyze`` all call it, so the three agree.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

from . import host
from .acrl import ACRL_COLUMNS, BandController, SequenceDiscrepancy
from .batch import TokenBatch
from .config import Config
from .correction import CorrectionSpec
from .dcgrpo import LagrangeController, shape_advantages, shaping_columns
from .dist import LOCAL, Reducers
from .errors import StateError
from .lr_schedule import LengthTriggeredLR, SurgeDetector
from .metrics import METRIC_COLUMNS, mismatch_metrics
from .seqstats import BatchTotals, Reduced, SeqStats, reduce_batch
from .state import StateStore, count, mapping, optional, validated

log = logging.getLogger("mismatch_ctrl")


@dataclass(frozen=True)
class RolloutStep:
    """What one rollout produced: DC-GRPO-shaped token advantages (``[T]``; None when DC-GRPO is off, the
    baseline advantages stand) and the metrics to log."""

    advantages: torch.Tensor | None
    metrics: dict[str, float]


class ResponseLengths:
    """The mean response length over the data-parallel batch, from this rank's lengths (a batch part; read on the
    host)."""

    def __init__(self, lengths: Sequence[float], device: torch.device) -> None:
        self.local = host.to_device([float(sum(lengths)), float(len(lengths))], device, torch.float64)
        self.mean = 0.0

    def add_to(self, totals: BatchTotals) -> None:
        totals.add("sum", "response_lengths", self.local)

    def read(self, reduced: Reduced) -> None:
        total, count = reduced["response_lengths"].tolist()
        self.mean = total / count if count else 0.0


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
        response_lengths: Sequence[float],
        max_response_length: float | None = None,
        reducers: Reducers = LOCAL,
    ) -> RolloutStep:
        """Advance every controller by one rollout.

        ``seq_advantages`` are the per-sequence baseline advantages ``[N]`` (GRPO: the normalised rewards);
        ``batch`` holds both engines' log-probs (None if the training engine's are unavailable: only allowed when no
        enabled controller needs them); ``response_lengths`` are this rank's samples' response lengths (the surge
        detector reads their mean over the data-parallel batch). ``reducers`` combine context-parallel shards and
        data-parallel ranks: one statistics table and one batch reduction for everything (two gathers; one without
        ``batch``), and the host reads the reduced batch numbers once (besides the batch's own input check: two host
        synchronisations per rollout on a GPU).

        Metrics: ``mean_response_length``; the section-6 mismatch metrics and ``discrepancy`` (``C_bar``) whenever
        ``batch`` is given; with DC-GRPO ``lambda`` (the dual multiplier of this rollout), ``lambda_next``,
        ``eps`` (absent while ``eps: auto`` calibrates), ``violation``, ``eps_floor``, ``lambda_shaping`` (after
        ``penalty_cap``), ``penalty_capped``, ``lambda_at_max`` (``lambda_next`` is ``lambda_max``),
        ``drift_guard_lifted`` (1 on a rollout whose update lifted eps), ``drift_guard_lifts``, ``penalty_abs_mean``,
        ``penalty_share``; the LR scale and surge detector; the ACRL band.
        """
        if batch is None and self.config.needs_train_log_probs:
            raise ValueError("DC-GRPO and ACRL need the training engine's log-probs of this rollout")
        ctrl = self.dcgrpo
        lam, eps = (ctrl.shaping_lambda, ctrl.eps) if ctrl is not None else (0.0, None)
        device = batch.mask.device if batch is not None else getattr(seq_advantages, "device", torch.device("cpu"))
        lengths = ResponseLengths(response_lengths, device)
        metrics = shaped = discrepancy = None
        if batch is not None:
            settings = self.config.dcgrpo
            columns = METRIC_COLUMNS | shaping_columns(settings, eps or 0.0)
            stats = SeqStats.build(batch, columns | ACRL_COLUMNS if self.acrl else columns, reducers)
            metrics = mismatch_metrics(stats)
            shaped = shape_advantages(stats, seq_advantages if ctrl is not None else None, settings, lam, eps or 0.0)
            discrepancy = SequenceDiscrepancy(stats) if self.acrl is not None else None
        reduce_batch(reducers.batch, lengths, metrics, shaped, discrepancy, fetch=True)
        out: dict[str, Any] = {"mean_response_length": lengths.mean}
        if metrics is not None:
            out.update(metrics.summary, discrepancy=shaped.discrepancy)
        if ctrl is not None:
            calibrating, lifts = ctrl.calibrating, ctrl.lifts
            ctrl.update(shaped.discrepancy)
            violation = None if eps is None or shaped.discrepancy is None else shaped.discrepancy - eps
            out.update({"lambda": lam}, lambda_next=ctrl.lam, eps=eps, eps_floor=ctrl.floor,
                       eps_calibrating=float(calibrating), violation=violation,
                       lambda_shaping=shaped.lambda_shaping, penalty_capped=float(shaped.capped),
                       lambda_at_max=float(ctrl.lam >= self.config.dcgrpo.lambda_max),
                       drift_guard_lifted=float(ctrl.lifts > lifts), drift_guard_lifts=ctrl.lifts,
                       penalty_abs_mean=shaped.penalty_abs_mean, penalty_share=shaped.penalty_share)
        surge = self.surge
        surge.update(rollout_id, lengths.mean, max_response_length)
        out.update(surge_ratio=surge.ratio, surge_baseline=surge.baseline, surge_threshold=surge.threshold,
                   surge_triggered=float(surge.triggered), surge_onset=surge.onset)
        if self.lr is not None:
            out["lr_period"] = self.lr.period
        out["lr_scale"] = self.lr_scale(rollout_id)
        if self.acrl is not None:
            self.acrl.update(discrepancy.value)
            out.update(acrl_c=self.acrl.c, acrl_discrepancy=self.acrl.last, acrl_reference=self.acrl.reference)
        self.last_rollout = rollout_id
        advantages = shaped.advantages if shaped is not None else None
        return RolloutStep(advantages, {k: float(v) for k, v in out.items() if v is not None})

    STATE = {"last_rollout": optional(count), "dcgrpo": optional(mapping), "surge": mapping,
             "acrl": optional(mapping)}

    def state_dict(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot of the state (restored exactly by ``load_state_dict``)."""
        return {
            "last_rollout": self.last_rollout,
            "dcgrpo": None if self.dcgrpo is None else self.dcgrpo.state_dict(),
            "surge": self.surge.state_dict(),
            "acrl": None if self.acrl is None else self.acrl.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any], where: str = "state") -> None:
        """Restore a snapshot taken by ``state_dict``; every controller validates its part against the current
        configuration (state protocol of :mod:`mismatch_ctrl.state`). ``where`` names the source in errors (e.g.
        ``"state_0000005.json: state"``: the file and the key path in it). Nothing changes unless every part is
        valid."""
        state = validated(state, self.STATE, where)
        for key in ("dcgrpo", "acrl"):
            if (state[key] is None) != (getattr(self, key) is None):
                raise StateError(
                    f"{where}.{key}: the saved state has {key} {'disabled' if state[key] is None else 'enabled'} but "
                    f"the configuration has it {'disabled' if getattr(self, key) is None else 'enabled'}: resume "
                    "with the method the run started with")
        restored = ControllerSet(self.config)
        for key in ("dcgrpo", "surge", "acrl"):
            controller = getattr(restored, key)
            if controller is not None:
                controller.load_state_dict(state[key], f"{where}.{key}")
        surge, last = restored.surge, state["last_rollout"]
        ends = None if surge.start is None else surge.start + len(surge.lengths) - 1
        if ends != last:
            raise StateError(f"{where}.last_rollout: {last}, but the surge detector's history (one length per "
                             f"rollout) ends at rollout {ends}: the state is inconsistent; the file was edited")
        self.dcgrpo, self.surge, self.acrl = restored.dcgrpo, restored.surge, restored.acrl
        self.lr = LengthTriggeredLR(self.config.lr_decay, self.surge) if self.config.lr_decay.enabled else None
        self.last_rollout = state["last_rollout"]


def restore(config: Config, store: StateStore, rollout_id: int, place: str) -> ControllerSet:
    """The controllers of ``config`` with the state saved after ``rollout_id`` in ``store``, as every adapter resumes
    them: validated against the configuration (the state protocol) and against its place (``last_rollout`` is
    ``rollout_id``; ``place`` names it in the error, e.g. ``"rollout 5"``). A missing or invalid state raises
    :class:`StateError` naming the fix; with ``state.resume: fresh`` the controllers start afresh, with a warning."""
    controllers = ControllerSet(config)
    try:
        controllers.load_state_dict(store.load(rollout_id), f"{store.path(rollout_id)}: state")
        if controllers.last_rollout != rollout_id:
            raise StateError(f"{store.path(rollout_id)}: state.last_rollout: {controllers.last_rollout}, but the file "
                             f"is the state after {place}: it was edited or copied from elsewhere")
    except StateError as exc:
        if config.state.resume != "fresh":
            raise StateError(f"{exc} To start the controllers from their initial values on purpose, set "
                             "mismatch_ctrl.state.resume: fresh") from None
        log.warning("mismatch_ctrl: %s; state.resume=fresh: starting the controllers afresh", exc)
        return ControllerSet(config)
    return controllers
