"""The in-process all-reduce used by the sharding tests: results, determinism and clear failures instead of hangs."""

import time

import pytest
import torch

from fake_group import FakeGroup, GroupError, run_ranks


def test_sum_and_max_over_participants():
    group = FakeGroup(3)

    def fn(rank):
        reduce = group.reducer(rank)
        x = torch.tensor([[rank, -rank], [1.0, 2.0 * rank]])
        before = x.clone()
        out = reduce(x, "sum"), reduce(x, "max")
        assert torch.equal(x, before)
        return out

    for total, largest in run_ranks(3, fn, [group]):
        assert torch.equal(total, torch.tensor([[3.0, -3.0], [3.0, 6.0]]))
        assert torch.equal(largest, torch.tensor([[2.0, 0.0], [1.0, 4.0]]))
    assert group.rounds == 2


def test_results_are_identical_on_every_participant():
    group = FakeGroup(4)
    values = [torch.randn(1000, generator=torch.Generator().manual_seed(r)) for r in range(4)]
    results = run_ranks(4, lambda r: group.reducer(r)(values[r]), [group])
    assert all(torch.equal(results[0], other) for other in results[1:])
    expected = ((values[0] + values[1]) + values[2]) + values[3]
    assert torch.equal(results[0], expected)


def test_shape_mismatch_raises_in_every_participant():
    group = FakeGroup(2)
    with pytest.raises(GroupError, match=r"participants disagree: shapes \[\(2,\), \(3,\)\]"):
        run_ranks(2, lambda r: group.reducer(r)(torch.zeros(2 + r)), [group])


def test_op_mismatch_raises():
    group = FakeGroup(2)
    with pytest.raises(GroupError, match=r"ops \['sum', 'max'\]"):
        run_ranks(2, lambda r: group.reducer(r)(torch.zeros(2), ["sum", "max"][r]), [group])


def test_a_missing_participant_times_out_instead_of_hanging():
    group = FakeGroup(2, timeout=0.3)

    def fn(rank):
        reduce = group.reducer(rank)
        reduce(torch.zeros(1))
        if rank == 0:
            reduce(torch.zeros(1))  # rank 1 never makes this second call

    start = time.monotonic()
    with pytest.raises(TimeoutError, match="reduce call #1 waited more than 0.3s"):
        run_ranks(2, fn, [group])
    assert time.monotonic() - start < 5


def test_a_failing_participant_releases_the_others():
    group = FakeGroup(3, timeout=30)

    def fn(rank):
        if rank == 1:
            raise RuntimeError("participant 1 broke")
        return group.reducer(rank)(torch.zeros(1))

    start = time.monotonic()
    with pytest.raises(RuntimeError, match="participant 1 broke"):
        run_ranks(3, fn, [group])
    assert time.monotonic() - start < 5


def test_rank_outside_the_group_is_rejected():
    with pytest.raises(ValueError, match="rank 2 is outside the group of size 2"):
        FakeGroup(2).reducer(2)
