"""Atomic, versioned controller-state files (StateStore), and the state protocol every stateful controller restores
by: one generic test over all of them, then what each checks against the current configuration."""

import copy
import json
from dataclasses import replace
import logging
import math

import pytest

from mismatch_ctrl.acrl import ACRLSettings, BandController
from mismatch_ctrl.config import build_config
from mismatch_ctrl.controllers import ControllerSet
from mismatch_ctrl.dcgrpo import DCGRPOSettings, LagrangeController
from mismatch_ctrl.errors import StateError
from mismatch_ctrl.lr_schedule import LengthDecaySettings, LengthTriggeredLR, SurgeDetector, SurgeSettings
from mismatch_ctrl.state import VERSION, StateStore

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
    ('{"format": "mismatch_ctrl.state", "version": 1, "rollout_id": 4, "state": {}}', "state version 1"),
    ('{"format": "mismatch_ctrl.state", "version": true, "rollout_id": 4, "state": {}}', "state version True"),
    ('{"format": "mismatch_ctrl.state", "version": [3], "rollout_id": 4, "state": {}}', "state version [3]"),
    ('{"format": "mismatch_ctrl.state", "version": {}, "rollout_id": 4, "state": {}}', "state version {}"),
    ('{"format": "mismatch_ctrl.state", "version": 2, "rollout_id": 3, "state": {}}', "rollout_id 3, expected 4"),
    ('{"format": "mismatch_ctrl.state", "version": 2, "rollout_id": 4, "state": [1]}', "corrupt state"),
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
    assert document == {"format": "mismatch_ctrl.state", "version": VERSION, "rollout_id": 1, "state": STATE}


# --- the state protocol -----------------------------------------------------------------------------------------------

DC = DCGRPOSettings(enabled=True, lambda_0=0.1, eta=5.0, eps=0.01, lambda_max=0.5, floor_rollouts=2)
BAND = ACRLSettings(enabled=True, calibration_rollouts=2)
SURGE = SurgeSettings(baseline_window=3, gap=1, short_window=2)
FULL = {"architecture": "moe", "dcgrpo": {"enabled": True, "eps": "auto", "calibration_rollouts": 2},
        "lr_decay": {"enabled": True}, "acrl": {"enabled": True, "calibration_rollouts": 2},
        "correction": {"preset": "geo_mis"}}


def dcgrpo(settings=DC):
    ctrl = LagrangeController(settings)
    for c in (0.02, 0.03, 0.005):
        ctrl.update(c)
    return ctrl


def surge():
    detector = SurgeDetector(SURGE)
    for t, length in enumerate([100.0, 110.0, 90.0, 100.0, 300.0]):
        detector.update(t, length, 4096.0)
    return detector


def lr_decay():
    lr = LengthTriggeredLR(LengthDecaySettings(enabled=True, surge=SURGE))
    for t, length in enumerate([100.0, 110.0, 90.0]):
        lr.observe(t, length)
    return lr


def band(settings=BAND):
    ctrl = BandController(settings)
    for d in (0.01, 0.02, 0.05):
        ctrl.update(d)
    return ctrl


def controllers():
    """A ControllerSet with every controller enabled, advanced three rollouts (each part directly: the protocol does
    not depend on how ``step`` feeds them)."""
    ctrl = ControllerSet(build_config(FULL))
    for k, (c_bar, d) in enumerate([(0.02, 0.01), (0.03, 0.02), (0.01, 0.05)]):
        ctrl.dcgrpo.update(c_bar)
        ctrl.surge.update(k, 1000.0 + k, 4096.0)
        ctrl.acrl.update(d)
        ctrl.last_rollout = k
    return ctrl


STATEFUL = {"dcgrpo": dcgrpo, "surge": surge, "lr_decay": lr_decay, "acrl": band, "controllers": controllers}
"""Every stateful controller (a factory of one that has seen a few rollouts): the protocol test runs on each."""


def fresh(name):
    ctrl = STATEFUL[name]()
    return type(ctrl)(ctrl.config) if name == "controllers" else type(ctrl)(ctrl.settings)


@pytest.mark.parametrize("name", STATEFUL)
def test_every_controller_follows_the_state_protocol(name):
    """One schema per controller, the same strictness everywhere: the saved keys are exactly the schema's; a missing
    key, an unknown key, a value of the wrong type, NaN or infinity, or a state that is not a mapping raise
    StateError naming the source and the key; a failed load changes nothing; a good one restores exactly."""
    saved = json.loads(json.dumps(STATEFUL[name]().state_dict()))
    target = fresh(name)
    assert set(saved) == set(target.STATE)
    where = f"/runs/x/state_0000007.json: {name}"
    untouched = copy.deepcopy(target.state_dict())
    bad_states = [({k: v for k, v in saved.items() if k != key}, f"{where}.{key}: missing") for key in saved]
    bad_states.append(({**saved, "bogus": 1}, f"{where}.bogus: unknown key"))
    for key in saved:
        for value in ("abc", math.nan, math.inf, [math.nan], True):
            bad_states.append(({**saved, key: value}, f"{where}.{key}: "))
    bad_states += [([saved], f"{where}: expected a mapping"), (None, f"{where}: expected a mapping")]
    for state, needle in bad_states:
        with pytest.raises(StateError) as err:
            target.load_state_dict(state, where)
        assert needle in str(err.value) and len(str(err.value)) < 600, (state, str(err.value))
        assert target.state_dict() == untouched
    target.load_state_dict(saved, where)
    assert json.loads(json.dumps(target.state_dict())) == saved


def saved_dcgrpo(**changes):
    return {**dcgrpo().state_dict(), **changes}


def test_lambda_outside_the_current_range_is_clipped_with_a_warning_naming_both(caplog):
    ctrl = LagrangeController(DC)
    with caplog.at_level(logging.WARNING, logger="mismatch_ctrl"):
        ctrl.load_state_dict(saved_dcgrpo(lam=1e9), "f.json: state.dcgrpo")
    assert ctrl.lam == DC.lambda_max
    assert "saved lambda 1e+09 is outside [0, lambda_max=0.5]" in caplog.text and "f.json" in caplog.text
    ctrl.load_state_dict(saved_dcgrpo(lam=-5.0))
    assert ctrl.lam == 0.0
    narrower = LagrangeController(replace(DC, lambda_max=0.2))
    narrower.load_state_dict(saved_dcgrpo(lam=0.3))
    assert narrower.lam == 0.2


def test_a_changed_fixed_eps_applies_with_a_warning_and_the_guard_still_checks_it(caplog):
    """The saved floor is 0.025 (median of 0.02, 0.03): a new eps of 0.02 applies; 0.001 is below the floor, so the
    infeasible-budget guard raises it to 1.1 x floor, as it would have in the saved run."""
    saved = saved_dcgrpo()
    assert saved["floor"] == pytest.approx(0.025) and saved["eps"] == pytest.approx(1.1 * 0.025)
    with caplog.at_level(logging.WARNING, logger="mismatch_ctrl"):
        looser = LagrangeController(replace(DC, eps=0.03))
        looser.load_state_dict(saved)
    assert looser.eps == 0.03 and "eps changed from 0.01 (saved run) to 0.03 (configuration)" in caplog.text
    tighter = LagrangeController(replace(DC, eps=0.001))
    tighter.load_state_dict(saved)
    assert tighter.eps == pytest.approx(1.1 * 0.025)
    same = LagrangeController(DC)
    same.load_state_dict(saved)
    assert same.state_dict() == saved


@pytest.mark.parametrize("saved_eps, current_eps", [(0.01, "auto"), ("auto", 0.01)])
def test_switching_between_auto_and_a_fixed_eps_is_an_error(saved_eps, current_eps):
    saved = dcgrpo(replace(DC, eps=saved_eps)).state_dict()
    ctrl = LagrangeController(replace(DC, eps=current_eps))
    with pytest.raises(StateError, match=r"dcgrpo.eps_setting: the saved run used eps .* but the configuration has"):
        ctrl.load_state_dict(saved)


@pytest.mark.parametrize("changes", [dict(floor_rollouts=3), dict(floor_rollouts=1)])
def test_a_changed_calibration_window_is_an_error(changes):
    ctrl = LagrangeController(replace(DC, **changes))
    with pytest.raises(StateError, match="dcgrpo.observed: 2 rollouts observed .* dcgrpo.floor_rollouts"):
        ctrl.load_state_dict(saved_dcgrpo())


def test_a_still_calibrating_auto_state_needs_the_same_window():
    auto = replace(DC, eps="auto", calibration_rollouts=5)
    ctrl = LagrangeController(auto)
    ctrl.update(0.02)
    ctrl.update(0.03)
    shorter = LagrangeController(replace(auto, calibration_rollouts=2))
    with pytest.raises(StateError, match="dcgrpo.calibration_rollouts = 2"):
        shorter.load_state_dict(ctrl.state_dict())
    longer = LagrangeController(replace(auto, calibration_rollouts=6))
    longer.load_state_dict(ctrl.state_dict())
    assert longer.calibrating and longer.observed == [0.02, 0.03]


def test_band_c_is_clipped_and_a_configured_reference_wins(caplog):
    saved = band().state_dict()
    assert saved["reference"] == pytest.approx(0.015)
    ctrl = BandController(ACRLSettings(enabled=True, calibration_rollouts=2, c_max=0.5))
    with caplog.at_level(logging.WARNING, logger="mismatch_ctrl"):
        ctrl.load_state_dict({**saved, "c": 3.0})
        fixed = BandController(ACRLSettings(enabled=True, reference=0.1))
        fixed.load_state_dict(saved)
    assert ctrl.c == 0.5 and "saved c 3 is outside [c_min=0.05, c_max=0.5]" in caplog.text
    assert fixed.reference == 0.1 and "reference changed from" in caplog.text
    with pytest.raises(StateError, match="acrl.observed: 3 rollouts observed without a reference"):
        BandController(BAND).load_state_dict({**saved, "reference": None, "observed": [0.1, 0.2, 0.3]})


@pytest.mark.parametrize("changes, needle", [
    (dict(short_means=[1.0]), "surge.short_means: 1 entries for 5 lengths"),
    (dict(start=None), "start None"),
    (dict(triggered_at=4, onset=None), "surge.triggered_at: 4 without an onset"),
])
def test_an_inconsistent_detector_history_is_an_error(changes, needle):
    with pytest.raises(StateError, match=needle):
        SurgeDetector(SURGE).load_state_dict({**surge().state_dict(), **changes})


def test_a_controller_set_restores_all_or_nothing():
    saved = controllers().state_dict()
    target = ControllerSet(build_config(FULL))
    before = target.state_dict()
    broken = copy.deepcopy(saved)
    broken["acrl"]["c"] = math.nan
    with pytest.raises(StateError, match=r"state\.acrl\.c: must be a finite number"):
        target.load_state_dict(broken)
    assert target.state_dict() == before
    target.load_state_dict(saved)
    assert target.state_dict() == saved and target.lr.detector is target.surge


def test_a_version_2_file_resumes_with_the_drift_guard_window_empty(tmp_path):
    config = build_config({"dcgrpo": {"enabled": True}}, architecture="moe")
    original = ControllerSet(config)
    for c_bar in (0.004, 0.02, 0.03, 0.01):  # below the clamped eps at the end: no streak to lose
        original.dcgrpo.update(c_bar)
    state = original.state_dict()
    old = copy.deepcopy(state)
    del old["dcgrpo"]["streak"], old["dcgrpo"]["lifts"]
    store = StateStore(tmp_path)
    store.path(4).write_text(json.dumps({"format": "mismatch_ctrl.state", "version": 2, "rollout_id": 4,
                                         "state": old}))
    restored = ControllerSet(config)
    restored.load_state_dict(store.load(4))
    assert restored.state_dict() == state


@pytest.mark.parametrize("recorded", [4.0, True, "4"])
def test_a_rollout_id_of_another_type_is_corrupt(tmp_path, recorded):
    store = StateStore(tmp_path)
    rollout = 1 if recorded is True else 4
    document = {"format": "mismatch_ctrl.state", "version": VERSION, "rollout_id": recorded, "state": {}}
    store.path(rollout).write_text(json.dumps(document))
    with pytest.raises(StateError, match=rf"corrupt state \(rollout_id .*, expected {rollout}\)"):
        store.load(rollout)


def test_pruning_leaves_a_directory_with_a_state_file_s_name_alone(tmp_path):
    store = StateStore(tmp_path, keep_last=1)
    store.path(1).mkdir()
    store.save(2, {"lam": 0.1})
    store.save(3, {"lam": 0.2})
    assert store.path(1).is_dir() and store.rollout_ids() == [1, 3]


def test_a_state_path_that_is_not_a_regular_file_is_named_as_such(tmp_path):
    store = StateStore(tmp_path)
    store.path(4).mkdir()
    store.path(5).symlink_to(store.path(5))  # a symlink loop
    for rollout in (4, 5):
        with pytest.raises(StateError, match=r"state_0000005\.json: not a regular file|state_0000004\.json: not a "
                                             r"regular file"):
            store.load(rollout)


def test_an_integer_beyond_any_float_is_a_state_error_naming_the_field():
    from mismatch_ctrl.state import number

    with pytest.raises(ValueError, match="must be a finite number"):
        number(10**400)
