"""The hooks count what they drop and refuse what they cannot read: tokens the TIS hook's guard drops are a
``train/mismatch_ctrl/`` metric at every call (also when they go bad only in a later optimizer step), a weighted
``pg_loss`` that overflows is counted, advantages are float32 whatever the dtype of ``kl``, ``kl``'s lengths are
checked, and sparse, nested or quantised tensors are refused by name."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from slime_data import make_args, method

from mismatch_ctrl.batch import DROPPED_WARNING, LOG_PROB_TOLERANCE
from mismatch_ctrl.errors import InputError
from mismatch_ctrl.slime import hooks
from mismatch_ctrl.slime.inputs import REWARD_MAX

pytestmark = [pytest.mark.filterwarnings("ignore:mismatch_ctrl. trained tokens with a NaN/inf:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning")]  # torch's notes on sparse, nested, quantised tensors
PREFIX = "mismatch_ctrl/"


def rollout(seed: int, n: int = 8, bad: float = 0.0) -> dict:
    """slime's rollout_data of one rank; with ``bad`` > 0, that share of trained tokens has an unusable log-prob
    (NaN, +-inf, above 0) in one engine or the other."""
    g = torch.Generator().manual_seed(seed)
    lengths = [int(x) for x in torch.randint(1, 12, (n,), generator=g)]
    masks = [(torch.rand(k, generator=g) > 0.25).int() for k in lengths]
    roll = [-torch.rand(k, generator=g) * 3 for k in lengths]
    train = [r + 0.05 * torch.randn(k, generator=g) for r, k in zip(roll, lengths)]
    train = [t.clamp(max=0.0) for t in train]
    if bad:
        for i, k in enumerate(lengths):
            for j in range(k):
                if torch.rand(1, generator=g).item() < bad:
                    value = [math.nan, math.inf, -math.inf, 0.5][int(torch.randint(0, 4, (1,), generator=g))]
                    (train if torch.rand(1, generator=g).item() < 0.5 else roll)[i][j] = value
    return {"rewards": [float(torch.randn(1, generator=g)) for _ in lengths], "response_lengths": lengths,
            "total_lengths": [k + 4 for k in lengths], "loss_masks": masks, "log_probs": train,
            "rollout_log_probs": roll, "kl": [torch.zeros(k) for k in lengths]}


def unusable(x: torch.Tensor) -> torch.Tensor:
    """An independent reading of the guard's rule: NaN, +-inf or above 0 by more than rounding."""
    return ~torch.isfinite(x) | (x > LOG_PROB_TOLERANCE)


def tis_call(args, data, pg_loss=None):
    n = sum(data["response_lengths"])
    pg = torch.linspace(-1.0, 1.0, n) if pg_loss is None else pg_loss
    return hooks.rollout_correction(
        args, pg_loss=pg, train_log_probs=data["log_probs"], rollout_log_probs=data["rollout_log_probs"],
        loss_masks=[m.clone() for m in data["loss_masks"]], total_lengths=data["total_lengths"],
        response_lengths=data["response_lengths"])


def per_sample_mean(token_metric: torch.Tensor, data: dict) -> list[float]:
    """slime's reduction of a token-shaped metric: per sample, the mean over its (original) loss mask."""
    out = []
    for value, mask in zip(torch.split(token_metric, data["response_lengths"]), data["loss_masks"]):
        out.append(float((value * mask).sum() / mask.sum().clamp(min=1)))
    return out


@pytest.mark.parametrize("name", ["grpo", "token_tis", "geo_mis", "icepop"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_tokens_that_go_bad_in_a_later_step_are_counted_per_step(name, seed):
    args = make_args(method(name))
    clean = rollout(seed)
    hooks.advantages(args, {**clean})  # the rollout's advantages: every log-prob usable then
    later = rollout(seed, bad=0.3)  # the same samples in a later optimizer step: some log-probs went bad
    later["rollout_log_probs"] = later["rollout_log_probs"]
    _, _, metrics = tis_call(args, later)
    got = per_sample_mean(metrics[PREFIX + "nonfinite_token_fraction"], later)
    want = []
    for t, r, m in zip(later["log_probs"], later["rollout_log_probs"], later["loss_masks"]):
        dropped = [bool(m[j]) and bool(unusable(t[j]) or unusable(r[j])) for j in range(len(m))]
        want.append(sum(dropped) / max(int(m.sum()), 1))
    assert got == pytest.approx(want, abs=1e-6)
    assert any(want), "the case drops no token"


def test_a_clean_call_reports_zero_dropped():
    args = make_args(method("token_tis"))
    data = rollout(7)
    hooks.advantages(args, {**data})
    _, _, metrics = tis_call(args, data)
    assert metrics[PREFIX + "nonfinite_token_fraction"].abs().sum() == 0


def test_the_warning_names_the_metrics_that_count():
    args = make_args(method("grpo"))
    data = rollout(4, bad=0.3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tis_call(args, data)
    assert any(str(w.message) == DROPPED_WARNING for w in caught)
    assert "train/mismatch_ctrl/nonfinite_token_fraction" in DROPPED_WARNING
    assert "rollout/mismatch_ctrl/nonfinite_tokens" in DROPPED_WARNING


def test_a_weighted_pg_loss_that_overflows_is_counted():
    """token TIS weights min(rho, 2): a finite pg_loss near the float32 maximum times a weight above 1 is inf."""
    args = make_args(method("token_tis"))
    data = rollout(5)
    data["log_probs"] = [(r + 0.3 * torch.tensor([(-1.0) ** j for j in range(len(r))])).clamp(max=0.0)
                         for r in data["rollout_log_probs"]]  # rho of e^0.3 and e^-0.3 (or 1 where clamped)
    hooks.advantages(args, {**data})
    n = sum(data["response_lengths"])
    pg = torch.full((n,), 3.0e38)
    pg_out, _, metrics = tis_call(args, data, pg)
    train, roll, mask = (torch.cat(data[k]).float() for k in ("log_probs", "rollout_log_probs", "loss_masks"))
    weight = torch.exp(train - roll).clamp(max=2.0)
    want = torch.isinf(pg * weight) & (mask > 0)
    got = metrics[PREFIX + "pg_loss_overflow_fraction"]
    assert torch.equal(got > 0, want) and want.any() and not want.all()
    assert torch.equal(torch.isinf(pg_out.detach()), want)


def test_no_overflow_is_counted_on_ordinary_losses():
    args = make_args(method("geo_mis"))
    data = rollout(6)
    hooks.advantages(args, {**data})
    _, _, metrics = tis_call(args, data)
    assert metrics[PREFIX + "pg_loss_overflow_fraction"].abs().sum() == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_builtin_advantages_are_at_least_float32_whatever_kls_dtype(dtype):
    args = make_args(method("grpo"))
    data = rollout(8)
    data["kl"] = [torch.zeros(k, dtype=dtype) for k in data["response_lengths"]]
    data["rewards"] = [1.0e5 * (-1) ** i for i in range(len(data["rewards"]))]  # beyond float16's 65504
    hooks.advantages(args, data)
    for adv, reward in zip(data["advantages"], data["rewards"]):
        assert adv.dtype == torch.float32 and torch.equal(adv, torch.full_like(adv, reward))


def test_builtin_advantages_keep_a_float64_kl():
    args = make_args(method("grpo"))
    data = rollout(9)
    data["kl"] = [torch.zeros(k, dtype=torch.float64) for k in data["response_lengths"]]
    hooks.advantages(args, data)
    assert all(a.dtype == torch.float64 for a in data["advantages"])


def test_a_reward_beyond_half_the_float32_range_counts_as_infinite():
    args = make_args(method("dcgrpo"))
    data = rollout(10)
    data["rewards"][2] = REWARD_MAX * 1.5
    data["rewards"][5] = -REWARD_MAX * 0.999
    hooks.advantages(args, data)
    assert data[PREFIX + "nonfinite_reward_fraction"] == [1.0 if i == 2 else 0.0 for i in range(8)]
    assert all(torch.isfinite(a).all() for a in data["advantages"])


@pytest.mark.parametrize("name", ["grpo", "dcgrpo"])
def test_kl_lengths_are_checked_against_the_responses(name):
    args = make_args(method(name))
    data = rollout(11)
    data["kl"][3] = torch.zeros(data["response_lengths"][3] + 1)
    with pytest.raises(InputError, match=r"sample 3: kl has \d+ tokens but the response has"):
        hooks.advantages(args, data)


def odd_tensors(t: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"sparse_coo": t.to_sparse(), "sparse_csr": t.unsqueeze(0).to_sparse_csr(),
            "nested": torch.nested.nested_tensor([t]),
            "quantised": torch.quantize_per_tensor(t.float(), 0.1, 0, torch.qint8)}


@pytest.mark.parametrize("field", ["log_probs", "rollout_log_probs", "loss_masks", "kl"])
@pytest.mark.parametrize("kind", ["sparse_coo", "sparse_csr", "nested", "quantised"])
def test_an_unsupported_tensor_is_refused_by_name_in_the_advantage_hook(field, kind):
    args = make_args(method("dcgrpo"))
    data = rollout(12)
    data[field][1] = odd_tensors(data[field][1])[kind]
    with pytest.raises(InputError, match=rf"sample 1: {field} is a .*(sparse|nested|quantised)"):
        hooks.advantages(args, data)


@pytest.mark.parametrize("field", ["pg_loss", "train_log_probs", "loss_masks"])
@pytest.mark.parametrize("kind", ["sparse_coo", "nested", "quantised"])
def test_an_unsupported_tensor_is_refused_by_name_in_the_tis_hook(field, kind):
    args = make_args(method("token_tis"))
    data = rollout(13)
    hooks.advantages(args, {**data})
    n = sum(data["response_lengths"])
    kwargs = {"pg_loss": torch.linspace(-1, 1, n), "train_log_probs": list(data["log_probs"]),
              "rollout_log_probs": data["rollout_log_probs"], "loss_masks": list(data["loss_masks"]),
              "total_lengths": data["total_lengths"], "response_lengths": data["response_lengths"]}
    if field == "pg_loss":
        kwargs["pg_loss"] = odd_tensors(kwargs["pg_loss"])[kind]
    else:
        kwargs[field][0] = odd_tensors(kwargs[field][0])[kind]
    with pytest.raises(InputError, match=rf"{field} is a .*(sparse|nested|quantised)"):
        hooks.rollout_correction(args, **kwargs)
