"""Issue 18 item 11 through the hooks: settings under which a controller never engages, another run's state files in
--save, hostile state files, a full disk while saving."""

from __future__ import annotations

import errno
import json
import logging
from types import SimpleNamespace

import pytest
from slime_data import FULL, make_args, make_batch, method, rollout_data

from mismatch_ctrl.errors import ConfigError, StateError
from mismatch_ctrl.slime import hooks
from mismatch_ctrl.state import StateStore


def test_eps_auto_that_would_calibrate_for_the_whole_run_is_refused():
    args = make_args(method("dcgrpo", dcgrpo={"eps": "auto", "calibration_rollouts": 10}), num_rollout=10)
    with pytest.raises(ConfigError, match=r"calibration_rollouts = 10 with eps: auto, but --num-rollout is 10"):
        hooks.on_megatron_init(args)
    hooks.on_megatron_init(make_args(method("dcgrpo", dcgrpo={"eps": "auto"}), num_rollout=11))


def test_a_period_longer_than_the_run_is_named(caplog):
    args = make_args(method("length_decay", lr_decay={"period": 500}), num_rollout=100)
    with caplog.at_level(logging.WARNING, logger="mismatch_ctrl"):
        hooks.on_megatron_init(args)
    assert "the learning rate never halves" in caplog.text


def test_another_runs_state_files_are_moved_aside_not_mixed_or_deleted(tmp_path, caplog):
    old = StateStore(tmp_path / "mismatch_ctrl")
    for rollout in (40, 41, 42):
        old.save(rollout, {"from": "the previous run"})
    args = make_args(method("dcgrpo"), save=str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="mismatch_ctrl"):
        hooks.on_megatron_init(args)
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("mismatch_ctrl.previous-")]
    assert len(aside) == 1 and StateStore(aside[0]).rollout_ids() == [40, 41, 42]
    assert str(aside[0]) in caplog.text and "[40, 41, 42]" in caplog.text
    for r in range(4):
        hooks.advantages(args, rollout_data(make_batch(r), FULL))
    assert StateStore(tmp_path / "mismatch_ctrl").rollout_ids() == [1, 2, 3]  # the new run's own, newest 3


def test_fresh_starts_within_one_second_each_move_the_previous_state_aside(tmp_path, monkeypatch):
    # the clock of the hooks' module only (the time module's own strftime also formats the log records)
    monkeypatch.setattr("mismatch_ctrl.slime.runtime.time", SimpleNamespace(strftime=lambda fmt: "20261127-000000"))
    for attempt in range(3):
        args = make_args(method("dcgrpo"), save=str(tmp_path))
        hooks.on_megatron_init(args)
        for r in range(2):
            hooks.advantages(args, rollout_data(make_batch(10 * attempt + r), FULL))
    aside = sorted(p.name for p in tmp_path.iterdir() if p.name != "mismatch_ctrl")
    assert aside == ["mismatch_ctrl.previous-20261127-000000", "mismatch_ctrl.previous-20261127-000000-2"]
    for name in aside:
        assert StateStore(tmp_path / name).rollout_ids() == [0, 1]


def run_rollouts(save, rollouts, **kw):
    args = make_args(method("dcgrpo"), save=str(save), num_rollout=12, **kw)
    hooks.on_megatron_init(args)
    for r in rollouts:
        hooks.advantages(args, rollout_data(make_batch(r), FULL))


def test_a_resume_moves_the_later_rollouts_of_another_run_in_save_aside(tmp_path, caplog):
    """Run X fills B; run Y resumes checkpoint 3 of A with --save B: X's files of rollouts Y will write (and after)
    are moved aside, not overwritten or kept while Y's own are pruned."""
    run_rollouts(tmp_path / "B", range(12), save_interval=4)
    x = StateStore(tmp_path / "B" / "mismatch_ctrl")
    x_states = {r: x.path(r).read_bytes() for r in x.rollout_ids()}
    assert list(x_states) == [3, 7, 9, 10, 11]
    run_rollouts(tmp_path / "A", range(4), save_interval=4)
    (tmp_path / "A" / "latest_checkpointed_iteration.txt").write_text("3")
    with caplog.at_level(logging.WARNING, logger="mismatch_ctrl"):
        run_rollouts(tmp_path / "B", range(4, 8), save_interval=4, load=str(tmp_path / "A"))
    assert "rollouts [7, 9, 10, 11] while this run resumes after rollout 3" in caplog.text
    (aside,) = (tmp_path / "B").glob("mismatch_ctrl.previous-*")
    assert {r: StateStore(aside).path(r).read_bytes() for r in StateStore(aside).rollout_ids()} == \
        {r: x_states[r] for r in (7, 9, 10, 11)}
    assert x.rollout_ids() == [3, 5, 6, 7] and x.path(3).read_bytes() == x_states[3]  # Y's newest 3 and X's 3


def test_the_state_of_a_checkpoint_in_save_is_kept_when_the_save_interval_changes(tmp_path):
    run_rollouts(tmp_path, range(8), save_interval=4)
    for iteration in (3, 7):
        (tmp_path / f"iter_{iteration:07d}").mkdir()
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("7")
    run_rollouts(tmp_path, range(8, 13), save_interval=5, load=str(tmp_path))
    assert StateStore(tmp_path / "mismatch_ctrl").rollout_ids() == [3, 7, 9, 10, 11, 12]
    run_rollouts(tmp_path, range(8, 9), save_interval=5, load=str(tmp_path))  # checkpoint 7 still resumes


@pytest.mark.parametrize("content, needle", [
    ("[" * 100_000 + "]" * 100_000, "unreadable"),
    ('{"format": "mismatch_ctrl.state", "version": 3, "rollout_id": 0, "state": ' + "[" * 5000 + "]" * 5000 + "}",
     "unreadable"),
])
def test_hostile_state_files_end_in_state_error(tmp_path, content, needle):
    store = StateStore(tmp_path)
    store.path(0).write_text(content)
    with pytest.raises(StateError, match=needle):
        store.load(0)


def test_a_huge_state_file_is_refused_before_it_is_read(tmp_path):
    store = StateStore(tmp_path)
    with open(store.path(0), "wb") as f:
        f.truncate(17 << 20)
    with pytest.raises(StateError, match="larger than 16 MiB, more than such a file holds"):
        store.load(0)


def test_a_full_disk_while_saving_names_the_file_and_keeps_the_previous_one(tmp_path, monkeypatch):
    store = StateStore(tmp_path)
    store.save(3, {"lam": 0.1})
    before = store.path(3).read_bytes()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("mismatch_ctrl.state.os.fsync", full)
    with pytest.raises(StateError, match=r"state_0000003.json: cannot write the controller state \(No space left"):
        store.save(3, {"lam": 0.2})
    assert store.path(3).read_bytes() == before and json.loads(before)["state"] == {"lam": 0.1}
    assert [p.name for p in tmp_path.iterdir()] == ["state_0000003.json"]  # no temporary file left


def test_state_nested_deeper_than_a_state_file_is_unreadable_on_every_python(tmp_path):
    """Nesting that the JSON parser accepts (30 levels: any Python) is refused by the depth check itself."""
    store = StateStore(tmp_path)
    store.path(0).write_text('{"format": "mismatch_ctrl.state", "version": 3, "rollout_id": 0, "state": {"a": '
                             + "[" * 30 + "]" * 30 + "}}")
    with pytest.raises(StateError, match="nested deeper than a state file's 8 levels"):
        store.load(0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_state_is_refused_at_write_not_at_resume(tmp_path, bad):
    store = StateStore(tmp_path)
    store.save(3, {"lam": 0.1})
    before = store.path(3).read_bytes()
    with pytest.raises(StateError, match=r"state_0000003.json: the controller state holds a non-finite number"):
        store.save(3, {"lam": bad})
    assert store.path(3).read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["state_0000003.json"]


def test_a_state_json_cannot_hold_is_named_as_such_and_nothing_is_written(tmp_path):
    circular: dict = {}
    circular["self"] = circular
    with pytest.raises(StateError, match=r"state_0000003.json: the controller state cannot be written as JSON "
                                         r"\(Circular reference detected\)"):
        StateStore(tmp_path).save(3, circular)
    assert list(tmp_path.iterdir()) == []
