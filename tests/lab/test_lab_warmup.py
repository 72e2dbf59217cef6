import dataclasses

import pytest
import torch

from mismatch_ctrl.lab.model.task import DIGIT0, EOS, PAD, AdditionTask
from mismatch_ctrl.lab.model.warmup import (
    CACHE_ENV,
    WARMUP_PRESETS,
    WarmupConfig,
    cache_path,
    corrupt_answers,
    default_cache_dir,
    warmup_policy,
    warmup_preset,
)


def tiny(**changes: object) -> WarmupConfig:
    base = dict(
        task="add", task_options={"max_digits": 2}, d_model=16, n_layers=1, n_heads=2, d_ff=32,
        steps=2, batch_size=8, min_sample_accuracy=0.0, extra_steps=3, max_steps=8, eval_prompts=8, eval_samples=1,
    )
    return WarmupConfig(**{**base, **changes})


def test_corrupt_answers_changes_one_digit_in_the_chosen_fraction():
    task = AdditionTask()
    answers = task.answers(task.make_prompts(400, torch.Generator().manual_seed(0)))
    assert torch.equal(corrupt_answers(answers, 0.0, torch.Generator().manual_seed(1)), answers)
    every = corrupt_answers(answers, 1.0, torch.Generator().manual_seed(1))
    changed = every != answers
    assert (changed.sum(dim=1) == 1).all()
    assert ((every[changed] >= DIGIT0) & (answers[changed] >= DIGIT0)).all()
    assert torch.equal(every == EOS, answers == EOS) and torch.equal(every == PAD, answers == PAD)
    some = corrupt_answers(answers, 0.3, torch.Generator().manual_seed(2))
    assert 0.22 < (some != answers).any(dim=1).float().mean() < 0.38


def test_cache_written_atomically_then_reused(tmp_path):
    first = warmup_policy(tiny(), cache_dir=tmp_path)
    assert not first.from_cache and first.path == cache_path(tiny(), tmp_path) and first.path.exists()
    assert [p.name for p in tmp_path.iterdir()] == [first.path.name]
    second = warmup_policy(tiny(), cache_dir=tmp_path)
    assert second.from_cache and second.steps == first.steps
    assert second.sample_accuracy == first.sample_accuracy
    for name, value in first.policy.state_dict().items():
        assert torch.equal(second.policy.state_dict()[name], value)
    other = warmup_policy(tiny(seed=1), cache_dir=tmp_path)
    assert not other.from_cache and other.path != first.path


def test_same_config_same_weights_without_cache(tmp_path):
    a = warmup_policy(tiny(), use_cache=False)
    b = warmup_policy(tiny(), use_cache=False)
    assert a.path is None and b.path is None
    assert all(torch.equal(x, y) for x, y in zip(a.policy.parameters(), b.policy.parameters()))
    untrained = warmup_policy(tiny(steps=1, max_steps=1), use_cache=False)
    assert not torch.equal(untrained.policy.lm_head.weight, a.policy.lm_head.weight)


def test_training_continues_while_accuracy_is_low():
    assert warmup_policy(tiny(min_sample_accuracy=0.0), use_cache=False).steps == 2
    low = warmup_policy(tiny(min_sample_accuracy=1.01), use_cache=False)
    assert low.steps == 8  # 2, then chunks of 3 up to max_steps
    assert low.sample_accuracy < 1.01


def test_cache_keys_on_the_policy_kind_and_each_kind_gets_its_shape(tmp_path):
    moe, dense = tiny(), tiny(policy="dense")
    assert moe.key() != dense.key() and cache_path(moe, tmp_path) != cache_path(dense, tmp_path)
    assert "-moe-" in cache_path(moe, tmp_path).name and "-dense-" in cache_path(dense, tmp_path).name
    task = AdditionTask(max_digits=2)
    assert moe.policy_config(task).n_experts == 8 and dense.policy_config(task).n_experts == 0
    assert dense.policy_config(task).d_ff == 32  # the config's d_ff overrides the kind's width
    assert warmup_preset("add", "dense", seed=3) == dataclasses.replace(WARMUP_PRESETS["add"], policy="dense", seed=3)
    first = warmup_policy(moe, cache_dir=tmp_path)
    assert first.policy.config.kind == "moe" and not warmup_policy(dense, cache_dir=tmp_path).from_cache
    assert warmup_policy(moe, cache_dir=tmp_path).from_cache


def test_cache_dir_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    assert default_cache_dir() == tmp_path / "lab"
    assert cache_path(tiny()).parent == tmp_path / "lab"
    monkeypatch.delenv(CACHE_ENV)
    assert default_cache_dir().parts[-3:] == (".cache", "mismatch_ctrl", "lab")


def test_key_depends_on_every_field_and_bad_config_is_named():
    assert tiny().key() == tiny().key()
    assert tiny(lr=1e-3).key() != tiny().key()
    assert tiny(task_options={"max_digits": 3}).key() != tiny().key()
    with pytest.raises(ValueError, match="policy"):
        tiny(policy="sparse")
    with pytest.raises(ValueError, match="max_steps"):
        tiny(max_steps=1)
    with pytest.raises(ValueError, match="corrupt_frac"):
        tiny(corrupt_frac=1.5)


def test_failed_write_leaves_no_file_and_unreadable_cache_is_retrained(tmp_path, monkeypatch):
    def broken_save(obj, f):
        f.write(b"partial")
        raise OSError("disk full")

    with monkeypatch.context() as patch:
        patch.setattr(torch, "save", broken_save)
        with pytest.raises(OSError, match="disk full"):
            warmup_policy(tiny(), cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []
    cache_path(tiny(), tmp_path).write_bytes(b"not a checkpoint")
    messages = []
    result = warmup_policy(tiny(), cache_dir=tmp_path, log=messages.append)
    assert not result.from_cache and any("unreadable" in m for m in messages)
    assert warmup_policy(tiny(), cache_dir=tmp_path).from_cache


def test_the_large_policy_warms_up_at_its_own_lr_and_the_others_keep_the_task_preset():
    large, small = warmup_preset("add", "moe-large", seed=3), warmup_preset("add", "moe", seed=3)
    assert (large.lr, large.steps, large.policy, large.seed) == (5e-4, 100, "moe-large", 3)
    assert small == dataclasses.replace(WARMUP_PRESETS["add"], policy="moe", seed=3)
    assert warmup_preset("reverse", "dense") == dataclasses.replace(WARMUP_PRESETS["reverse"], policy="dense")
