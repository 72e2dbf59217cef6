"""The bad-input corpus (issue 12): every input a careless or hostile user can give ``check-config``, ``analyze``,
the four slime hooks (called as slime calls them) and resume, with what must happen.

- ``ERRORS``: one row per case that must be refused, before work is spent, with the named error type and a short
  message naming the field or file (and the value and the fix where there is one). Rows marked ``[works]`` are the
  categories that were already handled well; they stay here so they keep working.
- ``CLI``: the command-line rows: exit code 2 and a message on standard error, never a traceback.
- The tests after them: cases where training or the analysis must go on, guarded and counted.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch
from analyze.synthetic import make_rollout, write_run
from slime_data import FULL, PREFIX, make_args, make_batch, method, rollout_data

from mismatch_ctrl.analyze import AnalyzeOptions, analyze_dumps
from mismatch_ctrl.analyze import analysis as analysis_module
from mismatch_ctrl.analyze.dumps import DumpError, read_rollout, write_rollout_dump, write_train_dump
from mismatch_ctrl.analyze.dumps.files import load_dump
from mismatch_ctrl.cli import main
from mismatch_ctrl.config import build_config, load_config
from mismatch_ctrl.errors import ConfigError, InputError, StateError
from mismatch_ctrl.slime import hooks
from mismatch_ctrl.slime.inputs import NONFINITE_REWARDS
from mismatch_ctrl.slime.runtime import get_runtime

BATCH = make_batch(7)
DCGRPO = method("dcgrpo")
GEO = method("geo_mis")
LENGTH_DECAY = method("length_decay")
MAX_MESSAGE = 1500


def yaml_bomb(where: str = "name") -> str:
    """A billion-laughs document: 9 levels of 9 aliases, 9^9 leaves once expanded, a few hundred bytes on disk."""
    lines = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"l{k}: &l{k} [{', '.join([f'*l{k - 1}'] * 9)}]" for k in range(1, 9)]
    return "\n".join(lines) + f"\nmismatch_ctrl:\n  {where}: *l8\n"


def bomb_object() -> Any:
    """The object a YAML alias bomb becomes (what slime's own yaml.safe_load hands on_megatron_init)."""
    import yaml

    return yaml.safe_load(yaml_bomb())["mismatch_ctrl"]["name"]


def write(tmp: Path, content: str | bytes, name: str = "method.yaml") -> Path:
    path = tmp / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def data(**changes: Any) -> dict[str, Any]:
    out = rollout_data(BATCH, FULL)
    out.update(changes)
    return out


def without(key: str) -> dict[str, Any]:
    out = data()
    del out[key]
    return out


def with_token(name: str, value: float, sample: int = 0) -> dict[str, Any]:
    """rollout_data whose first trained token of ``sample`` has ``value`` in column ``name``."""
    out = data()
    position = int(out["loss_masks"][sample].nonzero()[0, 0])
    out[name] = [t.clone() for t in out[name]]
    out[name][sample][position] = value
    return out


def tis_kwargs(source: dict[str, Any] | None = None, **changes: Any) -> dict[str, Any]:
    d = source or data()
    kwargs = {"pg_loss": torch.zeros(sum(d["response_lengths"])), "train_log_probs": d["log_probs"],
              "rollout_log_probs": d["rollout_log_probs"], "loss_masks": d["loss_masks"],
              "total_lengths": d["total_lengths"], "response_lengths": d["response_lengths"]}
    kwargs.update(changes)
    return kwargs


def advantages(section: dict[str, Any], rollout: dict[str, Any], **flags: Any) -> None:
    hooks.advantages(make_args(section, **flags), rollout)


def correction(section: dict[str, Any], **kwargs: Any) -> Any:
    return hooks.rollout_correction(args=make_args(section), **kwargs)


def on_meta(rollout: dict[str, Any]) -> dict[str, Any]:
    """``rollout`` with every per-token tensor on the meta device (shapes, no values)."""
    for key in ("loss_masks", "log_probs", "rollout_log_probs", "kl"):
        rollout[key] = [t.to("meta") for t in rollout[key]]
    return rollout


class Scheduler:
    """Megatron's OptimizerParamScheduler as the step hook uses it: the lr of a group from its max_lr."""

    @staticmethod
    def get_lr(group: dict[str, Any]) -> float:
        return group["max_lr"]


def train_step(rollout_id: Any = 0, opt_param_scheduler: Any = Scheduler(), **optimizer_attributes: Any) -> None:
    """``before_train_step`` after one rollout of the length-decay method, as slime calls it (with the optimizer's
    attributes replaced by ``optimizer_attributes``)."""
    args = make_args(LENGTH_DECAY)
    hooks.advantages(args, data())
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    for name, value in optimizer_attributes.items():
        setattr(optimizer, name, value)
    hooks.before_train_step(args, rollout_id, 0, [], optimizer, opt_param_scheduler)


def init(section: dict[str, Any] | None, **flags: Any) -> Any:
    args = make_args(section, **flags)
    hooks.on_megatron_init(args)
    return args


# --- resume -----------------------------------------------------------------------------------------------------------

CHECKPOINT = 2


def saved_run(tmp: Path, section: dict[str, Any] = DCGRPO, rollouts: int = 3) -> Path:
    """Run ``rollouts`` rollouts saving to ``tmp``, mark rollout 2 as Megatron's checkpoint; the state file."""
    args = make_args(section, save=str(tmp), save_interval=3)
    for r in range(rollouts):
        hooks.advantages(args, rollout_data(make_batch(100 + r), FULL))
    (tmp / "latest_checkpointed_iteration.txt").write_text(str(CHECKPOINT))
    return tmp / "mismatch_ctrl" / f"state_{CHECKPOINT:07d}.json"


def edit_state(tmp: Path, edit: Callable[[dict[str, Any]], None], section: dict[str, Any] = DCGRPO) -> Path:
    path = saved_run(tmp, section)
    document = json.loads(path.read_text())
    edit(document["state"])
    path.write_text(json.dumps(document))
    return path


def set_key(section_key: str, key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(state: dict[str, Any]) -> None:
        state[section_key][key] = value
    return edit


def resume(tmp: Path, section: dict[str, Any] = DCGRPO, **flags: Any) -> Any:
    return init(section, load=str(tmp), save=str(tmp), **flags)


def resume_with_replaced(name: str, edit: Callable[[dict[str, Any]], None] | None = None) -> Callable[[Path], Any]:
    """Resume after the run's tracker (``name`` = "tracker") or checkpoint state file ("state") became a directory, or
    after ``edit`` changed the state file's document (not only its ``state``)."""
    def run(tmp: Path) -> Any:
        path = saved_run(tmp)
        target = tmp / "latest_checkpointed_iteration.txt" if name == "tracker" else path
        if edit is None:
            target.unlink()
            target.mkdir()
        else:
            document = json.loads(path.read_text())
            edit(document)
            path.write_text(json.dumps(document))
        return resume(tmp)
    return run


def resume_edited(edit: Callable[[dict[str, Any]], None], section: dict[str, Any] = DCGRPO,
                  resumed: dict[str, Any] | None = None) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        edit_state(tmp, edit, section)
        return resume(tmp, resumed or section)
    return run


def resume_with_tracker(text: str) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        saved_run(tmp)
        (tmp / "latest_checkpointed_iteration.txt").write_text(text)
        return resume(tmp)
    return run


# --- analyze ----------------------------------------------------------------------------------------------------------

def run_dir(tmp: Path, rollouts: int = 3, **kw: Any) -> Path:
    g = torch.Generator().manual_seed(5)
    write_run(tmp, [make_rollout(i, g, samples=4, **kw) for i in range(rollouts)], rollout_dumps=False)
    return tmp


def analysis(directory: Path, **options: Any) -> dict[str, Any]:
    return analyze_dumps(directory, AnalyzeOptions(progress=False, architecture="dense", **options))


def custom_dump(tmp: Path, rollout_id: int, column: str, values: Callable[[int, torch.Tensor], torch.Tensor]
                ) -> None:
    """A train dump whose ``column`` of every sample is ``values(i, original)``."""
    r = make_rollout(rollout_id, torch.Generator().manual_seed(rollout_id), samples=4)
    samples = r.train_samples()
    for i, sample in enumerate(samples):
        sample[column] = values(i, sample[column])
    write_train_dump(tmp, rollout_id, samples)


# --- the corpus of refused inputs -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Bad:
    run: Callable[[Path], Any]
    error: type[Exception]
    needles: tuple[str, ...]
    """Substrings of the message; ``{tmp}`` stands for the test's directory."""


def bad(run: Callable[[Path], Any], error: type[Exception], *needles: str) -> Bad:
    return Bad(run, error, needles)


ERRORS: dict[str, Bad] = {
    # configuration: check-config and on_megatron_init share the code
    "yaml alias bomb": bad(lambda t: load_config(write(t, yaml_bomb()), architecture="moe"), ConfigError,
                           "mismatch_ctrl.name: expected a string, got [[["),
    "yaml alias bomb at init": bad(lambda t: init({"name": bomb_object()}), ConfigError, "mismatch_ctrl.name"),
    "yaml alias bomb as correction": bad(lambda t: load_config(write(t, yaml_bomb("correction"))), ConfigError,
                                         "mismatch_ctrl.correction: expected a mapping"),
    "yaml alias bomb as preset": bad(lambda t: build_config({"correction": {"preset": bomb_object()}}), ConfigError,
                                     "mismatch_ctrl.correction.preset: expected a preset name"),
    "config is a directory": bad(lambda t: load_config(t), ConfigError, "{tmp}: is a directory"),
    "config is binary": bad(lambda t: load_config(write(t, bytes(range(256)))), ConfigError, "not UTF-8 text"),
    "config is latin-1": bad(lambda t: load_config(write(t, "mismatch_ctrl:\n  name: caf\xe9\n".encode("latin-1"))),
                             ConfigError, "method.yaml: not UTF-8 text (byte 26"),
    "mismatch_ctrl is a list": bad(lambda t: load_config(write(t, "mismatch_ctrl: [1, 2]\n")), ConfigError,
                                   "mismatch_ctrl: expected a mapping of settings", "got list [1, 2]"),
    "mismatch_ctrl is a string": bad(lambda t: init("dcgrpo"), ConfigError, "got str 'dcgrpo'"),
    "duplicate yaml keys": bad(lambda t: load_config(write(t, "mismatch_ctrl:\n  dcgrpo:\n    eps: 0.01\n"
                                                              "    eps: 0.02\n")), ConfigError,
                               "duplicate key 'eps' (first on line 3, column 5)", "line 4"),
    "eps 5.0 switches dc-grpo off": bad(lambda t: build_config({"dcgrpo": {"enabled": True, "eps": 5.0}},
                                                               architecture="moe"), ConfigError,
                                        "mismatch_ctrl.dcgrpo.eps", "got 5.0", "eps: auto"),
    "rejection band below zero": bad(lambda t: build_config({"correction": {"preset": "geo_mis", "rs_low": -2.0,
                                                                            "rs_high": -0.5}}),
                                     ConfigError, "mismatch_ctrl.correction.rs_low: must be >= 0", "got -2.0"),
    "args.lr None": bad(lambda t: init(LENGTH_DECAY, lr=None), ConfigError, "--lr", "got None"),
    "args.lr NaN": bad(lambda t: init(LENGTH_DECAY, lr=math.nan), ConfigError, "--lr", "got nan"),
    "args.min_lr negative": bad(lambda t: init(LENGTH_DECAY, min_lr=-1.0), ConfigError, "--min-lr"),
    "args.rollout_max_response_len -1": bad(lambda t: init(LENGTH_DECAY, rollout_max_response_len=-1), ConfigError,
                                            "--rollout-max-response-len must be an integer >= 1", "got -1"),
    "args.rollout_max_response_len NaN": bad(lambda t: init(DCGRPO, rollout_max_response_len=math.nan), ConfigError,
                                             "--rollout-max-response-len", "got nan"),
    "save is a file": bad(lambda t: init(DCGRPO, save=str(write(t, "x", "save"))), StateError,
                          "{tmp}/save/mismatch_ctrl: cannot write the controller state", "--save"),
    "save cannot be written": bad(lambda t: init(DCGRPO, save="/proc/mismatch_ctrl_no_such_dir"), StateError,
                                  "/proc/mismatch_ctrl_no_such_dir/mismatch_ctrl: cannot write"),
    # restored state is validated like config
    "state lam NaN": bad(resume_edited(set_key("dcgrpo", "lam", math.nan)), StateError,
                         "state_0000002.json: state.dcgrpo.lam: must be a finite number, got nan", "resume: fresh"),
    "state lam inf": bad(resume_edited(set_key("dcgrpo", "lam", math.inf)), StateError, "state.dcgrpo.lam"),
    "state eps NaN": bad(resume_edited(set_key("dcgrpo", "eps", math.nan)), StateError, "state.dcgrpo.eps"),
    "state surge {}": bad(resume_edited(lambda s: s.update(surge={})), StateError,
                          "state.surge.start: missing", "state.resume: fresh"),
    "fixed eps resumed with eps auto": bad(resume_edited(lambda s: None, resumed=method("dcgrpo", dcgrpo={
        "eps": "auto"})), StateError, "state.dcgrpo.eps_setting: the saved run used eps 0.005"),
    "tracker is a directory": bad(resume_with_replaced("tracker"), StateError,
                                  "latest_checkpointed_iteration.txt: not a regular file"),
    "state file is a directory": bad(resume_with_replaced("state"), StateError, ".json: not a regular file"),
    "state version is a list": bad(resume_with_replaced("state", lambda d: d.update(version=[3])), StateError,
                                   "state version [3] is not supported"),
    "state lam beyond any float": bad(resume_edited(set_key("dcgrpo", "lam", 10**400)), StateError,
                                      "state.dcgrpo.lam", "finite"),
    "config number beyond any float": bad(lambda t: load_config(write(t, "mismatch_ctrl:\n  dcgrpo:\n    eta: "
                                                                      f"{10**400}\n"), architecture="moe"),
                                          ConfigError, "mismatch_ctrl.dcgrpo.eta: must be a finite number", "got 1000"),
    "config integer beyond 64 bits": bad(lambda t: build_config({"lr_decay": {"enabled": True, "period": 2**63}}),
                                         ConfigError, "mismatch_ctrl.lr_decay.period: must be an integer of at most 64 "
                                         "bits", "got 9223372036854775808"),
    "config section false": bad(lambda t: load_config(write(t, "mismatch_ctrl:\n  dcgrpo: false\n"),
                                                      architecture="moe"), ConfigError,
                                "mismatch_ctrl.dcgrpo: expected a mapping"),
    "config correction empty list": bad(lambda t: load_config(write(t, "mismatch_ctrl:\n  correction: []\n"),
                                                              architecture="moe"), ConfigError,
                                        "mismatch_ctrl.correction: expected a mapping"),
    "tracker holds abc": bad(resume_with_tracker("abc"), StateError, "latest_checkpointed_iteration.txt: holds 'abc'"),
    "tracker is empty": bad(resume_with_tracker(""), StateError, "latest_checkpointed_iteration.txt: holds ''"),
    "tracker holds -3": bad(resume_with_tracker("-3\n"), StateError, "holds '-3'", "an integer >= 0"),
    # the hooks, called as slime calls them
    "rewards shorter than the samples": bad(lambda t: advantages(DCGRPO, data(rewards=BATCH.rewards[:-3])),
                                            InputError, "rewards has 13 samples but response_lengths has 16"),
    "rewards missing": bad(lambda t: advantages(DCGRPO, without("rewards")), InputError,
                           "rollout_data has no 'rewards'"),
    "loss_masks missing": bad(lambda t: advantages(DCGRPO, without("loss_masks")), InputError, "'loss_masks'"),
    "total_lengths missing": bad(lambda t: advantages(DCGRPO, without("total_lengths")), InputError,
                                 "'total_lengths'"),
    "rewards not numbers": bad(lambda t: advantages(DCGRPO, data(rewards=["good"] * 16)), InputError,
                               "rewards[0] must be a number, got 'good'"),
    "log-probs as lists": bad(lambda t: advantages(DCGRPO, data(log_probs=[t.tolist() for t in BATCH.train])),
                              InputError, "sample 0: log_probs must be a tensor, got list"),
    "rollout_log_probs None (correction hook)": bad(lambda t: correction(GEO, **tis_kwargs(rollout_log_probs=None)),
                                                    InputError, "rollout_log_probs is None"),
    "response length beyond any token count": bad(lambda t: advantages(DCGRPO, data(total_lengths=[2**63] * 16)),
                                                   InputError, "total_lengths[0] must be a token count, an integer "
                                                   "from 0 to 2^53, got 9223372036854775808"),
    "response length a string": bad(lambda t: correction(GEO, **tis_kwargs(response_lengths=["5"] * 16)), InputError,
                                    "response_lengths[0] must be a token count", "got '5' (str)"),
    "pg_loss 2-D": bad(lambda t: correction(GEO, **tis_kwargs(pg_loss=torch.zeros(1, sum(BATCH.response_lengths)))),
                       InputError, "pg_loss must be slime's flat per-token loss tensor (1-D",
                       f"got a tensor of shape (1, {sum(BATCH.response_lengths)})"),
    "loss mask 2 (advantage hook)": bad(lambda t: advantages(DCGRPO, with_token("loss_masks", 2)), InputError,
                                        "sample 0: loss mask value other than 0/1", "loss_masks=2"),
    "loss mask -1 (correction hook)": bad(lambda t: correction(GEO, **tis_kwargs(with_token("loss_masks", -1))),
                                          InputError, "loss_masks=-1", "must be 0 or 1"),
    "impossible log-prob, nonfinite: error": bad(lambda t: advantages(dict(DCGRPO, nonfinite="error"),
                                                                      with_token("rollout_log_probs", 0.7)),
                                                 InputError, "sample 0: impossible log-prob (above 0)"),
    "analyze --config binary": bad(lambda t: analysis(run_dir(t), config=write(t, b"\x80\x81\xfe")), ConfigError,
                                   "not UTF-8 text"),
    # found by a fuzzing pass (2026-11-27)
    "loss_masks None": bad(lambda t: advantages(method("grpo"), data(loss_masks=None)), InputError,
                           "rollout_data has no 'loss_masks' (or it is None"),
    "log-probs on the meta device": bad(lambda t: advantages(method("grpo"), on_meta(data())), InputError,
                                        "is on the meta device", "training device"),
    "rewards on the meta device": bad(lambda t: advantages(method("grpo"), data(rewards=torch.zeros(
        len(BATCH.response_lengths), device="meta"))), InputError, "rewards is on the meta device"),
    "pg_loss on the meta device": bad(lambda t: correction(GEO, **tis_kwargs(on_meta(data()), pg_loss=torch.zeros(
        sum(BATCH.response_lengths), device="meta"))), InputError, "pg_loss is on the meta device"),
    "rejection band above rho = 1": bad(lambda t: build_config({"correction": {"rs_level": "sequence", "rs_low": 1.5,
                                                                               "rs_high": 2.0}}),
                                        ConfigError, "mismatch_ctrl.correction.rs_low: need rs_low < 1 < rs_high",
                                        "got rs_low=1.5"),
    "rejection band below rho = 1": bad(lambda t: build_config({"correction": {"rs_level": "token", "rs_high": 0.9}}),
                                        ConfigError, "mismatch_ctrl.correction.rs_high", "got rs_high=0.9"),
    "IS mask band above rho = 1": bad(lambda t: build_config({"correction": {"is_level": "token", "is_mode": "mask",
                                                                             "is_low": 1.5, "is_high": 2.0}}),
                                      ConfigError, "mismatch_ctrl.correction.is_low: need is_low <= 1 <= is_high",
                                      "got 1.5, 2"),
    "IS truncation below 1": bad(lambda t: build_config({"correction": {"is_level": "token", "is_high": 0.001}}),
                                 ConfigError, "mismatch_ctrl.correction.is_high: need is_low <= 1 <= is_high"),
    "negative surge rise": bad(lambda t: build_config({"lr_decay": {"enabled": True, "surge": {
        "min_increase_tokens": -100}}}), ConfigError, "mismatch_ctrl.lr_decay.surge.min_increase_tokens: must be >= 0"),
    "empty method name": bad(lambda t: build_config({"name": " "}), ConfigError, "mismatch_ctrl.name: give the method "
                                                                                 "a name"),
    "args.num_experts not a number": bad(lambda t: init(DCGRPO, num_experts="abc"), ConfigError,
                                         "--num-experts: expected the number of experts", "got 'abc'"),
    "before_train_step without a scheduler": bad(lambda t: train_step(opt_param_scheduler=None), ConfigError,
                                                 "opt_param_scheduler (NoneType) has no get_lr"),
    "args.save_interval a string": bad(lambda t: advantages(DCGRPO, data(), save=str(t), save_interval="3"),
                                       ConfigError, "--save-interval must be an integer >= 0", "got '3'"),
    "args.num_rollout a string": bad(lambda t: advantages(DCGRPO, data(), num_rollout="7"), ConfigError,
                                     "--num-rollout must be an integer >= 1", "got '7'"),
    "args.start_rollout_id negative": bad(lambda t: advantages(DCGRPO, data(), save=str(t), start_rollout_id=-5),
                                          ConfigError, "--start-rollout-id must be an integer >= 0", "got -5"),
    "before_train_step param_groups None": bad(lambda t: train_step(param_groups=None), ConfigError,
                                               "param_groups must be dicts of settings", "got None"),
    "before_train_step rollout_id a string": bad(lambda t: train_step(rollout_id="0"), InputError,
                                                 "rollout_id must be an integer", "got '0' (str)"),
    # [works] categories that were already handled well
    "[works] unknown key": bad(lambda t: build_config({"dcgrpo": {"lamda_0": 0.1}}), ConfigError,
                               "mismatch_ctrl.dcgrpo.lamda_0: unknown key; did you mean 'lambda_0'?"),
    "[works] wrong type": bad(lambda t: build_config({"dcgrpo": {"enabled": "yes"}}), ConfigError,
                              "mismatch_ctrl.dcgrpo.enabled: expected true/false, got 'yes'"),
    "[works] non-finite config number": bad(lambda t: build_config({"dcgrpo": {"eta": math.inf}}), ConfigError,
                                            "mismatch_ctrl.dcgrpo.eta: must be a finite number"),
    "[works] missing config file": bad(lambda t: load_config(t / "nope.yaml"), ConfigError, "no such config file"),
    "[works] invalid yaml": bad(lambda t: load_config(write(t, "mismatch_ctrl: [unclosed\n")), ConfigError,
                                "not valid YAML"),
    "[works] no mismatch_ctrl key": bad(lambda t: load_config(write(t, "dcgrpo: {}\n")), ConfigError,
                                        "no top-level 'mismatch_ctrl:' key"),
    "[works] unresolved architecture": bad(lambda t: build_config({"dcgrpo": {"enabled": True}}), ConfigError,
                                           "mismatch_ctrl.architecture"),
    "[works] preset without the tis hook": bad(lambda t: init(GEO, custom_tis_function_path=None), ConfigError,
                                               "--custom-tis-function-path"),
    "[works] log-probs length mismatch": bad(lambda t: advantages(DCGRPO, data(rollout_log_probs=[
        t[:-1] if i == 4 else t for i, t in enumerate(BATCH.rollout)])), InputError, "sample 4: rollout_log_probs"),
    "[works] loss mask shorter than the response": bad(lambda t: advantages(DCGRPO, data(loss_masks=[
        m[1:] if i == 2 else m for i, m in enumerate(BATCH.loss_masks)])), InputError, "sample 2: loss_masks"),
    "[works] pg_loss length": bad(lambda t: correction(GEO, **tis_kwargs(pg_loss=torch.zeros(3))), InputError,
                                  "pg_loss has 3 tokens"),
    "[works] non-finite log-prob, nonfinite: error": bad(lambda t: advantages(dict(DCGRPO, nonfinite="error"),
                                                                              with_token("log_probs", math.nan)),
                                                         InputError, "sample 0: non-finite log-prob"),
    "[works] rollout_log_probs missing": bad(lambda t: advantages(DCGRPO, without("rollout_log_probs")), InputError,
                                             "no 'rollout_log_probs'"),
    "[works] log_probs missing with dc-grpo": bad(lambda t: advantages(DCGRPO, without("log_probs")), InputError,
                                                  "--get-mismatch-metrics"),
    "[works] corrupt state file": bad(lambda t: (saved_run(t).write_text("{not json"), resume(t)), StateError,
                                      "state_0000002.json: unreadable mismatch_ctrl state"),
    "[works] state of another method": bad(lambda t: (saved_run(t), resume(t, method("grpo"))), StateError,
                                           "state.dcgrpo: the saved state has dcgrpo enabled"),
    "[works] missing state file": bad(lambda t: (saved_run(t).unlink(), resume(t)), StateError,
                                      "no mismatch_ctrl state for rollout 2"),
    "[works] analyze a missing directory": bad(lambda t: analysis(t / "missing"), DumpError, "not a directory"),
    "[works] analyze a directory without dumps": bad(lambda t: analysis(t), DumpError, "no dump files"),
}


@pytest.mark.parametrize("case", ERRORS)
def test_bad_input_gives_a_clear_bounded_error(case, tmp_path):
    row = ERRORS[case]
    with pytest.raises(row.error) as err:
        row.run(tmp_path)
    message = str(err.value)
    for needle in row.needles:
        assert needle.format(tmp=tmp_path) in message, message
    assert len(message) < MAX_MESSAGE, message[:MAX_MESSAGE]


# --- the command line: exit 2 and a message, never a traceback, before the analysis runs ------------------------------

def cli(setup: Callable[[Path], list[str]], *needles: str) -> tuple[Callable[[Path], list[str]], tuple[str, ...]]:
    return setup, needles


CLI: dict[str, tuple[Callable[[Path], list[str]], tuple[str, ...]]] = {
    "check-config: alias bomb": cli(lambda t: ["check-config", str(write(t, yaml_bomb())), "--arch", "moe"],
                                    "mismatch_ctrl.name: expected a string"),
    "check-config: a directory": cli(lambda t: ["check-config", str(t)], "is a directory"),
    "check-config: binary": cli(lambda t: ["check-config", str(write(t, b"\x89PNG\r\n\x1a\n\x00\xff"))],
                                "not UTF-8 text"),
    "check-config: mismatch_ctrl a list": cli(lambda t: ["check-config", str(write(t, "mismatch_ctrl: [a]\n"))],
                                              "expected a mapping of settings"),
    "check-config: a number beyond any float": cli(lambda t: ["check-config", str(write(t, "mismatch_ctrl:\n  acrl:\n"
                                                                                        f"    c_0: {10**400}\n"))],
                                                   "mismatch_ctrl.acrl.c_0: must be a finite number"),
    "check-config: duplicate key": cli(lambda t: ["check-config", str(write(t, "mismatch_ctrl:\n  name: a\n"
                                                                              "  name: b\n"))],
                                       "duplicate key 'name'"),
    "analyze --json onto its own report": cli(lambda t: ["analyze", str(run_dir(t)), "--out", str(t / "o"), "--json",
                                                         str(t / "o" / "report.md")], "would overwrite the report"),
    "analyze --out where nothing can be made": cli(lambda t: ["analyze", str(run_dir(t)), "--out", "/proc/no/such"],
                                                   "--out /proc/no/such: cannot create it"),
    "check-config --num-experts -1": cli(lambda t: ["check-config", "configs/methods/dcgrpo.yaml", "--num-experts",
                                                    "-1"], "argument --num-experts: expected an integer >= 0"),
    "check-config a FIFO": cli(lambda t: (os.mkfifo(t / "f.yaml"), ["check-config", str(t / "f.yaml")])[1],
                               "not a regular file"),
    "analyze --config binary": cli(lambda t: ["analyze", str(run_dir(t)), "--config", str(write(t, b"\xff\xfe"))],
                                   "not UTF-8 text"),
    "analyze --out an existing file": cli(lambda t: ["analyze", str(run_dir(t)), "--out", str(write(t, "x", "out"))],
                                          "--out", "exists and is not a directory"),
    "analyze --json under a file": cli(lambda t: ["analyze", str(run_dir(t)), "--json",
                                                  str(write(t, "x", "file") / "sub" / "a.json")],
                                       "--json", "is not a writable directory"),
    "analyze --json a directory": cli(lambda t: ["analyze", str(run_dir(t)), "--json", str(t)], "is a directory"),
    "analyze --lambda-0 nan": cli(lambda t: ["analyze", str(t), "--lambda-0", "nan"],
                                  "--lambda-0: must be a finite number >= 0, got 'nan'"),
    "analyze --eta inf": cli(lambda t: ["analyze", str(t), "--eta", "inf"], "--eta: must be a finite number > 0"),
    "analyze --eta 0": cli(lambda t: ["analyze", str(t), "--eta", "0"], "--eta: must be a finite number > 0"),
    "analyze --max-response-len 0": cli(lambda t: ["analyze", str(t), "--max-response-len", "0"],
                                        "--max-response-len: must be an integer >= 1"),
    "analyze --eps 5": cli(lambda t: ["analyze", str(t), "--eps", "5"], "--eps: must be a number > 0 and < 1.0"),
    "[works] analyze --eps 0": cli(lambda t: ["analyze", str(t), "--eps", "0"], "--eps"),
    "[works] analyze a missing directory": cli(lambda t: ["analyze", str(t / "missing")], "not a directory"),
    "analyze a file": cli(lambda t: ["analyze", str(write(t, "x", "dump.pt"))], "dump.pt: not a directory; give the "
                                                                             "--dump-details directory"),
    "analyze --max-response-len of 401 digits": cli(lambda t: ["analyze", str(run_dir(t)), "--max-response-len",
                                                               str(10**400)],
                                                    "argument --max-response-len: must be an integer from 1 to 2^53"),
    "analyze --config a directory": cli(lambda t: ["analyze", str(run_dir(t)), "--config",
                                                   str((t / "conf.d").mkdir() or t / "conf.d")],
                                        "conf.d: is a directory; give the method YAML"),
    "analyze --config a device": cli(lambda t: ["analyze", str(run_dir(t)), "--config", "/dev/null"],
                                     "/dev/null: a character device, not a regular file"),
    "analyze --out -": cli(lambda t: ["analyze", str(run_dir(t)), "--out", "-"], "--out -", "only for --json"),
    "lab --seeds 2**64": cli(lambda t: ["lab", "--seeds", str(2**64)], "--seeds", "from 0 to 4294967295"),
    "lab --report-only with training flags": cli(lambda t: ["lab", "--report-only", "--out", str(t), "--seeds", "0,1",
                                                            "--lr", "1e-3"],
                                                 "--report-only trains nothing, so --lr, --seeds would be ignored"),
    "[works] check-config unknown key": cli(lambda t: ["check-config", str(write(t, "mismatch_ctrl:\n  nam: a\n"))],
                                            "did you mean 'name'"),
}


@pytest.mark.parametrize("case", CLI)
def test_cli_errors_exit_2_with_a_message_before_any_dump_is_read(case, tmp_path, capsys, monkeypatch):
    setup, needles = CLI[case]
    argv = setup(tmp_path)
    read = []
    monkeypatch.setattr(analysis_module, "read_rollout", lambda *a: read.append(a) or read_rollout(*a))
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and read == [], err
    for needle in needles:
        assert needle in err, err
    assert "Traceback" not in err and len(err) < MAX_MESSAGE + 600


def test_a_run_of_unreadable_dumps_gives_one_bounded_message(tmp_path, capsys):
    (tmp_path / "train_data").mkdir()
    for i in range(300):
        (tmp_path / "train_data" / f"{i}.pt").touch()
    assert main(["analyze", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no readable rollout" in err and "and 295 more" in err and "(EOFError: empty or truncated file)" in err
    assert f"{tmp_path}/train_data/0.pt: cannot be read" in err and "0.pt: " + str(tmp_path) not in err
    assert len(err) < 2000


# --- guarded and counted: training goes on ----------------------------------------------------------------------------

def test_nonfinite_rewards_give_advantage_zero_a_metric_and_one_warning(caplog):
    """A NaN or infinite reward becomes a baseline advantage of 0 for its sample (DC-GRPO's penalty still applies):
    identical to passing 0 there; every output is finite; the fraction of such samples is logged per sample; the
    warning comes once over two rollouts."""
    bad, good = data(), data()
    for i, value in ((3, math.nan), (5, math.inf), (8, -1e39)):  # -1e39 overflows float32
        bad["rewards"][i] = value
        good["rewards"][i] = 0.0
    bad_args, good_args = make_args(DCGRPO), make_args(DCGRPO)
    with caplog.at_level(logging.WARNING, logger="mismatch_ctrl"):
        hooks.advantages(bad_args, bad)
        hooks.advantages(bad_args, data(rewards=[math.nan] + BATCH.rewards[1:]))
    hooks.advantages(good_args, good)
    assert all(torch.equal(a, b) for a, b in zip(bad["advantages"], good["advantages"]))
    assert all(bool(torch.isfinite(a).all()) for a in bad["advantages"])
    assert all(math.isfinite(v[0]) for k, v in bad.items() if k.startswith(PREFIX))
    assert bad[NONFINITE_REWARDS] == [1.0 if i in (3, 5, 8) else 0.0 for i in range(16)]
    assert good[NONFINITE_REWARDS] == [0.0] * 16
    warnings = [r for r in caplog.records if "NaN or infinite reward" in r.getMessage()]
    assert len(warnings) == 1 and "3 of 16 samples" in warnings[0].getMessage()


def test_numpy_integer_lengths_are_read_like_python_ints():
    """A custom pipeline's numpy lengths are token counts too (rewards already accept numpy numbers): same advantages,
    metrics and corrected loss as slime's Python ints."""
    as_ints, as_numpy = data(), data(response_lengths=[np.int64(n) for n in BATCH.response_lengths],
                                     total_lengths=[np.int32(n) for n in BATCH.total_lengths])
    advantages(GEO, as_ints)
    advantages(GEO, as_numpy)
    assert all(torch.equal(a, b) for a, b in zip(as_ints["advantages"], as_numpy["advantages"]))
    assert {k: v for k, v in as_ints.items() if k.startswith(PREFIX)} == \
        {k: v for k, v in as_numpy.items() if k.startswith(PREFIX)}
    (loss, _, metrics), (numpy_loss, _, numpy_metrics) = (correction(GEO, **tis_kwargs(d)) for d in (as_ints, as_numpy))
    assert torch.equal(loss, numpy_loss) and all(torch.equal(metrics[k], numpy_metrics[k]) for k in metrics)


def test_rewards_as_a_tensor_are_read_like_the_list():
    as_list, as_tensor = data(), data(rewards=torch.tensor(BATCH.rewards, dtype=torch.float64))
    advantages(DCGRPO, as_list)
    advantages(DCGRPO, as_tensor)
    assert all(torch.equal(a, b) for a, b in zip(as_list["advantages"], as_tensor["advantages"]))


def test_log_probs_above_zero_in_the_hooks():
    """Rounding (1e-4) reads as 0; an impossible value (0.7) drops the token from the loss, counted in
    nonfinite_tokens, in both hooks; every output stays finite."""
    rounded = with_token("log_probs", 1e-4)
    advantages(GEO, rounded)
    assert rounded[PREFIX + "nonfinite_tokens"][0] == 0
    impossible = with_token("rollout_log_probs", 0.7, sample=2)
    with pytest.warns(RuntimeWarning, match="impossible"):
        advantages(DCGRPO, impossible)
    assert impossible[PREFIX + "nonfinite_tokens"][0] == 1
    assert all(bool(torch.isfinite(a).all()) for a in impossible["advantages"])
    pg = torch.ones(sum(BATCH.response_lengths), requires_grad=True)
    with pytest.warns(RuntimeWarning):
        out, masks, metrics = correction(GEO, **tis_kwargs(impossible, pg_loss=pg))
    position = int(impossible["loss_masks"][2].nonzero()[0, 0])
    assert masks[2][position] == 0 and out[sum(BATCH.response_lengths[:2]) + position] == 0
    assert bool(torch.isfinite(out).all()) and all(bool(torch.isfinite(v).all()) for v in metrics.values())


def test_log_probs_that_overflowed_to_huge_negatives_count_as_nonfinite():
    """A finite log-prob below LOG_PROB_FLOOR (-3e38: an overflowed -inf) is dropped and counted like -inf, so the
    log-ppl metrics stay finite (their float32 sums overflowed before); a large but real one (-1e4) is kept."""
    huge = with_token("log_probs", -3e38)
    with pytest.warns(RuntimeWarning, match="< -1e30"):
        advantages(DCGRPO, huge)
    assert huge[PREFIX + "nonfinite_tokens"][0] == 1
    assert all(math.isfinite(huge[PREFIX + name][0]) for name in ("training_log_ppl", "log_ppl_diff", "kl",
                                                                   "log_ppl_abs_diff", "log_ppl_diff_max"))
    large = with_token("rollout_log_probs", -1e4)
    advantages(DCGRPO, large)
    assert large[PREFIX + "nonfinite_tokens"][0] == 0 and large[PREFIX + "rollout_log_ppl"][0] > 1.0
    with pytest.raises(InputError, match=r"sample 0: overflowed log-prob \(below -1e30, an -inf\) at response token"):
        advantages(dict(DCGRPO, nonfinite="error"), with_token("rollout_log_probs", -2e38))


def test_grpo_advantages_are_floating_point_whatever_the_kl_dtype():
    """slime's GRPO gives each token its sample's reward in kl's dtype; an integer or boolean kl would truncate the
    rewards, so the advantages are float32 then."""
    rollout = data(kl=[torch.zeros(n, dtype=torch.long) for n in BATCH.response_lengths])
    advantages(method("grpo"), rollout)
    assert all(a.dtype == torch.float32 for a in rollout["advantages"])
    assert [float(a[0]) for a in rollout["advantages"] if a.numel()] == \
        pytest.approx([r for r, n in zip(BATCH.rewards, BATCH.response_lengths) if n])


def rollout_only_run(tmp: Path, mask: list[float] | None = None, log_probs: list[float] | None = None) -> Path:
    """One rollout dump of 4 samples of 4 tokens (rollout log-probs only, no train_data/), sample 0 changed."""
    samples = [{"index": i, "group_index": i // 2, "response_length": 4, "tokens": list(range(8)),
                "rollout_log_probs": [-0.5, -3.0, -0.5, -0.5], "loss_mask": [1] * 4, "reward": float(i % 2),
                "status": "completed"} for i in range(4)]
    samples[0]["loss_mask"] = mask or samples[0]["loss_mask"]
    samples[0]["rollout_log_probs"] = log_probs or samples[0]["rollout_log_probs"]
    write_rollout_dump(tmp, 0, samples)
    return tmp


@pytest.mark.parametrize("mask", [[-1] * 4, [2, 1, 1, 1]], ids=["-1", "2"])
def test_rollout_only_dumps_refuse_masks_other_than_0_1_like_train_dumps(tmp_path, mask):
    with pytest.raises(DumpError, match=r"skipped .*0.pt: sample 0: loss mask value other than 0/1"):
        analyze_dumps(rollout_only_run(tmp_path, mask=mask), AnalyzeOptions(progress=False))


@pytest.mark.parametrize("bad, nonfinite, impossible", [(math.nan, 1, 0), (5.0, 0, 1), (-3e38, 1, 0)])
def test_rollout_only_dumps_count_unusable_log_probs_and_keep_the_log_ppl_finite(tmp_path, bad, nonfinite,
                                                                                impossible):
    """Without the training engine's log-probs the report still has rollout_log_ppl: an unusable log-prob is dropped
    from it and counted, as with both engines' (it was averaged in, or made the value null, before)."""
    clean = analyze_dumps(rollout_only_run(tmp_path / "clean"), AnalyzeOptions(progress=False))
    result = analyze_dumps(rollout_only_run(tmp_path / "bad", log_probs=[bad, -3.0, -0.5, -0.5]),
                           AnalyzeOptions(progress=False))
    assert (result["counts"]["nonfinite_tokens"], result["counts"]["impossible_tokens"]) == (nonfinite, impossible)
    # sample 0 keeps 3 tokens (-3.0, -0.5, -0.5): its mean log-ppl is 4/3 where it was 4.5/4 with the dropped -0.5
    expected = clean["rollouts"][0]["rollout_log_ppl"] + (4 / 3 - 4.5 / 4) / 4
    assert result["rollouts"][0]["rollout_log_ppl"] == pytest.approx(expected)


@pytest.mark.parametrize("saved_lam, lambda_max, expected", [(1e9, None, 1.0), (-5.0, None, 0.0), (0.6, 0.25, 0.25)])
def test_restored_lambda_is_clipped_to_the_current_range_with_a_warning(tmp_path, caplog, saved_lam, lambda_max,
                                                                      expected):
    edit_state(tmp_path, set_key("dcgrpo", "lam", saved_lam))
    section = DCGRPO if lambda_max is None else method("dcgrpo", dcgrpo={"lambda_max": lambda_max, "lambda_0": 0.05})
    with caplog.at_level(logging.WARNING, logger="mismatch_ctrl"):
        args = resume(tmp_path, section)
    assert get_runtime(args).controllers.dcgrpo.lam == expected
    assert f"saved lambda {saved_lam:.6g} is outside [0, lambda_max={lambda_max or 1.0:.6g}]" in caplog.text
    hooks.advantages(args, rollout_data(make_batch(200), FULL))
    assert 0.0 <= get_runtime(args).controllers.dcgrpo.lam <= (lambda_max or 1.0)


def test_a_changed_fixed_eps_is_a_warning_and_applies(tmp_path, caplog):
    saved_run(tmp_path)
    with caplog.at_level(logging.WARNING, logger="mismatch_ctrl"):
        args = resume(tmp_path, method("dcgrpo", dcgrpo={"eps": 0.08}))
    assert get_runtime(args).controllers.dcgrpo.eps == 0.08
    assert "eps changed from 0.005 (saved run) to 0.08 (configuration)" in caplog.text


def test_missing_detector_history_starts_fresh_only_with_resume_fresh(tmp_path, caplog):
    edit_state(tmp_path, lambda s: s.update(surge={}))
    with caplog.at_level(logging.WARNING, logger="mismatch_ctrl"):
        args = resume(tmp_path, method("dcgrpo", state={"resume": "fresh"}))
    runtime = get_runtime(args)
    assert runtime.next_rollout == CHECKPOINT + 1 and runtime.controllers.surge.lengths == []
    assert "state.surge.start: missing" in caplog.text and "starting the controllers afresh" in caplog.text


def test_a_release_checkpoint_starts_the_controllers_afresh(tmp_path):
    saved_run(tmp_path)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("release\n")
    args = resume(tmp_path, start_rollout_id=0)
    assert get_runtime(args).next_rollout == 0 and get_runtime(args).controllers.dcgrpo.rollouts == 0


# --- analyze: no input grows memory or time beyond the data; unusable data is told apart ------------------------------

@pytest.mark.parametrize("far", [10**15, 2 * 10**7])
def test_rollout_ids_far_apart_cost_nothing(tmp_path, far):
    g = torch.Generator().manual_seed(1)
    write_run(tmp_path, [make_rollout(0, g, samples=3), make_rollout(far, g, samples=3)], rollout_dumps=False)
    result = analysis(tmp_path)
    assert result["counts"]["missing"] == {"count": far - 1, "ranges": [[1, far - 1]], "more_ranges": 0}
    assert len(json.dumps(result)) < 200_000


def test_many_gaps_are_listed_bounded(tmp_path):
    g = torch.Generator().manual_seed(2)
    write_run(tmp_path, [make_rollout(3 * i, g, samples=3, max_len=4) for i in range(30)], rollout_dumps=False)
    missing = analysis(tmp_path)["counts"]["missing"]
    assert missing["count"] == 58 and len(missing["ranges"]) == 20 and missing["more_ranges"] == 9
    assert missing["ranges"][0] == [1, 2]


def nan_log_probs(i: int, t: torch.Tensor) -> torch.Tensor:
    return torch.full_like(t, math.nan)


@pytest.mark.parametrize("name, build, needle", [
    ("all log-probs NaN", lambda t: [custom_dump(t, r, "log_probs", nan_log_probs) for r in range(2)],
     "NaN/inf ("),
    ("all masks 0", lambda t: [custom_dump(t, r, "loss_masks", lambda i, m: torch.zeros_like(m)) for r in range(2)],
     "every loss mask is 0"),
    ("all responses empty", lambda t: write_run(t, [make_rollout(r, torch.Generator(), lengths=[0, 0])
                                                    for r in range(2)], rollout_dumps=False),
     "every response is empty"),
    ("no rollout log-probs", lambda t: write_run(t, [_omit(make_rollout(r, torch.Generator().manual_seed(r)),
                                                           "rollout_log_probs") for r in range(2)],
                                                 rollout_dumps=False), "No rollout has the rollout engine's log-probs"),
    ("no training log-probs", lambda t: write_run(t, [_omit(make_rollout(r, torch.Generator().manual_seed(r)),
                                                            "log_probs") for r in range(2)], rollout_dumps=False),
     "No rollout has the training engine's log-probs"),
])
def test_unusable_input_is_diagnosed_not_reported_as_zero(tmp_path, capsys, name, build, needle):
    build(tmp_path)
    code = main(["analyze", str(tmp_path), "--json", str(tmp_path / "a.json")])
    # Dumps with the training engine's log-probs were meant for a mismatch analysis: none measured is a failure.
    # Rollout dumps alone still give the surge detector's verdict.
    assert code == (0 if name == "no training log-probs" else 1)
    assert ("no rollout could be measured" in capsys.readouterr().err) == bool(code)
    result = json.loads((tmp_path / "a.json").read_text())
    report = (tmp_path / "analysis" / "report.md").read_text()
    assert result["recommendation"]["eps_auto"] is None and result["counts"]["measured"] == 0
    assert all(r.get("prob_diff_mean") is None for r in result["rollouts"])
    assert needle in report


def _omit(rollout: Any, column: str) -> Any:
    rollout.omit = {column}
    return rollout


def test_impossible_and_nonfinite_log_probs_are_counted_in_the_report(tmp_path, capsys):
    """Log-probs above 0 used to give C_bar 3e21 and eps 4e21; now those tokens are left out and counted (in the
    report, not only the JSON) next to the NaN ones, and the recommendation stays a probability difference."""
    for r in range(3):
        custom_dump(tmp_path, r, "log_probs", lambda i, t: t + 50.0 if i == 0 else t)
        custom_dump(tmp_path, r + 3, "rollout_log_probs",
                    lambda i, t: torch.where(torch.arange(t.numel()) == 0, math.nan, t) if i == 2 else t)
    assert main(["analyze", str(tmp_path), "--json", str(tmp_path / "a.json")]) == 0
    result = json.loads((tmp_path / "a.json").read_text())
    counts = result["counts"]
    assert counts["impossible_tokens"] > 0 and counts["nonfinite_tokens"] == 3 and counts["measured"] == 6
    assert 0 < result["recommendation"]["eps_auto"] < 1
    assert all(r["prob_diff_max"] <= 1.0 for r in result["rollouts"])
    report = (tmp_path / "analysis" / "report.md").read_text()
    assert f"{counts['impossible_tokens']} trained tokens with an impossible log-prob" in report
    assert "3 trained tokens with a NaN/inf log-prob" in report


def test_nonfinite_rewards_in_a_dump_are_counted_and_replayed_as_zero(tmp_path):
    for r in range(2):
        rollout = make_rollout(r, torch.Generator().manual_seed(r), samples=4)
        rollout.rewards[1] = math.nan
        write_train_dump(tmp_path, r, rollout.train_samples())
    result = analysis(tmp_path)
    assert result["counts"]["nonfinite_rewards"] == 2
    assert all(r["replay"]["chosen"]["penalty_share"] is not None for r in result["rollouts"])


@pytest.mark.parametrize("names, needle", [(("2.pt", "02.pt"), "rollout id 2 is named twice (02.pt, 2.pt)"),
                                          (("7.pt",), "stores rollout_id 2 but its name says 7")])
def test_ambiguous_or_disagreeing_rollout_ids_are_skipped_by_name(tmp_path, names, needle):
    run_dir(tmp_path, rollouts=3)
    train = tmp_path / "train_data"
    for name in names:
        (train / name).write_bytes((train / "2.pt").read_bytes())
    if "2.pt" not in names:
        (train / "2.pt").unlink()
    result = analysis(tmp_path)
    assert [r["rollout_id"] for r in result["rollouts"]] == [0, 1]
    assert any(needle in s["reason"] for s in result["skipped"]), result["skipped"]


class _Touch:
    """Unpickling this runs ``Path.touch`` on the marker: what a crafted dump could do with any function."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_crafted_dump_runs_no_code_by_default(tmp_path, capsys):
    marker = tmp_path / "pwned"
    run_dir(tmp_path / "run", rollouts=1)
    payload = torch.load(tmp_path / "run" / "train_data" / "0.pt", weights_only=True)
    payload["samples"][0]["metadata"] = _Touch(marker)
    torch.save(payload, tmp_path / "run" / "train_data" / "0.pt")
    assert main(["analyze", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert not marker.exists()
    assert "refused: it holds the type" in err and "--unsafe-load" in err and "Traceback" not in err


def test_unsafe_load_reads_what_the_safe_load_refuses(tmp_path):
    """A dump holding a type outside the allow-list (here a harmless Fraction) is refused by default, naming the type;
    --unsafe-load reads it. numpy scalars and arrays (a custom reward function's output) load safely."""
    samples = make_rollout(0, torch.Generator().manual_seed(0), samples=3).train_samples()
    write_train_dump(tmp_path / "fraction", 0, samples, {"raw_reward": [Fraction(1, 2), 0.0, 1.0]})
    with pytest.raises(DumpError, match="refused: it holds the type fractions.Fraction"):
        analysis(tmp_path / "fraction")
    assert analysis(tmp_path / "fraction", unsafe_load=True)["rollouts"][0]["reward_mean"] == pytest.approx(0.5)
    samples[0]["rewards"], samples[1]["rewards"], samples[2]["extra"] = np.float64(0.5), np.float32(-0.5), np.arange(3)
    write_train_dump(tmp_path / "numpy", 0, samples, {"raw_reward": list(np.array([0.0, 1.0, 1.0]))})
    assert analysis(tmp_path / "numpy")["counts"]["measured"] == 1
    # Pickle writes the buffer of an empty array (a 0-token response's numpy log-probs) and b"" as a call of bytes.
    samples[0]["extra"], samples[1]["extra"] = np.zeros(0, np.float32), b""
    write_train_dump(tmp_path / "empty", 0, samples, {"raw_reward": [0.0, 1.0, 1.0]})
    assert analysis(tmp_path / "empty")["counts"]["measured"] == 1


class _Claim:
    """Unpickles as ``fn(*args)``: a small file claiming a large allocation."""

    def __init__(self, fn, *args) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


@pytest.mark.parametrize("claim, fragment", [
    (lambda: _Claim(bytes, 3 * 10**9), "only the empty byte string"),
    (lambda: _Claim((getattr(np, "_core", None) or np.core).multiarray._reconstruct, np.ndarray, (10**9,), b"f"),
     "an array built with shape (1000000000,) before its data"),
])
def test_a_dump_claiming_a_huge_allocation_is_refused_without_it(tmp_path, claim, fragment):
    """Safe loading builds byte strings and numpy arrays only from what the file holds: bytes(n) and an array shaped
    before its data would let a 1 kB file take gigabytes."""
    samples = make_rollout(0, torch.Generator().manual_seed(0), samples=3).train_samples()
    samples[0]["extra"] = claim()
    write_train_dump(tmp_path, 0, samples)
    assert (tmp_path / "train_data" / "0.pt").stat().st_size < 10_000
    with pytest.raises(DumpError, match=re.escape(fragment)):
        load_dump(tmp_path / "train_data" / "0.pt")


def test_huge_response_length_without_tokens_allocates_nothing(tmp_path):
    """A dump claiming 10^12-token responses but holding no token tensors reads in constant memory."""
    write_train_dump(tmp_path, 0, [{"response_lengths": 10**12, "rewards": 1.0}, {"response_lengths": 5}])
    result = analysis(tmp_path)
    assert result["rollouts"][0]["max_response_length_seen"] == 10**12 and result["counts"]["measured"] == 0
