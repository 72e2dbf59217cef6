"""The TIS hook (``rollout_correction``) on every rank equals the core on full sequences.

Per world, rank and micro-batch the hook gets CP-local ``pg_loss`` / log-probs and full-length loss masks, as slime
passes them. The reference is ``apply_correction`` and the mismatch metrics in a single process, with the settings
the controllers hold (the presets; ACRL's band after one rollout), on full sequences of the micro-batch slot: the k-th
micro-batch of every data-parallel rank, which one hook call sees together over the DP group (batch values and batch
normalisation are global over it).
"""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch
from slime_compare import RTOL, WORLD_IDS, rank_name
from slime_data import PREFIX, cp_positions, cp_slice
from slime_scenarios import CORRECTION_METHODS, correction_batch

ALL_WORLDS = [0, 1, 2, 4, "w4tp", "w4tpcp"]
CASES = list(CORRECTION_METHODS)


def reference(runs, case: str, view) -> dict:
    return runs.reference[f"correction/{case}"][view.dp_size]


def per_sample(flat: torch.Tensor, samples: list[int], batch, view) -> list[torch.Tensor]:
    sizes = [len(cp_positions(batch.total_lengths[g], batch.response_lengths[g], view.cp_rank, view.cp_size))
             for g in samples]
    assert flat.numel() == sum(sizes), f"{flat.numel()} values for {sum(sizes)} CP-local tokens"
    return list(flat.split(sizes))


def rank_samples(runs, world: int | str, case: str):
    """(view, sample, call, local slices of the reference) for every sample every rank sees, with the reference of
    the sample's micro-batch slot."""
    batch = correction_batch(case)
    for rank in runs.world(world, f"correction/{case}"):
        view = rank["view"]
        for k, mb in enumerate(rank["result"]["micro_batches"]):
            ref = reference(runs, case, view)["slots"][k]
            call = mb["calls"][0]
            pieces = zip(mb["samples"], per_sample(mb["pg_in"], mb["samples"], batch, view),
                         per_sample(call["pg_out"], mb["samples"], batch, view),
                         per_sample(call["grad"], mb["samples"], batch, view), call["masks"])
            for g, pg_in, pg_out, grad, mask in pieces:
                tl, rl = batch.total_lengths[g], batch.response_lengths[g]
                local = {"weights": cp_slice(ref["weights"][g], tl, rl, view),
                         "keep": cp_slice(ref["keep"][g], tl, rl, view),
                         "trained": cp_slice(batch.loss_masks[g], tl, rl, view) > 0,
                         "positions": cp_positions(tl, rl, view.cp_rank, view.cp_size)}
                yield view, g, {"pg_in": pg_in, "pg_out": pg_out, "grad": grad, "mask": mask}, local


@pytest.mark.parametrize("world", ALL_WORLDS, ids=WORLD_IDS.get)
@pytest.mark.parametrize("case", CASES)
def test_weights_masks_and_gradient_equal_the_core(runs, case, world):
    """At kept tokens pg_loss_out / pg_loss_in and d pg_loss_out / d pg_loss_in are the reference's weights; at
    rejected trained tokens both are 0; the returned masks are full length and equal the reference's modified mask at
    this rank's positions; pg_loss keeps its graph."""
    batch = correction_batch(case)
    active = runs.reference[f"correction/{case}"][1]["spec"].active
    for view, g, got, ref in rank_samples(runs, world, case):
        where = f"{case} sample {g} ({rank_name(view)})"
        kept, rejected = ref["keep"] > 0, ref["trained"] & (ref["keep"] == 0)
        torch.testing.assert_close(got["pg_out"][kept] / got["pg_in"][kept], ref["weights"][kept], rtol=RTOL,
                                   atol=1e-7, msg=lambda m, where=where: f"{where} weights: {m}")
        torch.testing.assert_close(got["grad"][kept], ref["weights"][kept], rtol=RTOL, atol=1e-7,
                                   msg=lambda m, where=where: f"{where} gradient: {m}")
        assert bool((got["pg_out"][rejected] == 0).all()) and bool((got["grad"][rejected] == 0).all()), where
        assert bool(torch.isfinite(got["pg_out"]).all()) and bool(torch.isfinite(got["grad"]).all()), where
        assert got["mask"].numel() == batch.response_lengths[g], where
        assert torch.equal(got["mask"][ref["positions"]], ref["keep"].to(got["mask"].dtype)), where
        if not active and not batch.nonfinite[g]:
            assert torch.equal(got["pg_out"][ref["trained"]], got["pg_in"][ref["trained"]]), where
            assert torch.equal(got["mask"], batch.loss_masks[g]), where
    for rank in runs.world(world, f"correction/{case}"):
        assert all(mb["calls"][0]["requires_grad"] for mb in rank["result"]["micro_batches"])


@pytest.mark.parametrize("case", CASES)
def test_reference_corrections_are_not_vacuous(runs, case):
    """Each preset rejects or reweights something on the test data (else the comparisons prove little), and batch
    normalisation depends on the batch it sees (else normalising over the DP batch would prove little)."""
    ref = runs.reference[f"correction/{case}"][1]
    full = ref["full"]
    batch = correction_batch(case)
    trained = torch.cat([m > 0 for m in batch.loss_masks])
    keep, weights = torch.cat([full["keep"][g] for g in range(batch.size)]) > 0, \
        torch.cat([full["weights"][g] for g in range(batch.size)])
    changed = bool((trained & ~keep).any()) or not torch.allclose(weights[keep], torch.ones(int(keep.sum())))
    assert changed == (ref["spec"].active or case.endswith("_nonfinite")), case
    if ref["spec"].batch_normalize:
        one, two = (runs.reference[f"correction/{case}"][dp]["slots"][0] for dp in (1, 2))
        common = sorted(set(one["samples"]) & set(two["samples"]))
        assert common and not all(torch.allclose(one["weights"][g], two["weights"][g]) for g in common)


@pytest.mark.parametrize("world", ALL_WORLDS, ids=WORLD_IDS.get)
@pytest.mark.parametrize("case", CASES)
def test_token_metrics_reduce_like_slime_to_the_core_summary(runs, case, world):
    """Metrics are token-shaped CP-local tensors; slime's reduction (per sample sum(x * chunk mask) / full mask sum,
    summed over CP ranks, DP ranks and samples) gives, per micro-batch slot, the reference's batch value times its
    number of samples for mean metrics, and times its number of samples with trained tokens for batch values (max,
    min, diagnostics: the slot's value at every token, the same on every rank). Like slime, it counts one rank per
    tensor-parallel group."""
    batch = correction_batch(case)
    totals: dict[tuple[int, str], float] = defaultdict(float)
    for rank in runs.world(world, f"correction/{case}"):
        view = rank["view"]
        if view.tp_rank:
            continue
        for k, mb in enumerate(rank["result"]["micro_batches"]):
            ref = reference(runs, case, view)["slots"][k]
            metrics = mb["calls"][0]["metrics"]
            assert sorted(metrics) == sorted(PREFIX + name for name in ref["names"]), rank_name(view)
            for name, x in metrics.items():
                assert x.dim() == 1 and x.dtype == mb["pg_in"].dtype
                if name[len(PREFIX):] not in ref["per_sample"] and x.numel():
                    assert float(x.min()) == float(x.max()), name  # a batch value: the same at every token
                for g, piece in zip(mb["samples"], per_sample(x, mb["samples"], batch, view)):
                    full_mask = batch.loss_masks[g].double()
                    chunk_mask = cp_slice(full_mask, batch.total_lengths[g], batch.response_lengths[g], view)
                    totals[k, name] += float((piece.double() * chunk_mask).sum() / full_mask.sum().clamp_min(1.0))
    for k, ref in enumerate(reference(runs, case, runs.world(world, f"correction/{case}")[0]["view"])["slots"]):
        for name in ref["names"]:
            expected = ref["summary"][name] * (ref["sequences"] if name in ref["per_sample"] else ref["valid"])
            assert totals[k, PREFIX + name] == pytest.approx(expected, rel=RTOL, abs=1e-6), (k, name)


@pytest.mark.parametrize("world", ["w4tp", "w4tpcp"], ids=WORLD_IDS.get)
@pytest.mark.parametrize("case", CASES)
def test_tensor_parallel_peers_return_identical_results(runs, case, world):
    """Both ranks of a tensor-parallel group hold the same data and get bit-identical loss, masks and metrics."""
    ranks = runs.world(world, f"correction/{case}")
    by_position = defaultdict(list)
    for rank in ranks:
        view = rank["view"]
        by_position[view.dp_rank, view.cp_rank].append(rank)
    assert all(len(peers) == 2 for peers in by_position.values()) and len(by_position) == 2
    for first, second in by_position.values():
        for a, b in zip(first["result"]["micro_batches"], second["result"]["micro_batches"], strict=True):
            x, y = a["calls"][0], b["calls"][0]
            assert torch.equal(x["pg_out"], y["pg_out"]) and all(map(torch.equal, x["masks"], y["masks"]))
            assert x["metrics"].keys() == y["metrics"].keys()
            assert all(torch.equal(x["metrics"][k], y["metrics"][k]) for k in x["metrics"])


@pytest.mark.parametrize("world", ALL_WORLDS, ids=WORLD_IDS.get)
@pytest.mark.parametrize("case", CASES)
def test_second_call_is_identical_and_changes_no_state(runs, case, world):
    """slime re-runs the hook with --recompute-loss-function: same outputs, no controller or runtime state change,
    and the caller's loss masks are left untouched."""
    for rank in runs.world(world, f"correction/{case}"):
        result = rank["result"]
        assert result["before"] == result["after"], rank_name(rank["view"])
        for mb in result["micro_batches"]:
            first, second = mb["calls"]
            for key in ("pg_out", "grad"):
                assert torch.equal(first[key], second[key]), key
            assert all(torch.equal(a, b) for a, b in zip(first["masks"], second["masks"]))
            assert first["metrics"].keys() == second["metrics"].keys()
            assert all(torch.equal(first["metrics"][k], second["metrics"][k]) for k in first["metrics"])
            assert first["inputs_unchanged"] and second["inputs_unchanged"]


@pytest.mark.parametrize("world", ALL_WORLDS, ids=WORLD_IDS.get)
@pytest.mark.parametrize("case", [c for c in CASES if c.endswith("_nonfinite")])
def test_nonfinite_tokens_leave_the_masks_and_the_loss(runs, case, world):
    """A trained token with a non-finite log-prob (and a NaN pg_loss there) is 0 in the returned mask, 0 in pg_loss
    and gets gradient 0; every other trained token stays in."""
    batch = correction_batch(case)
    seen = 0
    for view, g, got, ref in rank_samples(runs, world, case):
        for k, pos in enumerate(ref["positions"]):
            if pos in batch.nonfinite[g]:
                seen += view.tp_rank == 0  # every tensor-parallel peer is checked, one of them counted
                assert got["mask"][pos] == 0 and got["pg_out"][k] == 0 and got["grad"][k] == 0, (g, pos)
    assert seen == sum(len(b) for b in batch.nonfinite) > 0


@pytest.mark.parametrize("world", ALL_WORLDS, ids=WORLD_IDS.get)
@pytest.mark.parametrize("case", CASES)
def test_each_call_reduces_once_over_cp_and_once_over_dp(runs, case, world):
    """Metrics, rejection decisions, diagnostics and batch normalisation share one gather over the context-parallel
    group (if CP > 1) and one over the data-parallel group (if DP > 1): at most 2 collectives per micro-batch."""
    for rank in runs.world(world, f"correction/{case}"):
        view = rank["view"]
        expected = (view.cp_size > 1) + (view.dp_size > 1)
        counts = [call["collectives"] for mb in rank["result"]["micro_batches"] for call in mb["calls"]]
        assert counts == [expected] * 4, rank_name(view)
