"""Controller state with verl's checkpoints: verl's real ``_save_checkpoint`` / ``_load_checkpoint`` (workers and
the dataloader stubbed) write and find ``global_step_N``; the adapter's state goes in ``global_step_N/mismatch_ctrl/``
and a run resumed from it continues the identical trajectory. Validation is slime's (mismatch_ctrl/state.py)."""

from __future__ import annotations

import json
import logging

import pytest
import yaml

from mismatch_ctrl.errors import StateError
from mismatch_ctrl.verl.runtime import VerlRuntime, read_config
from mismatch_ctrl.verl.trainer import MismatchCtrlTrainer
from verl_harness import METHODS, FakeTransferQueue, load_step, make_step, trainer_of, verl_config


class Workers:
    """verl's actor worker group: only what checkpointing calls."""

    def __init__(self):
        self.saved, self.loaded = [], []

    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        self.saved.append(local_path)

    def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=False):
        self.loaded.append(local_path)


class Loader:
    def state_dict(self):
        return {"epoch": 0}

    def load_state_dict(self, state):
        self.state = state


class Callback:
    def on_save(self, **kwargs):
        pass


def make_trainer(tmp_path, section=None, *overrides):
    method = METHODS / "dcgrpo_length_decay.yaml"
    if section is not None:
        method = tmp_path / "method.yaml"
        method.write_text(yaml.safe_dump({"mismatch_ctrl": section}))
    config = verl_config(f"trainer.default_local_dir={tmp_path / 'ckpt'}", *overrides, method=method)
    trainer = trainer_of(MismatchCtrlTrainer, config)
    trainer.mismatch_ctrl = VerlRuntime(read_config(config))
    trainer.actor_rollout_wg, trainer.train_dataloader = Workers(), Loader()
    trainer.checkpoint_callback, trainer.use_critic, trainer.trainer_mode = Callback(), False, "sync"
    trainer.global_steps = 0
    return trainer


def run_steps(trainer, monkeypatch, first, last):
    out = []
    for k in range(first, last + 1):
        queue = FakeTransferQueue()
        queue.install(monkeypatch)
        step = make_step(200 + k)
        load_step(queue, step)
        trainer.global_steps = k
        metrics = {}
        trainer._compute_advantage(step.meta(), metrics)
        out.append(({key: queue.rows[key]["advantages"] for key in step.keys}, metrics))
    return out


SECTION = {"name": "resume", "architecture": "moe", "dcgrpo": {"enabled": True, "eps": "auto",
                                                              "calibration_rollouts": 2},
           "lr_decay": {"enabled": True, "period": 2}}


def test_resume_from_global_step_continues_the_same_trajectory(tmp_path, monkeypatch):
    first = make_trainer(tmp_path, SECTION)
    run_steps(first, monkeypatch, 1, 3)
    first._save_checkpoint()
    folder = tmp_path / "ckpt" / "global_step_3"
    state = json.loads((folder / "mismatch_ctrl" / "state_0000002.json").read_text())
    assert state["rollout_id"] == 2 and state["state"]["last_rollout"] == 2
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text() == "3"
    assert first.actor_rollout_wg.saved == [str(folder / "actor")]
    expected = run_steps(first, monkeypatch, 4, 6)

    resumed = make_trainer(tmp_path, SECTION)
    resumed._load_checkpoint()  # verl's own rule: resume_mode auto reads the tracker file
    assert resumed.global_steps == 3 and resumed.actor_rollout_wg.loaded == [str(folder / "actor")]
    got = run_steps(resumed, monkeypatch, 4, 6)
    for (adv_a, met_a), (adv_b, met_b) in zip(expected, got):
        assert met_a == met_b
        assert all((adv_a[key] == adv_b[key]).all() for key in adv_a)
    # period 2: halved at rollouts 2 and 4 (verl steps 3 and 5), across the resume
    assert [m["mismatch_ctrl/lr_scale"] for _, m in got] == [0.5, 0.25, 0.25]


def test_resume_from_path_and_a_missing_state_file(tmp_path, monkeypatch, caplog):
    first = make_trainer(tmp_path, SECTION)
    run_steps(first, monkeypatch, 1, 2)
    first._save_checkpoint()
    state = tmp_path / "ckpt" / "global_step_2" / "mismatch_ctrl" / "state_0000001.json"
    state.unlink()
    resumed = make_trainer(tmp_path, SECTION, "trainer.resume_mode=resume_path",
                           f"trainer.resume_from_path={tmp_path / 'ckpt' / 'global_step_2'}")
    with pytest.raises(StateError, match="state_0000001.json: no mismatch_ctrl state.*state.resume: fresh"):
        resumed._load_checkpoint()
    fresh = make_trainer(tmp_path, {**SECTION, "state": {"resume": "fresh"}}, "trainer.resume_mode=resume_path",
                         f"trainer.resume_from_path={tmp_path / 'ckpt' / 'global_step_2'}")
    with caplog.at_level(logging.WARNING, logger="mismatch_ctrl"):
        fresh._load_checkpoint()
    assert "starting the controllers afresh" in caplog.text
    assert fresh.mismatch_ctrl.controllers.last_rollout is None


def test_an_edited_or_foreign_state_is_refused_naming_the_key(tmp_path, monkeypatch):
    first = make_trainer(tmp_path, SECTION)
    run_steps(first, monkeypatch, 1, 2)
    first._save_checkpoint()
    path = tmp_path / "ckpt" / "global_step_2" / "mismatch_ctrl" / "state_0000001.json"
    document = json.loads(path.read_text())
    document["state"]["dcgrpo"]["lam"] = "nan"
    path.write_text(json.dumps(document))
    with pytest.raises(StateError, match=r"state_0000001.json: state.dcgrpo.lam: must be a number"):
        make_trainer(tmp_path, SECTION)._load_checkpoint()
    other = {**SECTION, "dcgrpo": None, "name": "ld"}
    document["state"]["dcgrpo"]["lam"] = 0.1
    path.write_text(json.dumps(document))
    with pytest.raises(StateError, match="dcgrpo: the saved state has dcgrpo enabled but the configuration"):
        make_trainer(tmp_path, other)._load_checkpoint()
