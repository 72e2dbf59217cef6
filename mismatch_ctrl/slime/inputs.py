"""What slime hands the hooks, checked before any work: clear :class:`InputError` naming the field and the fix, or,
where training must go on, a guard counted in a metric with a one-time warning.

Shapes follow SLIME.md sections 1 and 2 (``rollout_data`` of the advantage hook, the keyword arguments of the TIS
hook); per-sample token counts are checked later by :class:`~mismatch_ctrl.slime.layout.LocalLayout`, and token
values (loss masks 0/1, NaN/inf or impossible log-probs) by :class:`~mismatch_ctrl.batch.TokenBatch`. Only Python
checks on lists here (no tensor operation on what slime passes), so the hooks' cost does not change.

A NaN/inf reward (slime normalises rewards per prompt group before the hook, so one NaN raw reward spoils its whole
group) gives its sample a baseline advantage of 0 [ours]: no task signal, while the DC-GRPO penalty, a function of
the log-probs only, still applies. The fraction of such samples is logged as ``mismatch_ctrl/nonfinite_reward_fraction``
(per-sample 0/1 values: slime's rollout logging averages them over the global batch).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch

from .. import host
from ..errors import InputError
from ..formatting import brief
from .runtime import Runtime

NONFINITE_REWARDS = "mismatch_ctrl/nonfinite_reward_fraction"
REQUIRED_KEYS = ("rewards", "response_lengths", "total_lengths", "loss_masks")
TENSOR_LISTS = ("loss_masks", "rollout_log_probs", "log_probs", "kl")
REWARD_MAX = float(torch.finfo(torch.float32).max) / 2
"""The largest reward magnitude taken as a reward: half the largest float32 leaves room for the DC-GRPO penalty (at
most ``dcgrpo.PENALTY_MAX`` per token), so a shaped advantage is finite in float32; a larger one counts as infinite."""
MAX_LENGTH = 2**53
"""The longest response or sequence: a length above it is no token count (and not exact as a float or in int64
index arithmetic)."""


def check_rollout_data(rollout_data: Any, runtime: Runtime) -> list[float]:
    """Check ``rollout_data`` of the advantage hook; return the rewards as finite floats (NaN/inf -> 0, counted in
    ``rollout_data[NONFINITE_REWARDS]`` with a one-time warning)."""
    if not isinstance(rollout_data, dict):
        raise InputError(f"rollout_data must be slime's dict of per-sample lists, got {type(rollout_data).__name__}")
    missing = [key for key in REQUIRED_KEYS if rollout_data.get(key) is None]
    if missing:
        raise InputError(f"rollout_data has no {', '.join(map(repr, missing))} (or it is None; keys present: "
                         f"{brief(sorted(map(str, rollout_data)), 200)}); the advantage hook needs slime's "
                         "rollout_data as --custom-advantage-function-path receives it (SLIME.md section 1)")
    n = check_lengths(rollout_data["total_lengths"], rollout_data["response_lengths"])
    for key in TENSOR_LISTS:
        if rollout_data.get(key) is not None:
            check_tensor_list(key, rollout_data[key], n)
    check_one_device({key: rollout_data[key] for key in TENSOR_LISTS if rollout_data.get(key) is not None})
    rewards = reward_list(rollout_data["rewards"], n)
    bad = [not math.isfinite(r) or abs(r) > REWARD_MAX for r in rewards]
    if any(bad):
        runtime.warn_once("nonfinite_rewards", f"mismatch_ctrl: {sum(bad)} of {n} samples on this rank have a NaN or "
                          f"infinite reward (or one beyond +-{REWARD_MAX:.3g}, half the largest float32); their "
                          "advantage is 0 (the fraction is logged as "
                          f"rollout/{NONFINITE_REWARDS}); check the reward function")
        rewards = [0.0 if b else r for r, b in zip(rewards, bad)]
    if n:
        rollout_data[NONFINITE_REWARDS] = [float(b) for b in bad]
    return rewards


def check_tis_inputs(pg_loss: Any, train_log_probs: Any, rollout_log_probs: Any, loss_masks: Any, total_lengths: Any,
                     response_lengths: Any) -> None:
    """Check the keyword arguments slime passes the TIS hook (``loss.py`` ``tis_kwargs``)."""
    if isinstance(pg_loss, torch.Tensor):
        check_plain("pg_loss", pg_loss)
    if not isinstance(pg_loss, torch.Tensor) or pg_loss.dim() != 1:
        got = f"a tensor of shape {tuple(pg_loss.shape)}" if isinstance(pg_loss, torch.Tensor) else \
            type(pg_loss).__name__
        raise InputError(f"pg_loss must be slime's flat per-token loss tensor (1-D, one value per response token of "
                         f"this rank's samples, in sample order), got {got}")
    if not pg_loss.is_floating_point():
        raise InputError(f"pg_loss must hold slime's floating-point per-token loss, got dtype {pg_loss.dtype}: "
                         "weighting it would truncate the weights (check which tensor was passed)")
    n = check_lengths(total_lengths, response_lengths)
    if rollout_log_probs is None:
        raise InputError("rollout_log_probs is None: the TIS hook compares the rollout engine's log-probs with the "
                         "training engine's; slime records them with its SGLang rollout (a custom generate function "
                         "must set sample.rollout_log_probs)")
    for name, value in (("train_log_probs", train_log_probs), ("rollout_log_probs", rollout_log_probs),
                        ("loss_masks", loss_masks)):
        check_tensor_list(name, value, n)
    if n and train_log_probs[0].device != pg_loss.device:
        raise InputError(f"pg_loss is on {pg_loss.device} but train_log_probs of sample 0 is on "
                         f"{train_log_probs[0].device}: slime passes every tensor of the loss on the training device")
    check_has_data("pg_loss", pg_loss)


def check_lengths(total_lengths: Any, response_lengths: Any) -> int:
    """Both per-sample length lists are integers >= 0 of one count, each total covering its response."""
    for name, values in (("response_lengths", response_lengths), ("total_lengths", total_lengths)):
        if not isinstance(values, (list, tuple)):
            raise InputError(f"{name} must be a list of integers (one per sample), got {type(values).__name__}")
        for i, v in enumerate(values):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not 0 <= v <= MAX_LENGTH:
                raise InputError(f"{name}[{i}] must be a token count, an integer from 0 to 2^53, got {brief(v)} "
                                 f"({type(v).__name__}); slime passes one Python int per sample")
    if len(total_lengths) != len(response_lengths):
        raise InputError(f"total_lengths has {len(total_lengths)} samples but response_lengths has "
                         f"{len(response_lengths)}")
    for i, (total, response) in enumerate(zip(total_lengths, response_lengths)):
        if total < response:
            raise InputError(f"sample {i}: total_lengths {total} < response_lengths {response}; the total is prompt "
                             "plus response tokens")
    return len(response_lengths)


def check_tensor_list(name: str, values: Any, n: int) -> None:
    """``values`` is a list of ``n`` tensors (one per sample), each dense and at most 1-D (a 0-d one is refused by its
    token count later)."""
    if not isinstance(values, (list, tuple)):
        raise InputError(f"{name} must be a list of tensors (one per sample), got {type(values).__name__}")
    if len(values) != n:
        raise InputError(f"{name} has {len(values)} samples but response_lengths has {n}")
    for i, t in enumerate(values):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"sample {i}: {name} must be a tensor, got {type(t).__name__}")
        check_plain(f"sample {i}: {name}", t)
        if t.dim() > 1:
            raise InputError(f"sample {i}: {name} must be 1-D (one value per token of the sample), got a tensor of "
                             f"shape {tuple(t.shape)}: slime passes one flat tensor per sample (check what reshaped "
                             "it)")


def check_plain(name: str, t: torch.Tensor) -> None:
    """``t`` is a dense tensor of plain values, as slime passes them: a sparse, nested or quantised tensor would fail
    deep inside a torch op (or read its storage, not its values)."""
    if t.is_nested or t.layout != torch.strided:
        kind = "nested" if t.is_nested else str(t.layout).removeprefix("torch.")
        raise InputError(f"{name} is a {kind} tensor; the hooks read dense tensors (slime passes dense ones): pass "
                         "t.to_dense() or the dense tensor it came from")
    if t.is_quantized:
        raise InputError(f"{name} is a quantised tensor ({t.dtype}); the hooks read plain values: pass "
                         "t.dequantize()")


def check_one_device(lists: dict[str, Any]) -> None:
    """Every tensor of the per-sample ``lists`` is on the device of the first one (slime builds them all on the
    training device; a tensor elsewhere would fail deep inside a torch op), a device that holds values."""
    first = None
    for name, values in lists.items():
        for i, t in enumerate(values):
            if first is None:
                first = (f"{name}[{i}]", t.device)
                check_has_data(f"rollout_data {first[0]}", t)
            elif t.device != first[1]:
                raise InputError(f"rollout_data {name}[{i}] is on {t.device} but {first[0]} is on {first[1]}: slime "
                                 "passes every per-token tensor on the training device (check what moved it)")


def reward_list(rewards: Any, n: int) -> list[float]:
    """slime's rewards (python floats; a 1-D tensor is accepted) as ``n`` floats."""
    if isinstance(rewards, torch.Tensor):
        if rewards.dim() != 1:
            raise InputError(f"rewards must hold one number per sample, got a tensor of shape {tuple(rewards.shape)}")
        check_real("rewards", rewards)
        rewards = host.fetch(rewards)
    if not isinstance(rewards, (list, tuple)):
        raise InputError(f"rewards must be a list of numbers (one per sample), got {type(rewards).__name__}")
    if len(rewards) != n:
        raise InputError(f"rewards has {len(rewards)} samples but response_lengths has {n}; slime passes one reward "
                         "per sample")
    out = []
    for i, r in enumerate(rewards):
        if isinstance(r, torch.Tensor) and r.numel() == 1:
            check_real(f"rewards[{i}]", r)
            (r,) = host.fetch(r)
        if isinstance(r, bool) or not isinstance(r, numbers.Real):
            raise InputError(f"rewards[{i}] must be a number, got {brief(r)}")
        try:
            out.append(float(r))
        except OverflowError:  # an integer beyond float range
            out.append(math.inf)
    return out


def check_real(name: str, t: torch.Tensor) -> None:
    """A reward tensor holds real numbers: a complex one would lose its imaginary part, and booleans are refused as in
    the list (``True`` is no reward)."""
    if t.is_complex() or t.dtype == torch.bool:
        raise InputError(f"{name} must hold real numbers, got a tensor of dtype {t.dtype} (check the reward function)")
    check_has_data(name, t)


def check_has_data(name: str, t: torch.Tensor) -> None:
    """``t`` holds values: a tensor on the ``meta`` device has a shape only (a model built on meta and never
    materialised)."""
    if t.device.type == "meta":
        raise InputError(f"{name} is on the meta device, which holds shapes but no values: pass the tensor on the "
                         "training device (slime's are on the GPU)")
