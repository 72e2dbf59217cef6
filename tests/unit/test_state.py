"""Atomic, versioned controller-state files (StateStore)."""

import json

import pytest

from mismatch_ctrl.errors import StateError
from mismatch_ctrl.state import StateStore

STATE = {"dcgrpo": {"lam": 0.123456789012345678, "eps": None, "observed": [1e-300, 0.1 + 0.2]}, "last_rollout": 7}


def leftovers(directory):
    return sorted(p.name for p in directory.iterdir() if not p.name.startswith("state_"))


def test_round_trip_is_exact(tmp_path):
    store = StateStore(tmp_path / "run")
    path = store.save(7, STATE)
    assert path.name == "state_0000007.json"
    assert store.load(7) == STATE
    assert store.rollout_ids() == [7]


def test_keep_last_prunes_the_oldest(tmp_path):
    store = StateStore(tmp_path, keep_last=2)
    for rollout in (3, 1, 4, 10, 5):
        store.save(rollout, {"r": rollout})
    assert store.rollout_ids() == [5, 10]
    assert store.load(10) == {"r": 10} and store.load(5) == {"r": 5}
    assert leftovers(tmp_path) == []


def test_missing_file_names_it_and_the_files_present(tmp_path):
    store = StateStore(tmp_path)
    store.save(2, STATE)
    with pytest.raises(StateError, match=r"state_0000005.json: no mismatch_ctrl state for rollout 5.*rollouts \[2\]"):
        store.load(5)
    with pytest.raises(StateError, match="rollouts none"):
        StateStore(tmp_path / "empty").load(0)


@pytest.mark.parametrize("content, message", [
    ("{not json", "unreadable mismatch_ctrl state"),
    ("", "unreadable mismatch_ctrl state"),
    ('{"weights": [1, 2]}', "not a mismatch_ctrl state file"),
    ("[1, 2, 3]", "not a mismatch_ctrl state file"),
    ('{"format": "mismatch_ctrl.state", "version": 99, "rollout_id": 4, "state": {}}', "state version 99"),
    ('{"format": "mismatch_ctrl.state", "version": 1, "rollout_id": 3, "state": {}}', "rollout_id 3, expected 4"),
    ('{"format": "mismatch_ctrl.state", "version": 1, "rollout_id": 4, "state": [1]}', "corrupt state"),
])
def test_bad_files_give_state_error_naming_the_file(tmp_path, content, message):
    store = StateStore(tmp_path)
    store.path(4).write_text(content)
    with pytest.raises(StateError) as err:
        store.load(4)
    assert str(store.path(4)) in str(err.value) and message in str(err.value)


def test_failing_write_keeps_the_previous_file_and_leaves_no_temp_file(tmp_path):
    store = StateStore(tmp_path, keep_last=1)
    store.save(4, STATE)
    before = store.path(4).read_bytes()
    with pytest.raises(TypeError):
        store.save(4, {"not json": object()})
    assert store.path(4).read_bytes() == before and store.load(4) == STATE
    with pytest.raises(TypeError):
        store.save(5, {"not json": {1, 2}})
    assert store.rollout_ids() == [4] and leftovers(tmp_path) == []


def test_files_are_plain_json(tmp_path):
    path = StateStore(tmp_path).save(1, STATE)
    document = json.loads(path.read_text())
    assert document == {"format": "mismatch_ctrl.state", "version": 1, "rollout_id": 1, "state": STATE}
