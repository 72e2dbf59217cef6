"""Offline replay of the controllers over recorded rollouts (ALGORITHMS.md sections 2 and 4).

Every rollout goes through :meth:`~mismatch_ctrl.controllers.ControllerSet.step`, the body of slime's advantage hook,
so the replay is the controller, not a re-implementation:

- ``chosen``: DC-GRPO with the method's ``dcgrpo`` settings (and the command-line overrides): lambda trajectory,
  the eps in force, every change of eps with the rule that made it and its evidence (:mod:`.eps_changes`: the
  calibration, the infeasible-budget guard, the drift guard), the discrepancy ``C_bar``, the penalty share and where
  the penalty cap held lambda down;
- ``auto``: the same with ``eps: auto`` (lambda 0 for the first K rollouts, then eps = factor x median C_bar), its
  controller's log quiet (the console's DC-GRPO lines are the ``chosen`` replay's; the report gives both);
- ``surge``: the response-length surge detector of ``lr_decay`` (``period: auto``), run after all rollouts are read
  so that a maximum response length inferred from the whole run can cap its ratio; its verdict, onset and ``T_d``.

A rollout without the training engine's log-probs cannot be shaped (slime's hook would need ``--get-mismatch-metrics``
there): the multiplier holds and the rollout counts as skipped, as :meth:`LagrangeController.update` does for a batch
without trained tokens. The detector still sees its length.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
from typing import Any, Iterator, Sequence

import torch

from ..batch import TokenBatch
from ..config import Config
from ..controllers import ControllerSet
from ..dcgrpo import DCGRPOSettings, log as dcgrpo_log
from .eps_changes import EpsWatch

STEP_KEYS = ("lambda", "lambda_next", "lambda_shaping", "eps", "discrepancy", "violation", "penalty_share",
             "penalty_capped", "eps_floor", "eps_calibrating", "drift_guard_lifted")


def replay_configs(config: Config) -> tuple[Config, Config, Config]:
    """The configurations of the ``chosen``, ``auto`` and ``surge`` replays derived from the method's ``config``."""
    quiet = dict(acrl=dataclasses.replace(config.acrl, enabled=False))
    no_lr = dataclasses.replace(config.lr_decay, enabled=False)
    dcgrpo = dataclasses.replace(config.dcgrpo, enabled=True)
    chosen = dataclasses.replace(config, dcgrpo=dcgrpo, lr_decay=no_lr, **quiet)
    auto = dataclasses.replace(chosen, dcgrpo=dataclasses.replace(dcgrpo, eps="auto"))
    surge = dataclasses.replace(config, dcgrpo=dataclasses.replace(config.dcgrpo, enabled=False),
                                lr_decay=dataclasses.replace(config.lr_decay, enabled=True, period="auto"), **quiet)
    return chosen, auto, surge


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The DC-GRPO controller's log off inside the block."""
    before, dcgrpo_log.disabled = dcgrpo_log.disabled, True
    try:
        yield
    finally:
        dcgrpo_log.disabled = before


class Replay:
    """Feeds rollouts, in order, to the ``chosen`` and ``auto`` DC-GRPO controllers; then runs the surge detector."""

    def __init__(self, config: Config) -> None:
        chosen, auto, self.surge_config = replay_configs(config)
        self.chosen, self.auto = ControllerSet(chosen), ControllerSet(auto)
        self.eps_watch = EpsWatch(self.chosen.dcgrpo)
        """The eps changes of the ``chosen`` controller, each with the rule that made it."""
        period = config.lr_decay.period
        self.configured_period = period if config.lr_decay.enabled and isinstance(period, int) else None
        """The method's own manual ``lr_decay.period`` (the detector's ``T_d`` is then for comparison)."""
        self.records: list[dict[str, Any]] = []
        self.lengths: list[tuple[int, float]] = []

    @property
    def settings(self) -> DCGRPOSettings:
        return self.chosen.config.dcgrpo

    def observe(self, rollout_id: int, batch: TokenBatch | None, rewards: Sequence[float] | None,
                mean_response_length: float) -> dict[str, Any]:
        """Advance both controllers by one rollout; ``rewards`` (GRPO's per-sample advantage) give the baseline
        token advantages (zeros without them: then the penalty share is not meaningful and is left out)."""
        record: dict[str, Any] = {"rollout_id": rollout_id, "has_rewards": rewards is not None}
        if batch is not None:
            advantages = torch.tensor(list(rewards) if rewards is not None else [0.0] * batch.num_seqs,
                                      dtype=torch.float32)
        self.eps_watch.before()
        for name, controllers in (("chosen", self.chosen), ("auto", self.auto)):
            if batch is None:
                controllers.dcgrpo.update(None)
                record[name] = None
                continue
            # step() takes this rank's response lengths and logs their mean; the dump's mean stands for them.
            with _quiet() if controllers is self.auto else contextlib.nullcontext():
                metrics = controllers.step(rollout_id, advantages, batch, [mean_response_length]).metrics
            values = {key: metrics.get(key) for key in STEP_KEYS}
            values["eps_calibrating"] = bool(values["eps_calibrating"])
            if values["eps_calibrating"]:
                values["eps"] = values["violation"] = None
            if rewards is None:
                values["penalty_share"] = None
            record[name] = values
        self.eps_watch.after(rollout_id, None if record["chosen"] is None else record["chosen"]["discrepancy"])
        self.records.append(record)
        self.lengths.append((rollout_id, mean_response_length))
        return record

    def dcgrpo_summary(self) -> dict[str, Any]:
        """The ``chosen`` trajectory in numbers: settings, final state, fraction of rollouts above eps, saturation."""
        s = self.settings
        ctrl = self.chosen.dcgrpo
        steps = [r["chosen"] for r in self.records if r["chosen"] is not None]
        judged = [x for x in steps if x["eps"] is not None and x["discrepancy"] is not None]
        shares = [x["penalty_share"] for x in steps if x["penalty_share"] is not None]
        return {
            "settings": {k: getattr(s, k) for k in ("signal", "penalty_form", "aggregation", "lambda_0", "eta", "eps",
                                                    "lambda_max", "eps_guard", "floor_rollouts", "drift_guard",
                                                    "drift_window", "penalty_cap", "zero_advantage")},
            "eps_final": ctrl.eps,
            "eps_floor": ctrl.floor,
            "eps_changes": self.eps_watch.changes,
            "lambda_final": ctrl.lam,
            "rollouts_replayed": ctrl.rollouts,
            "rollouts_without_train_log_probs": sum(r["chosen"] is None for r in self.records),
            "rollouts_without_rewards": sum(r["chosen"] is not None and not r["has_rewards"] for r in self.records),
            "fraction_above_eps": sum(x["discrepancy"] > x["eps"] for x in judged) / len(judged) if judged else None,
            "fraction_at_lambda_max": (sum(x["lambda_next"] >= s.lambda_max for x in steps) / len(steps)
                                       if steps and s.penalty_form != "fixed" else None),
            "penalty_share_mean": sum(shares) / len(shares) if shares else None,
            "drift_guard_lifts": [rollout_id for (rollout_id, _), r in zip(self.lengths, self.records)
                                  if r["chosen"] is not None and r["chosen"]["drift_guard_lifted"]],
            "fraction_capped": (sum(bool(x["penalty_capped"]) for x in steps) / len(steps)
                                if steps and s.cap is not None else None),
        }

    def c_bars(self) -> list[float]:
        """The discrepancy ``C_bar`` of every rollout with training log-probs, in order."""
        return [r["chosen"]["discrepancy"] for r in self.records
                if r["chosen"] is not None and r["chosen"]["discrepancy"] is not None]

    def eps_recommendation(self) -> dict[str, Any]:
        """``eps: auto`` from the ``auto`` controller, its spread over every window of K consecutive rollouts, the
        infeasible-budget floor and the spread of C_bar over the rollouts."""
        s = self.settings
        k, factor = s.calibration_rollouts, s.eps_auto_factor
        c_bars = self.c_bars()
        calibrated = self.auto.dcgrpo.eps
        value = calibrated if calibrated is not None else (factor * statistics.median(c_bars) if c_bars else None)
        windows = [factor * statistics.median(c_bars[i:i + k]) for i in range(len(c_bars) - k + 1)]
        return {
            "rule": f"{factor:g} x median C_bar over the first {k} rollouts",
            "eps_auto": value,
            "calibration_rollouts": k,
            "partial": calibrated is None,
            "rollouts_measured": len(c_bars),
            "window_spread": ({"min": min(windows), "median": statistics.median(windows), "max": max(windows),
                               "windows": len(windows)} if windows else None),
            "eps_floor": statistics.median(c_bars[:s.floor_rollouts]) if c_bars else None,
            "c_bar_over_rollouts": _spread(c_bars),
        }

    def surge(self, max_response_len: float | None) -> dict[str, Any]:
        """Run the surge detector over the recorded mean response lengths; its verdict and the ``T_d`` it chooses."""
        controllers = ControllerSet(self.surge_config)
        series: dict[str, list[Any]] = {"rollout_id": [], "baseline": [], "ratio": [], "threshold": [],
                                        "lr_scale": []}
        for rollout_id, length in self.lengths:
            metrics = controllers.step(rollout_id, None, None, [length], max_response_len).metrics
            series["rollout_id"].append(rollout_id)
            series["baseline"].append(metrics.get("surge_baseline"))
            series["ratio"].append(metrics.get("surge_ratio"))
            series["threshold"].append(metrics.get("surge_threshold"))
            series["lr_scale"].append(metrics["lr_scale"])
        lr = controllers.lr
        detector = lr.detector
        s = self.surge_config.lr_decay.surge
        needed = max(s.baseline_window + s.gap, s.warmup + 1) + s.consecutive - 1
        if detector.triggered:
            verdict = (f"surge detected at rollout {detector.triggered_at} (onset {detector.onset}): "
                       f"T_d = round({s.period_multiplier:g} x {detector.onset}) = {lr.period}")
        elif len(self.lengths) < needed:
            verdict = (f"undecided: {len(self.lengths)} rollouts, the detector needs at least {needed} (a baseline "
                       f"window of {s.baseline_window} ending {s.gap} rollouts back, then {s.consecutive} consecutive "
                       "rising rollouts)")
        else:
            verdict = "no surge: the learning rate would not decay"
        period = lr.period
        return {
            "verdict": verdict,
            "triggered": detector.triggered,
            "triggered_at": detector.triggered_at,
            "onset": detector.onset,
            "T_d": period,
            "first_halving": None if period is None else max(period, detector.triggered_at),
            "baseline": detector.baseline,
            "ratio_final": detector.ratio,
            "threshold": detector.threshold,
            "max_response_len": max_response_len,
            "configured_period": self.configured_period,
            "factor": self.surge_config.lr_decay.factor,
            "min_scale": self.surge_config.lr_decay.min_scale,
            "settings": dataclasses.asdict(s),
            "series": series,
        }


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    if len(values) == 1:
        return {"p10": values[0], "p50": values[0], "p90": values[0]}
    deciles = statistics.quantiles(values, n=10, method="inclusive")
    return {"p10": deciles[0], "p50": statistics.median(values), "p90": deciles[8]}
