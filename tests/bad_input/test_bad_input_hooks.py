"""Property test of the two data hooks, called as slime calls them: random lengths (including 0), random loss masks,
log-probs mixing ordinary values with NaN, +-inf, rounding above 0 and impossible values, rewards with NaN/inf, and
now and then a defect (a loss mask of 2 or -1, a rewards list of the wrong length, a log-prob tensor one token short).
Either every output is finite (and the returned masks are 0/1), or the hook raises InputError naming the field, and
it raises exactly when a defect was injected."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from slime_data import PREFIX, make_args, method

from mismatch_ctrl.errors import InputError
from mismatch_ctrl.slime import hooks

pytestmark = pytest.mark.filterwarnings("ignore:mismatch_ctrl. trained tokens with a NaN/inf:RuntimeWarning")

METHODS = {name: method(name) for name in ("grpo", "dcgrpo", "geo_mis", "token_tis", "icepop", "acrl")}
LOG_PROBS = st.one_of(st.floats(-30.0, 0.0), st.sampled_from([0.0, 1e-4, 0.5, 40.0, math.nan, math.inf, -math.inf]))
REWARDS = st.one_of(st.floats(-3.0, 3.0), st.sampled_from([math.nan, math.inf, -math.inf, 1e39]))
FIELDS = ("rewards", "loss_masks", "loss mask", "log_probs", "rollout_log_probs")


@st.composite
def slime_inputs(draw):
    """rollout_data of one rank (CP = 1) and the defects injected into it."""
    lengths = draw(st.lists(st.integers(0, 12), min_size=0, max_size=6))
    n = len(lengths)
    defects = []

    def tensor(values):
        return torch.tensor(values, dtype=torch.float32)

    masks = [torch.tensor(draw(st.lists(st.sampled_from([0, 1, 1]), min_size=k, max_size=k)), dtype=torch.int32)
             for k in lengths]
    train = [tensor(draw(st.lists(LOG_PROBS, min_size=k, max_size=k))) for k in lengths]
    rollout = [tensor(draw(st.lists(LOG_PROBS, min_size=k, max_size=k))) for k in lengths]
    rewards = draw(st.lists(REWARDS, min_size=n, max_size=n))
    defect = draw(st.sampled_from(["none"] * 6 + ["mask", "rewards", "short"]))
    nonempty = [i for i, k in enumerate(lengths) if k]
    if defect == "mask" and nonempty:
        i = draw(st.sampled_from(nonempty))
        masks[i][draw(st.integers(0, lengths[i] - 1))] = draw(st.sampled_from([2, -1]))
        defects.append("loss mask")
    elif defect == "rewards":
        rewards = rewards + [0.5]
        defects.append("rewards")
    elif defect == "short" and nonempty:
        i = draw(st.sampled_from(nonempty))
        rollout[i] = rollout[i][:-1]
        defects.append("rollout_log_probs")
    data = {"rewards": rewards, "response_lengths": lengths, "total_lengths": [k + 3 for k in lengths],
            "loss_masks": masks, "log_probs": train, "rollout_log_probs": rollout,
            "kl": [torch.zeros(k) for k in lengths]}
    return data, defects


def call_or_error(call, defects):
    """The hook's result, or None after checking the InputError names a field and a defect was injected."""
    try:
        result = call()
    except InputError as exc:
        assert defects, f"InputError without a defect: {exc}"
        assert any(name in str(exc) for name in FIELDS), str(exc)
        return None
    assert not defects, f"defect {defects} accepted"
    return result


@settings(max_examples=60, deadline=None)
@given(slime_inputs(), st.sampled_from(sorted(METHODS)))
def test_advantage_hook_gives_finite_outputs_or_a_named_error(case, name):
    data, defects = case
    args = make_args(METHODS[name])
    if call_or_error(lambda: hooks.advantages(args, data), defects) is None and defects:
        return
    assert len(data["advantages"]) == len(data["response_lengths"])
    for adv, k in zip(data["advantages"], data["response_lengths"]):
        assert adv.numel() == k and bool(torch.isfinite(adv).all())
    for key, values in data.items():
        if key.startswith(PREFIX):
            assert all(math.isfinite(v) for v in values), key


@settings(max_examples=60, deadline=None)
@given(slime_inputs(), st.sampled_from(sorted(METHODS)), st.integers(0, 2**31 - 1))
def test_correction_hook_gives_finite_outputs_or_a_named_error(case, name, seed):
    data, defects = case
    defects = [d for d in defects if d != "rewards"]  # the TIS hook gets no rewards
    tokens = sum(data["response_lengths"])
    pg_loss = torch.randn(tokens, generator=torch.Generator().manual_seed(seed)).requires_grad_(True)
    args = make_args(METHODS[name])
    result = call_or_error(lambda: hooks.rollout_correction(
        args=args, pg_loss=pg_loss, train_log_probs=data["log_probs"], rollout_log_probs=data["rollout_log_probs"],
        loss_masks=data["loss_masks"], total_lengths=data["total_lengths"],
        response_lengths=data["response_lengths"]), defects)
    if result is None:
        return
    out, masks, metrics = result
    assert out.shape == pg_loss.shape and bool(torch.isfinite(out).all())
    out.sum().backward()
    assert bool(torch.isfinite(pg_loss.grad).all())
    for mask, k in zip(masks, data["response_lengths"]):
        assert mask.numel() == k and bool(((mask == 0) | (mask == 1)).all())
    for key, value in metrics.items():
        assert value.shape == pg_loss.shape and bool(torch.isfinite(value).all()), key
