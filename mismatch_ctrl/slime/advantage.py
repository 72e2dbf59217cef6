"""``--custom-advantage-function-path mismatch_ctrl.slime.hooks.advantages`` (SLIME.md section 1).

slime calls it once per rollout, before any optimizer step, on every last-pipeline-stage rank, with DP-local samples
and CP-local log-probs; it must set ``rollout_data["advantages"]`` and ``["returns"]`` (one CP-local tensor per
sample). Extra list-valued keys of ``rollout_data`` are logged by slime as ``rollout/<key>``.

The body is :meth:`~mismatch_ctrl.controllers.ControllerSet.step`: one statistics table and one batch reduction for
every metric and controller, so a rollout costs two collectives (a gather over the CP group, one over the DP group;
one without the training log-probs) and two host synchronisations (the input check and the controllers' read of the
reduced batch numbers; :mod:`mismatch_ctrl.host`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from .. import host
from ..batch import Segments
from ..errors import InputError
from ._groups import topology
from .inputs import check_rollout_data
from .layout import LocalLayout
from .names import TIS_HOOK
from .runtime import get_runtime

METRIC_PREFIX = "mismatch_ctrl/"
COMPACT_ROLLOUTS = (
    "mismatch_ctrl: samples share rollout ids (slime's compact rollouts, one trajectory in several samples): slime "
    "then averages train/ metrics token-weighted over each rollout id (rollout_mask_sums), so the rollout-correction "
    "hook's train/mismatch_ctrl/* means read per trajectory, not per sample; rollout/mismatch_ctrl/* (C_bar, DC-GRPO) "
    "stay per sample (docs/metrics.md)")


def advantages(args: Any, rollout_data: dict[str, Any]) -> None:
    """GRPO advantages (DC-GRPO-shaped if enabled), controller updates, metrics and state persistence."""
    runtime = get_runtime(args)
    config, controllers = runtime.config, runtime.controllers
    topo = topology()
    rollout_id = runtime.next_rollout
    rewards = check_rollout_data(rollout_data, runtime)
    if getattr(args, "custom_tis_function_path", None) == TIS_HOOK and _shares_rollout_ids(
            rollout_data.get("rollout_ids")):
        runtime.warn_once("compact_rollouts", COMPACT_ROLLOUTS)
    response_lengths = rollout_data["response_lengths"]
    rollout_log_probs = rollout_data.get("rollout_log_probs")
    if not rollout_log_probs and rewards:
        raise InputError("rollout_data has no 'rollout_log_probs': mismatch_ctrl compares them with the training "
                         "engine's; slime records them with its SGLang rollout (a custom generate function must set "
                         "sample.rollout_log_probs)")
    train_log_probs = rollout_data.get("log_probs")
    shapes = rollout_data.get("kl") or rollout_log_probs or []
    device = shapes[0].device if shapes else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    layout = LocalLayout(rollout_data["total_lengths"], response_lengths, topo)
    if rollout_data.get("kl") is not None:  # slime shapes its own advantages like kl: one value per CP-local token
        layout.check_local("kl", rollout_data["kl"])
    batch = None
    if train_log_probs is not None:
        batch = layout.batch(train_log_probs, rollout_log_probs or [], rollout_data["loss_masks"], config.nonfinite,
                             device=device)
    elif config.needs_train_log_probs and rewards:
        raise InputError(
            "rollout_data has no 'log_probs' (the training engine's recompute), which DC-GRPO / ACRL need: add "
            "--get-mismatch-metrics to the slime command (or run more than one optimizer step per rollout)")
    elif rewards:
        runtime.warn_once("no_log_probs", "mismatch_ctrl: rollout_data has no 'log_probs'; mismatch metrics are "
                                          "skipped (add --get-mismatch-metrics to record them)")

    reward_t = host.to_device(rewards, device, torch.float32)
    step = controllers.step(rollout_id, reward_t, batch, response_lengths,
                            max_response_length=getattr(args, "rollout_max_response_len", None),
                            reducers=topo.reducers)
    if step.advantages is not None:
        advs = list(torch.split(step.advantages, layout.sizes))
    elif shapes:  # slime's built-in GRPO: each sample's reward at each of its (CP-local) tokens
        segments = batch.segments if batch is not None else Segments(layout.sizes, device)
        # slime's dtype is kl's; at least float32, so that no reward becomes inf in float16's range (65504)
        dtype = torch.promote_types(shapes[0].dtype, torch.float32) if shapes[0].is_floating_point() else \
            torch.float32
        advs = list(torch.split(segments.expand(reward_t).to(dtype), layout.sizes))
    else:
        advs = []
    rollout_data["advantages"] = advs
    rollout_data["returns"] = list(advs)
    if rewards:
        for name, value in step.metrics.items():
            rollout_data[METRIC_PREFIX + name] = [value] * len(rewards)
    if runtime.store is not None and topo.is_main_rank:
        runtime.store.save(rollout_id, controllers.state_dict(), keep=checkpoint_rollouts(args))
    runtime.next_rollout = rollout_id + 1


def _shares_rollout_ids(ids: Any) -> bool:
    """Whether this rank's per-sample ``rollout_ids`` repeat one. slime keeps a rollout's samples in one step but may
    spread them over micro-batches and DP ranks (624b824a ``ray/rollout.py:685-690``), so a rank can miss a
    trajectory of few samples; one of many turns shows. (``rollout_mask_sums`` would tell on every rank, but it is a
    device tensor: reading it costs a host synchronisation.)"""
    try:
        return isinstance(ids, (list, tuple)) and len(set(ids)) < len(ids)
    except TypeError:  # unhashable ids: not slime's
        return False


def checkpoint_rollouts(args: Any) -> Callable[[int], bool]:
    """Whether a Megatron checkpoint follows rollout r: slime saves one by this run's schedule
    (``should_run_periodic_action`` in train.py), or ``--save`` holds one already, e.g. from a run with another
    ``--save-interval``: slime's ``save_model(r)`` calls Megatron's ``save_checkpoint(iteration=r)``, which writes
    ``{save}/iter_{r:07d}/`` (slime 624b824a ``actor.py:571-593``, ``model.py:946-974``; docs/slime-integration.md
    section 5)."""
    interval = getattr(args, "save_interval", None)
    last = getattr(args, "num_rollout", None)
    per_epoch = getattr(args, "num_rollout_per_epoch", None)
    save = getattr(args, "save", None)

    def is_checkpoint(r: int) -> bool:
        scheduled = bool(interval) and ((r + 1) % interval == 0 or (last is not None and r == last - 1) or
                                        (bool(per_epoch) and (r + 1) % per_epoch == 0))
        return scheduled or (save is not None and (Path(save) / f"iter_{r:07d}").exists())

    return is_checkpoint
