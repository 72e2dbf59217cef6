"""The scenarios every world runs, written once for any rank's :class:`View` of the global batch.

Each ``run_*`` function drives the hooks the way slime does on one rank and returns plain data (tensors, floats,
dicts) for the tests to compare. The same functions run in three settings:

- the pytest process with megatron blocked (:data:`slime_data.FULL` view): the single-process reference;
- every rank of a spawned world with real ``megatron.core.parallel_state`` over gloo (``slime_worker.py``);
- a spawned process with megatron imported but not initialised (the CPU lab's path).
"""

from __future__ import annotations

import copy
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from slime_data import (
    COLLECTIVE_CALLS,
    FULL,
    PREFIX,
    GlobalBatch,
    View,
    cp_slice,
    local_samples,
    make_args,
    make_batch,
    method,
    micro_batches,
    partition,
    rollout_data,
)

from mismatch_ctrl.batch import TokenBatch
from mismatch_ctrl.correction import apply_correction
from mismatch_ctrl.errors import InputError
from mismatch_ctrl.metrics import METRIC_COLUMNS, mismatch_metrics
from mismatch_ctrl.seqstats import SeqStats
from mismatch_ctrl.slime import hooks
from mismatch_ctrl.slime.runtime import get_runtime

SMALL_SURGE = {"short_window": 3, "baseline_window": 5, "gap": 2, "consecutive": 2, "min_increase_tokens": 1}
FAST_SURGE = {"short_window": 2, "baseline_window": 3, "gap": 1, "consecutive": 1, "min_increase_tokens": 1}

ADVANTAGE_METHODS: dict[str, dict[str, Any]] = {
    "dcgrpo": method("dcgrpo"),
    "dcgrpo_hinge_auto": method("dcgrpo", dcgrpo={"penalty_form": "hinge", "aggregation": "token_mean",
                                                  "eps": "auto", "calibration_rollouts": 3}),
    "grpo": method("grpo"),
    "acrl": method("acrl", acrl={"calibration_rollouts": 2}),
    "dcgrpo_length_decay": method("dcgrpo_length_decay", lr_decay={"surge": SMALL_SURGE}),
}
NONFINITE_DATA = {"dcgrpo"}
"""Methods whose rollouts carry non-finite log-probs at a few trained (and untrained) tokens."""
NOISE = [1.0, 0.3, 2.0, 0.5, 3.0, 1.0]
"""Mismatch scale of each advantage rollout (varied so lambda and the ACRL band move)."""

DCGRPO = {"dcgrpo": {"enabled": True}}
CORRECTION_METHODS: dict[str, dict[str, Any]] = {
    "none": method("grpo", **DCGRPO),
    "geo_mis": method("geo_mis", **DCGRPO),
    "token_tis": method("token_tis", **DCGRPO),
    "icepop": method("icepop", **DCGRPO),
    "seq_mis": method("seq_mis", **DCGRPO),
    "geo_rs_token_tis": method("grpo", name="geo_rs_token_tis", correction={"preset": "geo_rs_token_tis"}, **DCGRPO),
    "k3_rs": method("grpo", name="k3_rs", correction={"preset": "k3_rs"}, **DCGRPO),
    "none_nonfinite": method("grpo", **DCGRPO),
    "token_tis_nonfinite": method("token_tis", **DCGRPO),
    "seq_tis_normalized": method("grpo", name="seq_tis_normalized",
                                 correction={"preset": "seq_tis", "batch_normalize": True}, **DCGRPO),
    "acrl": method("acrl", acrl={"reference": 1.0e-3}),
}

LR_METHODS = {
    "auto": method("dcgrpo_length_decay", lr_decay={"surge": SMALL_SURGE}),
    "manual": method("dcgrpo_length_decay", lr_decay={"period": 5}),
}
LR_ROLLOUTS, STEPS_PER_ROLLOUT, GLOBAL_BATCH = 30, 2, 8
LR_STYLES = ("constant", "linear")
LR_DECAY_STEPS = 2 * LR_ROLLOUTS * STEPS_PER_ROLLOUT * GLOBAL_BATCH
"""Megatron's ``lr_decay_steps`` (in samples) of the test schedulers."""
SURGE_AT = 6

RESUME_METHOD = method("dcgrpo_length_decay", lr_decay={"surge": FAST_SURGE}, state={"keep_last": 2},
                       acrl={"enabled": True, "calibration_rollouts": 2})
RESUME_ROLLOUTS, RESUME_STOP, RESUME_FROM, SAVE_INTERVAL = 12, 8, 5, 3
RESTORED_SCALE = 0.125
"""max_lr / args.lr that a restored optimizer's param groups carry (the hook must not read it back)."""

Barrier = Callable[[], None]


def seed_of(*parts: Any) -> int:
    return zlib.crc32(":".join(map(str, parts)).encode())


def advantage_batch(name: str, r: int) -> GlobalBatch:
    return make_batch(seed_of("advantages", name, r), noise=NOISE[r], nonfinite=name in NONFINITE_DATA)


def correction_batch(case: str) -> GlobalBatch:
    return make_batch(seed_of("correction", case), nonfinite=case.endswith("_nonfinite"))


def lr_batch(r: int) -> GlobalBatch:
    return make_batch(seed_of("lr", r), mean_length=12.0 if r < SURGE_AT else 60.0)


def resume_batch(r: int) -> GlobalBatch:
    return make_batch(seed_of("resume", r), mean_length=12.0 if r < 4 else 60.0, noise=NOISE[r % len(NOISE)])


def state_copy(args: Any) -> dict[str, Any]:
    """A snapshot of the controllers' state dict (deep-copied: ``SurgeDetector.state_dict`` returns its live lists)."""
    return copy.deepcopy(get_runtime(args).controllers.state_dict())


def snapshot(args: Any, data: dict[str, Any], rollout_id: int) -> dict[str, Any]:
    """What the advantage hook left behind on this rank for one rollout."""
    controllers = get_runtime(args).controllers
    return {
        "advantages": data["advantages"],
        "returns": data["returns"],
        "metrics": {k: v for k, v in data.items() if k.startswith(PREFIX)},
        "state": state_copy(args),
        "lr_scale": controllers.lr_scale(rollout_id),
    }


# --- advantages ------------------------------------------------------------------------------------------------------

def run_advantages(name: str, view: View) -> list[dict[str, Any]]:
    """Six rollouts of the advantage hook with method ``name``."""
    args = make_args(ADVANTAGE_METHODS[name])
    hooks.on_megatron_init(args)
    out = []
    for r in range(len(NOISE)):
        data = rollout_data(advantage_batch(name, r), view)
        counted = COLLECTIVE_CALLS.total()
        hooks.advantages(args, data)
        out.append(dict(snapshot(args, data, r), collectives=COLLECTIVE_CALLS.total() - counted))
    return out


# --- rollout correction ----------------------------------------------------------------------------------------------

def pg_loss_values(batch: GlobalBatch, samples: list[int], view: View) -> torch.Tensor:
    """A CP-local per-token loss of ``samples``: magnitudes in [0.5, 1.5] with both signs, NaN where the log-probs
    are non-finite (as slime's loss would be there)."""
    pieces = []
    for i in samples:
        g = torch.Generator().manual_seed(seed_of("pg", i))
        n = batch.response_lengths[i]
        full = (0.5 + torch.rand(n, generator=g)) * torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
        full[batch.nonfinite[i]] = float("nan")
        pieces.append(cp_slice(full, batch.total_lengths[i], n, view))
    return torch.cat(pieces)


def runtime_state(args: Any) -> dict[str, Any]:
    runtime = get_runtime(args)
    return {"controllers": state_copy(args), "next_rollout": runtime.next_rollout,
            "lr_applied": runtime.lr_applied}


def run_correction(case: str, view: View) -> dict[str, Any]:
    """One rollout of the advantage hook (so the controllers hold state), then the TIS hook on this rank's two
    micro-batches, each called twice with fresh ``pg_loss`` leaves and backpropagated."""
    batch = correction_batch(case)
    args = make_args(CORRECTION_METHODS[case])
    hooks.on_megatron_init(args)
    data = rollout_data(batch, view)
    hooks.advantages(args, data)
    before = runtime_state(args)
    out = []
    for mb in micro_batches(data["partition"]):
        samples = [data["partition"][k] for k in mb]
        masks = [data["loss_masks"][k] for k in mb]
        kwargs = {"train_log_probs": [data["log_probs"][k] for k in mb],
                  "rollout_log_probs": [data["rollout_log_probs"][k] for k in mb],
                  "loss_masks": [m.clone() for m in masks],
                  "total_lengths": [data["total_lengths"][k] for k in mb],
                  "response_lengths": [data["response_lengths"][k] for k in mb]}
        pg_in = pg_loss_values(batch, samples, view)
        calls = []
        for _ in range(2):
            pg = pg_in.clone().requires_grad_(True)
            counted = COLLECTIVE_CALLS.total()
            pg_out, new_masks, metrics = hooks.rollout_correction(args, pg_loss=pg, **kwargs)
            collectives = COLLECTIVE_CALLS.total() - counted
            requires_grad = pg_out.requires_grad
            pg_out.sum().backward()
            calls.append({"pg_out": pg_out.detach(), "masks": [m.clone() for m in new_masks],
                          "metrics": {k: v.detach() for k, v in metrics.items()}, "grad": pg.grad,
                          "requires_grad": requires_grad, "collectives": collectives,
                          "inputs_unchanged": all(torch.equal(a, b) for a, b in zip(kwargs["loss_masks"], masks))})
        out.append({"samples": samples, "pg_in": pg_in, "calls": calls})
    return {"micro_batches": out, "before": before, "after": runtime_state(args)}


def correction_reference(case: str, dp_size: int) -> dict[str, Any]:
    """The core on full sequences, single process, for ``case`` with the IS/RS settings the controllers hold after the
    same advantage-hook rollout: ``apply_correction`` and the mismatch metrics on the whole batch (``full``) and on
    each micro-batch slot of a world with ``dp_size`` data-parallel ranks (the samples of the k-th micro-batch of every
    DP rank: what one TIS-hook call sees over the DP group, batch values and batch normalisation included)."""
    batch = correction_batch(case)
    args = make_args(CORRECTION_METHODS[case])
    hooks.advantages(args, rollout_data(batch, FULL))
    runtime = get_runtime(args)
    spec = runtime.controllers.correction()

    def core(samples: list[int]) -> dict[str, Any]:
        tb = TokenBatch.from_lists([batch.train[g] for g in samples], [batch.rollout[g] for g in samples],
                                   [batch.loss_masks[g] for g in samples], runtime.config.nonfinite)
        metrics = mismatch_metrics(SeqStats.build(tb, METRIC_COLUMNS))
        summary = dict(metrics.summarize())
        per_sample = {k: v.tolist() for k, v in metrics.per_sequence("mean").items()}
        weights = keep = tb.mask
        if spec.active:
            correction = apply_correction(spec, tb)
            summary.update(correction.metrics.summary)
            per_sample.update({k: v.tolist() for k, v in correction.metrics.per_sequence("mean").items()})
            weights, keep = correction.weights, correction.mask
        # pg_loss_values is NaN only where a log-prob is: those tokens leave the loss, so no trained token's is NaN.
        summary["nonfinite_pg_loss_fraction"] = 0.0
        per_sample["nonfinite_pg_loss_fraction"] = [0.0] * len(samples)
        # The guard's drops, counted from where make_batch put them: per sample, its dropped share of trained tokens.
        dropped = [len(batch.nonfinite[g]) / max(int(batch.loss_masks[g].sum()), 1) for g in samples]
        per_sample["nonfinite_token_fraction"] = dropped
        summary["nonfinite_token_fraction"] = sum(dropped) / len(samples)
        if spec.active:  # pg_loss_values are at most 1.5 in magnitude: no weighted loss overflows
            summary["pg_loss_overflow_fraction"] = 0.0
            per_sample["pg_loss_overflow_fraction"] = [0.0] * len(samples)
        totals = {"trained_tokens", "nonfinite_tokens", "rejected_tokens", "sequences", "valid_sequences"}
        return {"samples": samples, "weights": dict(zip(samples, tb.segments.split(weights))),
                "keep": dict(zip(samples, tb.segments.split(keep))),
                "per_sample": {k: dict(zip(samples, v)) for k, v in per_sample.items()}, "summary": summary,
                "names": sorted(name for name in summary if name not in totals),
                "sequences": summary["sequences"], "valid": summary["valid_sequences"]}

    ranks = partition(batch.size, dp_size)
    slots = [[ranks[r][j] for r in range(dp_size) for j in micro_batches(ranks[r])[k]] for k in range(2)]
    return {"spec": spec, "full": core(list(range(batch.size))), "slots": [core(samples) for samples in slots]}


# --- learning rate ---------------------------------------------------------------------------------------------------

def make_optimizer(args: Any, style: str, restored_scale: float = 1.0) -> tuple[Any, Any, list[list[float]]]:
    """A torch optimizer with two param groups carrying ``max_lr``/``min_lr`` (as megatron-core fills them), Megatron's
    real ``OptimizerParamScheduler`` and the list the group LRs are recorded into whenever ``optimizer.step()`` runs."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    weight, bias = torch.nn.Parameter(torch.ones(2, 2)), torch.nn.Parameter(torch.ones(2))
    for p in (weight, bias):
        p.grad = torch.zeros_like(p)
    groups = [{"params": [p], "max_lr": args.lr * restored_scale, "min_lr": args.min_lr * restored_scale,
               "wd_mult": mult} for p, mult in ((weight, 1.0), (bias, 0.0))]
    optimizer = torch.optim.SGD(groups, lr=args.lr)
    seen: list[list[float]] = []
    optimizer.register_step_pre_hook(lambda opt, *_: seen.append([g["lr"] for g in opt.param_groups]))
    scheduler = OptimizerParamScheduler(
        optimizer, init_lr=0.0, max_lr=args.lr, min_lr=args.min_lr, lr_warmup_steps=0, lr_decay_steps=LR_DECAY_STEPS,
        lr_decay_style=style, start_wd=0.01, end_wd=0.01, wd_incr_steps=LR_DECAY_STEPS, wd_incr_style="constant")
    return optimizer, scheduler, seen


def group_values(optimizer: Any) -> list[tuple[float, float, float]]:
    return [(g["lr"], g["max_lr"], g["min_lr"]) for g in optimizer.param_groups]


def train_step(args: Any, rollout_id: int, step_id: int, optimizer: Any, scheduler: Any,
               seen: list[list[float]]) -> dict[str, Any]:
    """slime's ``train_one_step`` around the optimizer: the hook (called twice to check it is idempotent), then
    ``optimizer.step()`` and ``scheduler.step(increment=global batch size)``."""
    hooks.before_train_step(args, rollout_id, step_id, [], optimizer, scheduler)
    first = group_values(optimizer)
    hooks.before_train_step(args, rollout_id, step_id, [], optimizer, scheduler)
    second = group_values(optimizer)
    num_steps = scheduler.num_steps
    optimizer.step()
    scheduler.step(increment=GLOBAL_BATCH)
    return {"first": first, "second": second, "num_steps": num_steps, "at_step": seen[-1],
            "after": [g["lr"] for g in optimizer.param_groups]}


def run_lr(name: str, view: View, optimizer: bool = True) -> list[dict[str, Any]]:
    """30 rollouts with a response-length surge at rollout 6 and two optimizer steps each, for a constant and a linear
    Megatron schedule (``optimizer=False``: the advantage hook only, for the reference without megatron). Ranks of an
    earlier pipeline stage only run the optimizer steps, as in slime."""
    args = make_args(LR_METHODS[name])
    hooks.on_megatron_init(args)
    optimizers = {style: make_optimizer(args, style) for style in LR_STYLES} if optimizer else {}
    out = []
    for r in range(LR_ROLLOUTS):
        record: dict[str, Any] = {}
        if view.last_stage:
            data = rollout_data(lr_batch(r), view)
            hooks.advantages(args, data)
            record = snapshot(args, data, r)
        record["steps"] = [{style: train_step(args, r, s, *parts) for style, parts in optimizers.items()}
                           for s in range(STEPS_PER_ROLLOUT)]
        out.append(record)
    return out


# --- checkpoint and resume -------------------------------------------------------------------------------------------

def run_rollouts(args: Any, view: View, rollouts: range, restored_scale: float = 1.0) -> dict[int, dict[str, Any]]:
    optimizer, scheduler, seen = make_optimizer(args, "constant", restored_scale)
    out = {}
    for r in rollouts:
        data = rollout_data(resume_batch(r), view)
        hooks.advantages(args, data)
        record = snapshot(args, data, r)
        record["lrs"] = [train_step(args, r, s, optimizer, scheduler, seen)["at_step"]
                         for s in range(STEPS_PER_ROLLOUT)]
        out[r] = record
    return out


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []


def run_resume(view: View, workdir: Path, rank: int, barrier: Barrier) -> dict[str, Any]:
    """An uninterrupted run of 12 rollouts; a run that saves to ``workdir/rank{rank}`` and stops after 8 rollouts;
    rank 0 then marks rollout 5 as the checkpoint; a fresh ``args`` resumes from rank 0's directory and runs 6-11.

    Each rank saves to its own directory, so a directory with state files shows which ranks wrote.
    """
    common = {"save_interval": SAVE_INTERVAL, "num_rollout": RESUME_ROLLOUTS}
    uninterrupted = run_rollouts(make_args(RESUME_METHOD, **common), view, range(RESUME_ROLLOUTS))
    own, main = workdir / f"rank{rank}", workdir / "rank0"
    args = make_args(RESUME_METHOD, save=str(own), **common)
    hooks.on_megatron_init(args)
    first = run_rollouts(args, view, range(RESUME_STOP))
    barrier()
    files_first = listing(own / "mismatch_ctrl")
    if rank == 0:
        (main / "latest_checkpointed_iteration.txt").write_text(f"{RESUME_FROM}\n")
    barrier()
    resumed_args = make_args(RESUME_METHOD, save=str(own), load=str(main), finetune=False, start_rollout_id=None,
                             **common)
    hooks.on_megatron_init(resumed_args)
    restored = runtime_state(resumed_args)
    resumed = run_rollouts(resumed_args, view, range(RESUME_FROM + 1, RESUME_ROLLOUTS), RESTORED_SCALE)
    barrier()
    return {"uninterrupted": uninterrupted, "first": first, "resumed": resumed, "restored": restored,
            "files_first": files_first, "files_resumed": listing(own / "mismatch_ctrl")}


# --- bad input under context parallelism -----------------------------------------------------------------------------

def run_bad_input_cp(view: View) -> dict[str, Any]:
    """Full-length ``log_probs`` where slime passes CP-local ones (advantage hook), and a full-length ``pg_loss``
    (TIS hook): both must raise InputError on every rank before any collective."""
    batch = make_batch(seed_of("bad_input_cp"))
    args = make_args(method("dcgrpo"))
    data = rollout_data(batch, view)
    samples = local_samples(batch, view)
    out: dict[str, Any] = {"samples": samples}
    full = dict(data, log_probs=[batch.train[i] for i in samples])
    try:
        hooks.advantages(args, full)
    except InputError as exc:
        out["advantages_error"] = str(exc)
    try:
        hooks.rollout_correction(
            args, pg_loss=torch.zeros(sum(batch.response_lengths[i] for i in samples)),
            train_log_probs=data["log_probs"], rollout_log_probs=data["rollout_log_probs"],
            loss_masks=data["loss_masks"], total_lengths=data["total_lengths"],
            response_lengths=data["response_lengths"])
    except InputError as exc:
        out["tis_error"] = str(exc)
    out["local_tokens"] = sum(t.numel() for t in data["log_probs"])
    return out


SCENARIOS = ([f"advantages/{name}" for name in ADVANTAGE_METHODS]
             + [f"correction/{case}" for case in CORRECTION_METHODS]
             + [f"lr/{name}" for name in LR_METHODS] + ["resume", "bad_input_cp"])
"""Every scenario a world runs, in order (``bad_input_cp`` only where the context-parallel size is > 1)."""


def run_scenario(name: str, view: View, workdir: Path, rank: int, barrier: Barrier) -> Any:
    kind, _, arg = name.partition("/")
    if kind == "advantages":
        return run_advantages(arg, view)
    if kind == "correction":
        return run_correction(arg, view)
    if kind == "lr":
        return run_lr(arg, view)
    if kind == "resume":
        return run_resume(view, workdir / "resume", rank, barrier)
    if kind == "bad_input_cp":
        return run_bad_input_cp(view)
    raise ValueError(f"unknown scenario {name!r}")


def reference(workdir: Path) -> dict[str, Any]:
    """The single-process results (all samples, full length) of every scenario; no megatron, no optimizer."""
    out: dict[str, Any] = {f"advantages/{name}": run_advantages(name, FULL) for name in ADVANTAGE_METHODS}
    out.update({f"correction/{case}": {dp: correction_reference(case, dp) for dp in (1, 2)}
                for case in CORRECTION_METHODS})
    out.update({f"lr/{name}": run_lr(name, FULL, optimizer=False) for name in LR_METHODS})
    args = make_args(RESUME_METHOD, save_interval=SAVE_INTERVAL, num_rollout=RESUME_ROLLOUTS)
    hooks.on_megatron_init(args)
    out["resume"] = {}
    for r in range(RESUME_ROLLOUTS):
        data = rollout_data(resume_batch(r), FULL)
        hooks.advantages(args, data)
        out["resume"][r] = snapshot(args, data, r)
    return out
