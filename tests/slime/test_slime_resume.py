"""Controller state across a checkpoint: written by the main rank only, pruned, restored by ``on_megatron_init``, and
the resumed run continues the uninterrupted trajectory exactly.

The worlds run 12 rollouts uninterrupted; then 8 rollouts saving state (save_interval 3, keep_last 2), mark rollout 5
as Megatron's checkpoint (``latest_checkpointed_iteration.txt``) and resume with fresh ``args`` (load = the main
rank's directory, finetune False, start_rollout_id None, optimizer groups restored with stale LRs) for 6..11.
"""

from __future__ import annotations

import json
import logging
import re

import pytest
from slime_compare import ATOL, RTOL, WORLD_IDS, assert_tree_close, rank_name, tolerance
from slime_data import FULL, make_args, method, rollout_data
from slime_scenarios import (
    RESUME_FROM,
    RESUME_METHOD,
    RESUME_ROLLOUTS,
    RESUME_STOP,
    SAVE_INTERVAL,
    resume_batch,
    snapshot,
)

from mismatch_ctrl.controllers import ControllerSet
from mismatch_ctrl.errors import StateError
from mismatch_ctrl.slime import hooks
from mismatch_ctrl.slime.runtime import get_runtime

ALL_WORLDS = [0, 1, 2, 4]
KEEP_LAST = RESUME_METHOD["state"]["keep_last"]


def pruned(saved: list[int]) -> list[str]:
    """State files left after saving ``saved`` in order: the newest keep_last, plus every rollout after which slime
    writes a Megatron checkpoint ((r + 1) % save_interval == 0, or the last rollout)."""
    present: list[int] = []
    for r in saved:
        present = sorted(set(present) | {r})
        newest = present[-KEEP_LAST:]
        present = [p for p in present if p in newest or (p + 1) % SAVE_INTERVAL == 0 or p == RESUME_ROLLOUTS - 1]
    return [f"state_{r:07d}.json" for r in present]


@pytest.mark.parametrize("world", ALL_WORLDS, ids=WORLD_IDS.get)
def test_only_the_main_rank_writes_and_files_are_pruned(runs, world):
    for rank in runs.world(world, "resume"):
        result, view = rank["result"], rank["view"]
        main = view.dp_rank == 0 and view.cp_rank == 0
        first = pruned(list(range(RESUME_STOP))) if main else []
        resumed = pruned(list(range(RESUME_STOP)) + list(range(RESUME_FROM + 1, RESUME_ROLLOUTS))) if main else []
        assert result["files_first"] == first, rank_name(view)
        assert result["files_resumed"] == resumed, rank_name(view)
    assert pruned(list(range(RESUME_STOP))) == [f"state_{r:07d}.json" for r in (2, 5, 6, 7)]


@pytest.mark.parametrize("world", ALL_WORLDS, ids=WORLD_IDS.get)
def test_resumed_run_continues_the_uninterrupted_trajectory(runs, world):
    """After on_megatron_init the controllers hold the state of rollout 5 and the next rollouts give bit-identical
    advantages, metrics, controller state, LR scale and optimizer-step LRs; saving changes nothing either."""
    for rank in runs.world(world, "resume"):
        result, where = rank["result"], rank_name(rank["view"])
        uninterrupted = result["uninterrupted"]
        assert result["restored"]["next_rollout"] == RESUME_FROM + 1
        assert result["restored"]["controllers"] == uninterrupted[RESUME_FROM]["state"], where
        assert sorted(result["resumed"]) == list(range(RESUME_FROM + 1, RESUME_ROLLOUTS))
        for r, got in result["resumed"].items():
            assert_tree_close(got, uninterrupted[r], path=f"resumed rollout {r} ({where})")
        for r, got in result["first"].items():
            assert_tree_close(got, uninterrupted[r], path=f"saving run rollout {r} ({where})")
        scales = [uninterrupted[r]["lr_scale"] for r in range(RESUME_ROLLOUTS)]
        assert scales[RESUME_FROM] == 1.0 and scales[-1] < 1.0, "the resumed rollouts must cross an LR halving"
        lrs = [lr for step in result["resumed"][RESUME_ROLLOUTS - 1]["lrs"] for lr in step]
        assert lrs == pytest.approx([make_args(None).lr * scales[-1]] * len(lrs), rel=1e-12)


@pytest.mark.parametrize("world", ALL_WORLDS, ids=WORLD_IDS.get)
def test_uninterrupted_run_equals_the_single_process_reference(runs, world):
    for rank in runs.world(world, "resume"):
        for r, got in rank["result"]["uninterrupted"].items():
            ref = runs.reference["resume"][r]
            assert_tree_close(got["state"], ref["state"], *tolerance(world), path=f"rollout {r}")
            assert_tree_close({k: v[0] for k, v in got["metrics"].items()},
                              {k: v[0] for k, v in ref["metrics"].items()}, *tolerance(world), path=f"rollout {r}")


def test_fresh_process_resumes_state_written_by_another_layout(runs):
    """This process (no megatron) resumes from the DP 2 x CP 2 world's checkpoint and continues the single-process
    trajectory: the state is global, so a resume may change the parallel layout."""
    runs.world(4, "resume")
    main_dir = runs.workdir / "w4" / "resume" / "rank0"
    args = make_args(RESUME_METHOD, load=str(main_dir), finetune=False, start_rollout_id=None,
                     save_interval=SAVE_INTERVAL, num_rollout=RESUME_ROLLOUTS)
    hooks.on_megatron_init(args)
    assert get_runtime(args).next_rollout == RESUME_FROM + 1
    for r in range(RESUME_FROM + 1, RESUME_ROLLOUTS):
        data = rollout_data(resume_batch(r), FULL)
        hooks.advantages(args, data)
        got, ref = snapshot(args, data, r), runs.reference["resume"][r]
        assert_tree_close(got, ref, RTOL, ATOL, path=f"rollout {r}")


# --- single process: what goes wrong on resume ------------------------------------------------------------------------

DCGRPO = method("dcgrpo")


def saved_run(tmp_path, section=DCGRPO, rollouts: int = 4, checkpoint: int = 2):
    """Run ``rollouts`` rollouts saving to ``tmp_path`` and mark ``checkpoint`` as Megatron's latest iteration."""
    args = make_args(section, save=str(tmp_path), save_interval=SAVE_INTERVAL)
    for r in range(rollouts):
        hooks.advantages(args, rollout_data(resume_batch(r), FULL))
    (tmp_path / "latest_checkpointed_iteration.txt").write_text(str(checkpoint))
    return tmp_path / "mismatch_ctrl" / f"state_{checkpoint:07d}.json"


def resume_args(tmp_path, section=DCGRPO, **overrides):
    return make_args(section, load=str(tmp_path), save=str(tmp_path), **overrides)


def test_missing_state_file_names_the_file_and_the_fresh_option(tmp_path):
    state = saved_run(tmp_path)
    state.unlink()
    with pytest.raises(StateError) as exc:
        hooks.on_megatron_init(resume_args(tmp_path))
    assert str(state) in str(exc.value) and "state.resume: fresh" in str(exc.value)


@pytest.mark.parametrize("content", ["{not json", json.dumps({"format": "something else"}), json.dumps([1, 2])])
def test_corrupt_state_file_is_an_error(tmp_path, content):
    state = saved_run(tmp_path)
    state.write_text(content)
    with pytest.raises(StateError, match=re.escape(str(state))):
        hooks.on_megatron_init(resume_args(tmp_path))


def test_state_of_another_method_is_an_error(tmp_path):
    saved_run(tmp_path)
    with pytest.raises(StateError, match="dcgrpo"):
        hooks.on_megatron_init(resume_args(tmp_path, method("grpo")))


def test_resume_fresh_starts_the_controllers_afresh_with_a_warning(tmp_path, caplog):
    saved_run(tmp_path).unlink()
    section = dict(DCGRPO, state={"resume": "fresh"})
    args = resume_args(tmp_path, section)
    with caplog.at_level(logging.WARNING, logger="mismatch_ctrl"):
        hooks.on_megatron_init(args)
    runtime = get_runtime(args)
    assert runtime.next_rollout == 3
    assert runtime.controllers.state_dict() == ControllerSet(runtime.config).state_dict()
    assert any("fresh" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)


def test_resume_restores_the_saved_state(tmp_path):
    saved_run(tmp_path)
    saved = json.loads((tmp_path / "mismatch_ctrl" / "state_0000002.json").read_text())["state"]
    args = resume_args(tmp_path)
    hooks.on_megatron_init(args)
    assert get_runtime(args).controllers.state_dict() == saved
    assert saved["dcgrpo"]["rollouts"] == 3


def test_finetune_ignores_the_checkpoint(tmp_path):
    saved_run(tmp_path)
    args = resume_args(tmp_path, finetune=True, start_rollout_id=0)
    hooks.on_megatron_init(args)
    runtime = get_runtime(args)
    assert runtime.next_rollout == 0
    assert runtime.controllers.state_dict() == ControllerSet(runtime.config).state_dict()

