"""Issue 17 through slime's advantage call site: a discrepancy floor that ramps from 0.003 to 0.07 over 40 rollouts
and then stays for 60 more. With the shipped ``configs/methods/dcgrpo.yaml`` and the MoE defaults the multiplier is
not left at lambda_max for the plateau; the paper's method (``dcgrpo_paper.yaml``) is; the guard resumes exactly
from a checkpoint in the middle of a streak."""

from __future__ import annotations

import torch
from slime_data import GROUP, PREFIX, make_args, method, group_normalize

from mismatch_ctrl.slime import hooks
from mismatch_ctrl.slime.names import TRACKER
from mismatch_ctrl.slime.runtime import get_runtime
from mismatch_ctrl.state import StateStore

RAMP, PLATEAU = 40, 60


def floor(r: int) -> float:
    """The stream's per-token |p_train - p_rollout| at rollout r."""
    return 0.003 + (0.07 - 0.003) * min(r, RAMP - 1) / (RAMP - 1)


def rollout_data(r: int, groups: int = 4) -> dict:
    """slime-shaped rollout data whose every trained token has |p_train - p_rollout| = floor(r) exactly (so
    C_bar = floor(r)); rewards vary within some prompt groups and are all equal in others."""
    g = torch.Generator().manual_seed(r)
    n = groups * GROUP
    lengths = (8 + 24 * torch.rand(n, generator=g)).long().tolist()
    raw = (torch.rand(n, generator=g) < 0.5).double()
    raw[:GROUP] = 1.0  # one group with equal rewards: advantage 0
    data = {"rewards": group_normalize(raw), "response_lengths": lengths,
            "total_lengths": [n_ + 10 for n_ in lengths], "loss_masks": [], "rollout_log_probs": [], "log_probs": [],
            "kl": []}
    for n_ in lengths:
        p = 0.2 + 0.6 * torch.rand(n_, generator=g, dtype=torch.float64)
        sign = torch.where(torch.rand(n_, generator=g) < 0.5, -1.0, 1.0).double()
        data["rollout_log_probs"].append(p.log().float())
        data["log_probs"].append((p + sign * floor(r)).log().float())
        data["loss_masks"].append(torch.ones(n_, dtype=torch.int32))
        data["kl"].append(torch.zeros(n_))
    return data


def lambdas(args, rollouts: range) -> list[float]:
    """``lambda_next`` after each rollout, as slime logs it (rollout/mismatch_ctrl/lambda_next)."""
    out = []
    for r in rollouts:
        data = rollout_data(r)
        hooks.advantages(args, data)
        out.append(data[PREFIX + "lambda_next"][0])
    return out


def test_drift_guard_frees_the_multiplier_on_the_plateau():
    shipped, paper = make_args(method("dcgrpo")), make_args(method("dcgrpo_paper"))
    for args in (shipped, paper):
        hooks.on_megatron_init(args)
    lam, paper_lam = lambdas(shipped, range(RAMP + PLATEAU)), lambdas(paper, range(RAMP + PLATEAU))
    assert all(x == 1.0 for x in paper_lam[RAMP:])  # the paper's multiplier stays pinned for the whole plateau
    plateau = lam[RAMP:]
    assert max(plateau) < 0.3 and plateau[-1] == 0.0
    data = rollout_data(0)
    hooks.advantages(shipped, data)
    assert data[PREFIX + "drift_guard_lifts"][0] >= 1 and data[PREFIX + "eps"][0] > 0.07


def test_drift_guard_state_resumes_exactly(tmp_path):
    common = {"save_interval": 1, "num_rollout": RAMP + PLATEAU}
    uninterrupted = make_args(method("dcgrpo"), **common)
    hooks.on_megatron_init(uninterrupted)
    want = lambdas(uninterrupted, range(RAMP + 20))
    first = make_args(method("dcgrpo"), save=str(tmp_path), **common)
    hooks.on_megatron_init(first)
    got = lambdas(first, range(RAMP))
    store = StateStore(tmp_path / "mismatch_ctrl")
    states = {r: store.load(r)["dcgrpo"] for r in range(RAMP)}
    # the last checkpoint in the middle of a streak: the guard has counted rollouts and lifts after the resume
    checkpoint = max(r for r, state in states.items() if len(state["streak"]) >= 5)
    (tmp_path / TRACKER).write_text(f"{checkpoint}\n")
    resumed = make_args(method("dcgrpo"), save=str(tmp_path), load=str(tmp_path), **common)
    hooks.on_megatron_init(resumed)
    got = got[:checkpoint + 1] + lambdas(resumed, range(checkpoint + 1, RAMP + 20))
    assert got == want
    assert get_runtime(resumed).controllers.dcgrpo.lifts > states[checkpoint]["lifts"]
