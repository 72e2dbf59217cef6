"""The advantage hook on every rank of real megatron worlds equals the single-process hook on the global batch.

Worlds: TP = PP = CP = 1; CP 2; DP 2 x CP 2; TP 2 x DP 2; TP 2 x CP 2 (real ``megatron.core.parallel_state`` over
gloo; tensor-parallel peers hold identical data and must not be counted twice), plus megatron imported but not
initialised (the CPU lab). The reference is the same hook in the pytest process with megatron blocked, on
all samples at full length, sliced afterwards to each rank's samples and our own zigzag CP positions.
"""

from __future__ import annotations

import math

import pytest
import torch
from slime_compare import WORLD_IDS, assert_tree_close, rank_name, tolerance
from slime_data import PREFIX, View, cp_positions, cp_slice, local_samples, partition
from slime_scenarios import ADVANTAGE_METHODS, NOISE, advantage_batch

ALL_WORLDS = [0, 1, 2, 4, "w4tp", "w4tpcp"]
LAYOUTS = {1: (1, 1), 2: (1, 2), 4: (1, 2), "w4tp": (2, 1), "w4tpcp": (2, 2)}
"""World -> (TP, CP) sizes; DP is the rest of the 4 (or 2, 1) processes."""
WITHOUT_DCGRPO = ["grpo", "acrl"]
DCGRPO_METHODS = [m for m in ADVANTAGE_METHODS if m not in WITHOUT_DCGRPO]


def local_reference(full: list[torch.Tensor], name: str, r: int, view: View) -> list[torch.Tensor]:
    """The reference's per-sample tensors (global order, full length) cut to this rank's samples and CP positions."""
    batch = advantage_batch(name, r)
    return [cp_slice(full[g], batch.total_lengths[g], batch.response_lengths[g], view)
            for g in local_samples(batch, view)]


@pytest.mark.parametrize("world", list(LAYOUTS), ids=WORLD_IDS.get)
def test_megatron_layout_of_the_worlds(runs, world):
    """The ranks see the TP x DP x CP layout megatron promises (so the comparisons below cover what they claim)."""
    views = [r["view"] for r in runs.world(world, "advantages/grpo")]
    tp, cp = LAYOUTS[world]
    size = len(views)
    dp = size // (tp * cp)
    assert sorted(views, key=repr) == sorted((View(d, dp, c, cp, True, t, tp) for d in range(dp) for c in range(cp)
                                              for t in range(tp)), key=repr)


def test_dp_partition_splits_prompt_groups():
    """slime does not align prompt groups to DP ranks; the test data must not either."""
    ranks = partition(16, 2)
    assert sorted(ranks[0] + ranks[1]) == list(range(16)) and len(ranks[0]) != len(ranks[1])
    assert {g // 4 for g in ranks[0]} & {g // 4 for g in ranks[1]}


@pytest.mark.parametrize("world", ALL_WORLDS, ids=WORLD_IDS.get)
@pytest.mark.parametrize("name", list(ADVANTAGE_METHODS))
def test_advantages_equal_the_single_process_reference(runs, name, world):
    """Per rank and rollout: CP-local advantages (and returns) equal the reference's, sliced; every metric list has
    one value per local sample, equal to the reference's; the controller state equals the reference's."""
    rtol, atol = tolerance(world)
    reference = runs.reference[f"advantages/{name}"]
    for rank in runs.world(world, f"advantages/{name}"):
        view, rollouts = rank["view"], rank["result"]
        for r, (got, ref) in enumerate(zip(rollouts, reference, strict=True)):
            where = f"{name} rollout {r} ({rank_name(view)})"
            expected = local_reference(ref["advantages"], name, r, view)
            assert_tree_close(got["advantages"], expected, rtol, atol, f"{where} advantages")
            assert_tree_close(got["returns"], got["advantages"], path=f"{where} returns")
            n_local = len(local_samples(advantage_batch(name, r), view))
            assert sorted(got["metrics"]) == sorted(ref["metrics"]), where
            for key, values in got["metrics"].items():
                assert len(values) == n_local and len(set(values)) == 1, f"{where} {key}: {values}"
                assert_tree_close(values[0], ref["metrics"][key][0], rtol, atol, f"{where} {key}")
            assert_tree_close(got["state"], ref["state"], rtol, atol, f"{where} state")
            assert_tree_close(got["lr_scale"], ref["lr_scale"], rtol, atol, f"{where} lr_scale")


@pytest.mark.parametrize("world", [2, 4, "w4tp", "w4tpcp"], ids=WORLD_IDS.get)
@pytest.mark.parametrize("name", list(ADVANTAGE_METHODS))
def test_controller_state_identical_on_every_rank(runs, name, world):
    """lambda, eps, the LR scale, the whole state dict and every metric are bit-identical across ranks."""
    ranks = runs.world(world, f"advantages/{name}")
    first = ranks[0]["result"]
    for rank in ranks[1:]:
        for r, (a, b) in enumerate(zip(rank["result"], first)):
            assert a["state"] == b["state"], f"rollout {r}: {rank_name(rank['view'])} differs from rank 0"
            assert a["lr_scale"] == b["lr_scale"]
            assert {k: v[0] for k, v in a["metrics"].items()} == {k: v[0] for k, v in b["metrics"].items()}


@pytest.mark.parametrize("name", list(ADVANTAGE_METHODS))
def test_context_parallel_2_equals_context_parallel_1(runs, name):
    """CP 2 reassembled to full sequences equals CP 1 (both real megatron worlds)."""
    cp1 = runs.world(1, f"advantages/{name}")[0]["result"]
    ranks = runs.world(2, f"advantages/{name}")
    for r in range(len(NOISE)):
        batch = advantage_batch(name, r)
        for g, expected in enumerate(cp1[r]["advantages"]):
            full = torch.full((batch.response_lengths[g],), math.nan)
            for rank in ranks:
                view = rank["view"]
                full[cp_positions(batch.total_lengths[g], batch.response_lengths[g], view.cp_rank, view.cp_size)] = \
                    rank["result"][r]["advantages"][g]
            assert_tree_close(full, expected, *tolerance(2), path=f"{name} rollout {r} sample {g}")
        assert_tree_close(ranks[0]["result"][r]["state"], cp1[r]["state"], *tolerance(2), path=f"{name} state")


@pytest.mark.parametrize("world", ALL_WORLDS, ids=WORLD_IDS.get)
@pytest.mark.parametrize("name", WITHOUT_DCGRPO)
def test_advantages_without_dcgrpo_are_slimes_builtin_grpo(runs, name, world):
    """Without DC-GRPO the hook returns exactly slime's built-in GRPO: ``torch.ones_like(kl[i]) * rewards[i]``."""
    for rank in runs.world(world, f"advantages/{name}"):
        view = rank["view"]
        for r, got in enumerate(rank["result"]):
            batch = advantage_batch(name, r)
            for k, g in enumerate(local_samples(batch, view)):
                kl = torch.zeros(len(cp_positions(batch.total_lengths[g], batch.response_lengths[g], view.cp_rank,
                                                  view.cp_size)))
                builtin = torch.ones_like(kl) * batch.rewards[g]
                assert torch.equal(got["advantages"][k], builtin), f"rollout {r} sample {g} ({rank_name(view)})"


@pytest.mark.parametrize("name", DCGRPO_METHODS)
def test_reference_dcgrpo_shapes_the_advantages(runs, name):
    """Guards the comparisons above against a vacuous reference: DC-GRPO moves lambda and the advantages leave the
    rewards on trained tokens whenever lambda > 0 (and equal them while eps: auto calibrates with lambda = 0)."""
    reference = runs.reference[f"advantages/{name}"]
    lambdas = [ref["metrics"][PREFIX + "lambda"][0] for ref in reference]
    assert len(set(lambdas)) > 2, lambdas
    for r, ref in enumerate(reference):
        batch = advantage_batch(name, r)
        rewards = [torch.full((n,), batch.rewards[g]) for g, n in enumerate(batch.response_lengths)]
        moved = any(not torch.equal(a, b) for a, b in zip(ref["advantages"], rewards))
        assert moved == (lambdas[r] > 0), f"rollout {r}: lambda {lambdas[r]}"


def test_reference_acrl_band_moves(runs):
    widths = [ref["state"]["acrl"]["c"] for ref in runs.reference["advantages/acrl"]]
    assert len(set(widths)) > 2, widths


@pytest.mark.parametrize("world", ALL_WORLDS, ids=WORLD_IDS.get)
def test_nonfinite_log_probs_are_counted_and_kept_out(runs, world):
    """Non-finite log-probs at trained tokens are counted (over all CP shards and DP ranks) in the nonfinite_tokens
    metric; those at untrained tokens are not; the advantages stay finite."""
    for rank in runs.world(world, "advantages/dcgrpo"):
        for r, got in enumerate(rank["result"]):
            batch = advantage_batch("dcgrpo", r)
            expected = sum(len(bad) for bad in batch.nonfinite)
            assert expected > 0
            assert got["metrics"][PREFIX + "nonfinite_tokens"][0] == expected
            assert all(bool(torch.isfinite(a).all()) for a in got["advantages"])


@pytest.mark.parametrize("world", ALL_WORLDS, ids=WORLD_IDS.get)
@pytest.mark.parametrize("name", list(ADVANTAGE_METHODS))
def test_each_rollout_reduces_once_over_cp_and_once_over_dp(runs, name, world):
    """One gather over the context-parallel group (if CP > 1) completes the statistics table, one over the
    data-parallel group (if DP > 1) all the batch numbers, the mean response length included: at most 2 collectives
    per rollout (issue 11's budget is 3)."""
    for rank in runs.world(world, f"advantages/{name}"):
        view = rank["view"]
        expected = (view.cp_size > 1) + (view.dp_size > 1)
        assert [r["collectives"] for r in rank["result"]] == [expected] * len(NOISE), rank_name(view)
