"""The before-train-step hook with megatron-core's real ``OptimizerParamScheduler`` follows the length-decay schedule.

30 rollouts, 2 optimizer steps each, a response-length surge at rollout 6, two param groups carrying ``max_lr`` /
``min_lr``, constant and linear decay styles, on every rank of every world; also PP 2 x CP 2, where only the last
stage runs the advantage hook and the first stage must get the factor by broadcast. The expected schedule is
ALGORITHMS.md section 4 written out here: halvings at ``first = max(T_d, trigger)`` and every
``T_d = round(1.8 onset)`` rollouts after it, floored at 0.1; or every 5 rollouts with ``period: 5``.
"""

from __future__ import annotations

import pytest
from slime_compare import WORLD_IDS, assert_tree_close, rank_name, tolerance
from slime_data import make_args
from slime_scenarios import GLOBAL_BATCH, LR_DECAY_STEPS, LR_METHODS, LR_ROLLOUTS, STEPS_PER_ROLLOUT, SURGE_AT

from mismatch_ctrl.lr_schedule import decay_scale

ALL_WORLDS = [0, 1, 2, 4, "w4pp"]
ARGS = make_args(None)


def halving_scale(r: int, period: int, first: int) -> float:
    halvings = 0 if r < first else 1 + (r - first) // period
    return max(0.5 ** halvings, 0.1)


def expected_scales(runs, name: str) -> list[float]:
    if name == "manual":
        return [max(0.5 ** (r // 5), 0.1) for r in range(LR_ROLLOUTS)]
    detector = runs.reference[f"lr/{name}"][-1]["state"]["surge"]
    period = round(1.8 * detector["onset"])
    first = max(period, detector["triggered_at"])
    return [halving_scale(r, period, first) for r in range(LR_ROLLOUTS)]


def scheduled_lr(style: str, scale: float, num_steps: int) -> float:
    """Megatron's constant / linear decay (no warm-up) between the scaled max_lr and min_lr."""
    high, low = ARGS.lr * scale, ARGS.min_lr * scale
    if style == "constant":
        return high
    return low + (1.0 - num_steps / LR_DECAY_STEPS) * (high - low)


def test_reference_detector_sees_the_surge(runs):
    """The surge starts at rollout 6; with windows 3 / 5, gap 2 and 2 consecutive rollouts it is confirmed within
    three rollouts and dated back to its start (so the schedule below has halvings to check). The schedule written
    out here is ``mismatch_ctrl.lr_schedule.decay_scale`` with the detector's period and trigger."""
    detector = runs.reference["lr/auto"][-1]["state"]["surge"]
    assert detector["onset"] == SURGE_AT
    assert SURGE_AT < detector["triggered_at"] <= SURGE_AT + 3
    scales = expected_scales(runs, "auto")
    assert [ref["lr_scale"] for ref in runs.reference["lr/auto"]] == scales
    assert len(set(scales)) >= 3
    period = round(1.8 * detector["onset"])
    first = max(period, detector["triggered_at"])
    assert scales == [decay_scale(r, period, first) for r in range(LR_ROLLOUTS)]
    assert expected_scales(runs, "manual") == [decay_scale(r, 5) for r in range(LR_ROLLOUTS)]


@pytest.mark.parametrize("world", ALL_WORLDS, ids=WORLD_IDS.get)
@pytest.mark.parametrize("name", list(LR_METHODS))
def test_optimizer_steps_use_the_scheduled_lr_on_every_rank(runs, name, world):
    """The LR each param group has when ``optimizer.step()`` runs, and after ``scheduler.step(increment=gbs)``, is
    the Megatron schedule with max_lr / min_lr scaled by the length-decay factor of the rollout; a second call of the
    hook for the same step changes nothing; the detector's state matches the single-process reference."""
    scales = expected_scales(runs, name)
    reference = runs.reference[f"lr/{name}"]
    for rank in runs.world(world, f"lr/{name}"):
        for r, record in enumerate(rank["result"]):
            where = f"{name} rollout {r} ({rank_name(rank['view'])})"
            assert ("state" in record) == rank["view"].last_stage, where
            if rank["view"].last_stage:
                assert record["lr_scale"] == scales[r], where
                assert_tree_close(record["state"]["surge"], reference[r]["state"]["surge"], *tolerance(world),
                                  path=where)
            assert len(record["steps"]) == STEPS_PER_ROLLOUT
            for s, styles in enumerate(record["steps"]):
                for style, step in styles.items():
                    num_steps = (r * STEPS_PER_ROLLOUT + s) * GLOBAL_BATCH
                    assert step["num_steps"] == num_steps
                    at_step = scheduled_lr(style, scales[r], num_steps)
                    after = scheduled_lr(style, scales[r], num_steps + GLOBAL_BATCH)
                    assert step["at_step"] == pytest.approx([at_step] * 2, rel=1e-12), f"{where} step {s} {style}"
                    assert step["after"] == pytest.approx([after] * 2, rel=1e-12), f"{where} step {s} {style}"
                    assert step["first"] == step["second"], f"{where} step {s} {style}: not idempotent"
                    bounds = [bound for _, high, low in step["first"] for bound in (high, low)]
                    assert bounds == pytest.approx([ARGS.lr * scales[r], ARGS.min_lr * scales[r]] * 2, rel=1e-12)


def test_pipeline_world_has_a_stage_without_rollout_data(runs):
    """PP 2 x CP 2 in megatron's rank order: ranks 0, 1 are the first stage (no advantage hook), 2, 3 the last."""
    views = [rank["view"] for rank in runs.world("w4pp", "lr/auto")]
    assert [v.last_stage for v in views] == [False, False, True, True]
    assert {(v.cp_rank, v.cp_size, v.dp_size) for v in views} == {(0, 2, 1), (1, 2, 1)}
