"""The in-process all-gather used by the sharding tests: results, determinism and clear failures instead of hangs."""

import time

import pytest
import torch

from fake_group import FakeGroup, GroupError, run_ranks


def test_every_participant_gets_all_tensors_in_rank_order():
    group = FakeGroup(3)

    def fn(rank):
        gather = group.gather(rank)
        x = torch.tensor([[rank, -rank], [1.0, 2.0 * rank]])
        before = x.clone()
        out = gather(x), gather(x[0])
        assert torch.equal(x, before)
        return out

    for stacked, rows in run_ranks(3, fn, [group]):
        assert torch.equal(stacked, torch.tensor([[[0.0, 0.0], [1.0, 0.0]], [[1.0, -1.0], [1.0, 2.0]],
                                                  [[2.0, -2.0], [1.0, 4.0]]]))
        assert torch.equal(rows, torch.tensor([[0.0, 0.0], [1.0, -1.0], [2.0, -2.0]]))
    assert group.rounds == 2


def test_results_are_identical_on_every_participant():
    group = FakeGroup(4)
    values = [torch.randn(1000, generator=torch.Generator().manual_seed(r)) for r in range(4)]
    results = run_ranks(4, lambda r: group.gather(r)(values[r]), [group])
    assert all(torch.equal(results[0], other) for other in results[1:])
    assert torch.equal(results[0], torch.stack(values))


def test_shape_mismatch_raises_in_every_participant():
    group = FakeGroup(2)
    with pytest.raises(GroupError, match=r"participants disagree: shapes \[\(2,\), \(3,\)\]"):
        run_ranks(2, lambda r: group.gather(r)(torch.zeros(2 + r)), [group])


def test_dtype_mismatch_raises():
    group = FakeGroup(2)
    with pytest.raises(GroupError, match=r"dtypes \[torch.float32, torch.float64\]"):
        run_ranks(2, lambda r: group.gather(r)(torch.zeros(2, dtype=[torch.float32, torch.float64][r])), [group])


def test_a_missing_participant_times_out_instead_of_hanging():
    group = FakeGroup(2, timeout=0.3)

    def fn(rank):
        gather = group.gather(rank)
        gather(torch.zeros(1))
        if rank == 0:
            gather(torch.zeros(1))  # rank 1 never makes this second call

    start = time.monotonic()
    with pytest.raises(TimeoutError, match="gather call #1 waited more than 0.3s"):
        run_ranks(2, fn, [group])
    assert time.monotonic() - start < 5


def test_a_failing_participant_releases_the_others():
    group = FakeGroup(3, timeout=30)

    def fn(rank):
        if rank == 1:
            raise RuntimeError("participant 1 broke")
        return group.gather(rank)(torch.zeros(1))

    start = time.monotonic()
    with pytest.raises(RuntimeError, match="participant 1 broke"):
        run_ranks(3, fn, [group])
    assert time.monotonic() - start < 5


def test_rank_outside_the_group_is_rejected():
    with pytest.raises(ValueError, match="rank 2 is outside the group of size 2"):
        FakeGroup(2).gather(2)
