"""Bad input, round six (issue 37, second "Done when" point), part 1: the method YAML and the slime hooks' inputs.

Written by an engineer who did not write the fixes of items 1-11. Each row is one hostile input and its correct
response: a refusal naming the field and the fix (``refused``) or, where training must go on, a guard counted in a
metric (``kept``). Part 2 (``test_hostile_round_six_state.py``) covers state files and resume, part 3
(``test_hostile_round_six_surfaces.py``) analyze, the lab's command line, the launchers, the benchmarks and the verl
adapter's checks.

Counts (the three files): 255 cases; against main before this round's fixes 214 handled, 41 mishandled; after them
255 handled, 0 mishandled. The mishandled ones, by surface, and what changed:

- method YAML (9): a second ``<<`` in one mapping and merged mappings that disagree resolved without a word
  (``yaml_file``: refused); ``010`` read as the octal 8 (refused); ``Dcgrpo``, a Cyrillic ``о`` or full-width letters
  in a top-level mismatch_ctrl key went unread (``schema.misplaced_keys`` folds case, NFKC and Cyrillic lookalikes);
  ``eta`` so small the dual update never moves lambda passed (``inert``: a warning, 2 cases).
- hooks (4): per-sample tensors of shape ``(1, n)`` or ``(n, 1)`` were flattened without a word (``inputs``: 1-D).
- state (3): ``state: null`` or a list was reported as a wrong rollout_id; an ``eps`` above what the guards can
  reach (5 with prob_diff) was resumed, switching DC-GRPO off (``dcgrpo.controller``: refused).
- analyze (6): a dumped tensor that requires grad crashed deep inside; complex log-probs were called integers; response
  lengths as strings or 12.5 were truncated by ``int``; boolean rewards read as 1/0; a ``raw_reward`` shorter than the
  samples was averaged.
- command lines (2): ``check-config ''`` and ``analyze --config ''`` named the current directory.
- launchers (5): ``GPU_MEMORY_GB`` of 80000 or 1e308 silenced every memory warning; a ``RUN_NAME`` with ``/``,
  ``..`` or a newline put SAVE_DIR elsewhere.
- benchmarks (9): ``bench_gpu.py`` / ``lab_mismatch.py --json`` a folder, a FIFO or under a missing folder failed (or
  hung) after the work; ``lab_floor_pairs.py`` called a FIFO or a folder "no such file" and gave tracebacks for bad
  JSON and a seed twice.
- verl checks (3): ``trainer.use_v1: 'true'``, ``calculate_log_probs: 1`` and ``bypass_mode: 'false'`` were refused
  as if the value were ``false`` / ``true``.
"""

from __future__ import annotations

import math
import warnings
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
import torch
from hostile import kept, judge, refused, write
from slime_data import FULL, make_args, make_batch, method, rollout_data

from mismatch_ctrl.config import inert_settings, load_config
from mismatch_ctrl.errors import ConfigError, InputError
from mismatch_ctrl.slime import hooks

M = "mismatch_ctrl:\n"
DC = "mismatch_ctrl:\n  dcgrpo:\n    enabled: true\n"


def cfg(text: str | bytes) -> Any:
    return lambda t: load_config(write(t, text), architecture="moe")


def no_yaml(text: str | bytes, *needles: str) -> Any:
    return refused(cfg(text), ConfigError, *needles)


CONFIG = {
    # merge keys, anchors and tags
    "merge key twice in one mapping": no_yaml("a: &a {preset: token_tis}\nmismatch_ctrl:\n  correction:\n    <<: *a\n"
                                              "    <<: {preset: none}\n", "duplicate key '<<'", "line 5"),
    "two merged mappings disagree": no_yaml("a: &a {eps: 0.01}\nb: &b {eps: 0.5}\nmismatch_ctrl:\n  dcgrpo:\n"
                                            "    <<: [*a, *b]\n", "'eps'", "merged mappings", "keep one"),
    "merge then an explicit key wins": kept(cfg("x: &b {enabled: true, eps: 0.5}\nmismatch_ctrl:\n  dcgrpo:\n"
                                                "    <<: *b\n    eps: 0.01\n"), lambda c: c.dcgrpo.eps == 0.01),
    "merge of a scalar": no_yaml(M + "  dcgrpo:\n    <<: 5\n", "not valid YAML", "merg"),
    "merge of an alias to a list": no_yaml("a: &a [1]\nmismatch_ctrl:\n  dcgrpo:\n    <<: *a\n", "not valid YAML"),
    "python object tag": no_yaml(M + "  name: !!python/object/apply:os.system ['true']\n", "could not determine a "
                                 "constructor"),
    "unknown local tag": no_yaml(M + "  name: !foo bar\n", "could not determine a constructor for the tag '!foo'"),
    "binary tag as the name": no_yaml(M + "  name: !!binary aGVsbG8=\n", "mismatch_ctrl.name: expected a string"),
    "set tag as the name": no_yaml(M + "  name: !!set {a, b}\n", "mismatch_ctrl.name: expected a string"),
    "a date as the name": no_yaml(M + "  name: 2024-01-01\n", "mismatch_ctrl.name: expected a string"),
    "omap section with a repeated key": no_yaml(M + "  dcgrpo: !!omap [enabled: true, enabled: false]\n",
                                                "mismatch_ctrl.dcgrpo: expected a mapping"),
    "pairs section": no_yaml(M + "  dcgrpo: !!pairs [enabled: true]\n", "mismatch_ctrl.dcgrpo: expected a mapping"),
    "!!str tag on a number": kept(cfg(DC + "    eps: !!str 0.01\n"), lambda c: c.dcgrpo.eps == 0.01),
    # duplicate keys in new spellings
    "flow duplicate in a nested section": no_yaml(M + "  dcgrpo: {enabled: true, eps: 0.01, eps: 0.5}\n",
                                                  "duplicate key 'eps'"),
    "duplicate through quotes": no_yaml(M + "  name: a\n  'name': b\n", "duplicate key 'name'"),
    "duplicate through an escape": no_yaml(M + "  name: a\n  \"n\\x61me\": b\n", "duplicate key 'name'"),
    "mismatch_ctrl twice": no_yaml(M + "  name: a\n" + M + "  name: b\n", "duplicate key 'mismatch_ctrl'"),
    "keys 1 and 0x1": no_yaml("a:\n  1: x\n  0x1: y\n" + M + "  name: a\n", "duplicate key 1"),
    "keys true and yes": no_yaml("a:\n  true: x\n  yes: y\n" + M + "  name: a\n", "duplicate key True"),
    # misplaced keys in new spellings
    "lr_decay beside mismatch_ctrl": no_yaml(M + "  name: a\nlr_decay: {enabled: true}\n", "lr_decay:",
                                             "indent it under 'mismatch_ctrl:'"),
    "torch_compile beside mismatch_ctrl": no_yaml(M + "  name: a\ntorch_compile: true\n", "indent it under"),
    "nonfinite beside mismatch_ctrl": no_yaml(M + "  name: a\nnonfinite: error\n", "indent it under"),
    "Dcgrpo (capital) beside mismatch_ctrl": no_yaml(M + "  name: a\nDcgrpo: {enabled: true}\n", "Dcgrpo",
                                                     "indent it under 'mismatch_ctrl:'"),
    "dcgrpo with a Cyrillic o beside mismatch_ctrl": no_yaml(M + "  name: a\ndcgrp\u043e: {enabled: true}\n",
                                                             "dcgrp\u043e", "indent it under"),
    "full-width correction beside mismatch_ctrl": no_yaml(M + "  name: a\n\uff43orrection: {preset: token_tis}\n",
                                                          "indent it under"),
    "mismatch-ctrl with a hyphen": no_yaml("mismatch-ctrl:\n  name: a\n", "no top-level 'mismatch_ctrl:' key"),
    "Mismatch_ctrl capitalised": no_yaml("Mismatch_ctrl:\n  name: a\n", "no top-level 'mismatch_ctrl:' key"),
    "mismatch_ctrl one level too deep": no_yaml("slime:\n  mismatch_ctrl:\n    name: a\n", "no top-level"),
    # lookalike keys inside the section
    "Cyrillic r in dcgrpo": no_yaml(M + "  dcg\u0440po:\n    enabled: true\n", "unknown key; did you mean 'dcgrpo'"),
    "Cyrillic e in eps": no_yaml(DC + "    \u0435ps: 0.5\n", "mismatch_ctrl.dcgrpo.\u0435ps: unknown key; did you mean "
                                 "'eps'"),
    "zero-width space in a key": no_yaml(M + "  dcgrpo\u200b:\n    enabled: true\n", "did you mean 'dcgrpo'"),
    "no-break space in a key": no_yaml(M + "  dcgrpo\u00a0:\n    enabled: true\n", "did you mean 'dcgrpo'"),
    "DCGRPO in capitals": no_yaml(M + "  DCGRPO:\n    enabled: true\n", "mismatch_ctrl.DCGRPO: unknown key"),
    "an integer key": no_yaml(M + "  1: x\n", "mismatch_ctrl.1: unknown key"),
    "a null key": no_yaml(M + "  ~: x\n", "mismatch_ctrl.None: unknown key"),
    "an unhashable key": no_yaml(M + "  ? [a, b]\n  : x\n", "not valid YAML", "unhashable key"),
    # encodings and bytes
    "UTF-8 BOM": kept(cfg("\ufeff" + M + "  name: bom\n"), lambda c: c.name == "bom"),
    "UTF-16": no_yaml((M + "  name: a\n").encode("utf-16"), "not UTF-8 text (byte 0"),
    "an empty file": no_yaml("", "no top-level 'mismatch_ctrl:' key"),
    "only a comment": no_yaml("# nothing\n", "no top-level 'mismatch_ctrl:' key"),
    "two documents": no_yaml(M + "  name: a\n---\n" + M + "  name: b\n", "expected a single document"),
    "a tab as indentation": no_yaml("mismatch_ctrl:\n\tname: a\n", "not valid YAML"),
    "a NUL byte": no_yaml(M + "  name: a\x00b\n", "unacceptable character"),
    "CR line ends": kept(cfg("mismatch_ctrl:\r  name: cr\r"), lambda c: c.name == "cr"),
    "flow mappings nested 3000 deep": no_yaml(M + "  name: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n",
                                              "not valid YAML"),
    "over 1 MiB": no_yaml(M + "  name: a\n" + "#" * (1 << 20) + "\n", "larger than 1 MiB"),
    # numbers
    "a leading-zero integer (YAML 1.1 octal)": no_yaml(M + "  dcgrpo:\n    calibration_rollouts: 010\n",
                                                       "010", "octal", "read as 8"),
    "a leading-zero drift window": no_yaml(M + "  dcgrpo:\n    drift_window: 0012\n", "read as 10"),
    "binary 0b11 is meant": kept(cfg(M + "  dcgrpo:\n    calibration_rollouts: 0b11\n"),
                                 lambda c: c.dcgrpo.calibration_rollouts == 3),
    "0o10 (YAML 1.2 octal, a string in 1.1)": no_yaml(M + "  dcgrpo:\n    calibration_rollouts: 0o10\n",
                                                      "calibration_rollouts: expected an integer, got '0o10'"),
    "calibration_rollouts 10.0": no_yaml(M + "  dcgrpo:\n    calibration_rollouts: 10.0\n", "expected an integer"),
    "eta 'infinity'": no_yaml(M + "  dcgrpo:\n    eta: 'infinity'\n", "dcgrpo.eta: must be a finite number"),
    "eps 'nan' quoted": no_yaml(M + "  dcgrpo:\n    eps: 'nan'\n", "dcgrpo.eps: must be a finite number"),
    "eps -0.0": no_yaml(DC + "    eps: -0.0\n", "dcgrpo.eps: must be > 0"),
    "is_high 1e39": no_yaml(M + "  correction: {preset: token_tis, is_high: 1e39}\n", "correction.is_high", "float32"),
    "lambda_max 1e30 with k3": no_yaml(DC + "    signal: k3\n    lambda_max: 1e30\n", "dcgrpo.lambda_max: must be at "
                                       "most"),
    "keep_last 0": no_yaml(M + "  state:\n    keep_last: 0\n", "state.keep_last: must be >= 1"),
    # values of the wrong kind
    "period Auto": no_yaml(M + "  lr_decay: {enabled: true, period: Auto}\n", "lr_decay.period", "'auto'"),
    "eps_guard true": no_yaml(DC + "    eps_guard: true\n", "dcgrpo.eps_guard: expected one of 'clamp', 'off'"),
    "penalty_cap null": no_yaml(DC + "    penalty_cap: null\n", "dcgrpo.penalty_cap", "'none'"),
    "architecture MoE": no_yaml(M + "  architecture: MoE\n", "mismatch_ctrl.architecture", "'moe'"),
    "preset with a leading space": no_yaml(M + "  correction: {preset: ' token_tis'}\n", "unknown preset ' token_tis'"),
    "preset 0": no_yaml(M + "  correction: {preset: 0}\n", "correction.preset: expected a preset name"),
    "torch_compile 'true'": no_yaml(M + "  torch_compile: 'true'\n", "torch_compile: expected true/false"),
    "resume latest": no_yaml(M + "  state: {resume: latest}\n", "state.resume", "'fresh'"),
    "acrl c_min above c_max": no_yaml(M + "  acrl: {enabled: true, c_min: 5, c_max: 1}\n", "acrl.c_0", "c_min"),
}


def _inert(text: str) -> Any:
    def run(t):
        return inert_settings(load_config(write(t, text), architecture="moe"))
    return run


INERT = {  # settings that leave a controller inert: an error or a warning of check-config and on_megatron_init
    "eta 1e-300: the dual update is lost": kept(_inert(DC + "    eta: 1.0e-300\n"),
                                                 lambda found: any("dcgrpo.eta" in w for w in found[1])),
    "eta 1e-8 with lambda_max 1": kept(_inert(DC + "    eta: 1.0e-8\n"), lambda found: any(
        "dcgrpo.eta" in w and "rollouts" in w for w in found[1])),
    "eta 1e-8 with penalty_form fixed": kept(_inert(DC + "    eta: 1.0e-8\n    penalty_form: fixed\n"),
                                             lambda found: not any("dcgrpo.eta" in w for w in found[1])),
    "the default eta": kept(_inert(DC), lambda found: not any("dcgrpo.eta" in w for w in found[1])),
}


@pytest.mark.parametrize("case", list(CONFIG) + list(INERT))
def test_config(case, tmp_path):
    judge({**CONFIG, **INERT}[case], tmp_path)


# --- the hooks, called as slime calls them ----------------------------------------------------------------------------

BATCH = make_batch(7)
N = len(BATCH.rewards)
TOKENS = sum(BATCH.response_lengths)
DCGRPO, GRPO, TOKEN_TIS = method("dcgrpo"), method("grpo"), method("token_tis")


def data(**changes: Any) -> dict[str, Any]:
    out = rollout_data(BATCH, FULL)
    out.update(changes)
    return out


def adv(rollout: Any = None, section: Any = DCGRPO, **flags: Any) -> Any:
    def run(t):
        d = data() if rollout is None else rollout() if callable(rollout) else rollout
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            hooks.advantages(make_args(section, **flags), d)
        return d
    return run


def each(key: str, f: Any) -> Any:
    return lambda: data(**{key: [f(x) for x in data()[key]]})


def metric(name: str, test: Any) -> Any:
    return lambda d: test(d[f"mismatch_ctrl/{name}"][0]) and all(bool(torch.isfinite(a).all()) for a in d["advantages"])


def same_advantages(d: dict[str, Any]) -> bool:
    reference = adv()(None)["advantages"]
    return all(torch.equal(a, b) and not a.requires_grad for a, b in zip(d["advantages"], reference))


def bad(rollout: Any, *needles: str, error: type = InputError, section: Any = DCGRPO, **flags: Any) -> Any:
    return refused(adv(rollout, section, **flags), error, *needles)


ADVANTAGES = {
    "rewards all None": bad(data(rewards=[None] * N), "rewards[0] must be a number, got None"),
    "rewards as numeric strings": bad(data(rewards=["1.0"] * N), "rewards[0] must be a number, got '1.0'"),
    "rewards a numpy array": bad(data(rewards=np.ones(N)), "rewards must be a list of numbers", "ndarray"),
    "rewards as Decimal": bad(data(rewards=[Decimal("1.5")] * N), "rewards[0] must be a number, got Decimal"),
    "rewards an (n, 1) tensor": bad(data(rewards=torch.zeros(N, 1)), "got a tensor of shape (16, 1)"),
    "rewards of two-element tensors": bad(data(rewards=[torch.ones(2)] * N), "rewards[0] must be a number"),
    "rewards as dicts": bad(data(rewards=[{"score": 1.0}] * N), "rewards[0] must be a number, got {{'score'"),
    "rewards a dict": bad(data(rewards=dict(enumerate([1.0] * N))), "rewards must be a list", "dict"),
    "rewards a generator": bad(data(rewards=(1.0 for _ in range(N))), "rewards must be a list", "generator"),
    "rewards complex": bad(data(rewards=[1j] * N), "rewards[0] must be a number, got 1j"),
    "rewards boolean tensors": bad(data(rewards=[torch.tensor(True)] * N), "must hold real numbers"),
    "log-probs int64": bad(each("log_probs", lambda x: x.long()), "must hold floating-point log-probs"),
    "log-probs bool": bad(each("log_probs", lambda x: x < -1), "must hold floating-point log-probs"),
    "log-probs complex": bad(each("log_probs", lambda x: x.to(torch.complex64)), "floating-point", "complex64"),
    "log-probs 0-d": bad(each("log_probs", lambda x: x.sum()), "sample 0: log_probs", "has 1 tokens"),
    "log-probs sparse": bad(each("log_probs", lambda x: x.to_sparse()), "sample 0: log_probs is a sparse_coo tensor"),
    "log-probs of shape (1, n)": bad(each("log_probs", lambda x: x[None]), "sample 0: log_probs", "1-D",
                                     "shape (1, 25)"),
    "rollout log-probs of shape (n, 1)": bad(each("rollout_log_probs", lambda x: x[:, None]),
                                             "sample 0: rollout_log_probs", "1-D"),
    "loss masks of 0.5": bad(each("loss_masks", lambda m: m.float() * 0.5), "loss_masks=0.5", "must be 0 or 1"),
    "loss masks NaN": bad(each("loss_masks", lambda m: torch.full_like(m.float(), math.nan)), "loss_masks=nan"),
    "kl one token short": bad(each("kl", lambda k: k[:-1]), "sample 0: kl has 24 tokens but the response has 25"),
    "kl entries None": bad(data(kl=[None] * N), "sample 0: kl must be a tensor, got NoneType"),
    "kl on the meta device": bad(each("kl", lambda k: k.to("meta")), "kl[0] is on meta"),
    "response_lengths a tensor": bad(data(response_lengths=torch.tensor(BATCH.response_lengths)),
                                     "response_lengths must be a list of integers"),
    "total_lengths 0": bad(data(total_lengths=[0] * N), "sample 0: total_lengths 0 < response_lengths 25"),
    "rollout_log_probs []": bad(data(rollout_log_probs=[]), "rollout_log_probs has 0 samples but response_lengths "
                                "has 16"),
    "log_probs []": bad(data(log_probs=[]), "log_probs has 0 samples"),
    "rollout_data a list": bad([1, 2], "rollout_data must be slime's dict"),
    "--num-rollout 0": bad(None, "--num-rollout must be an integer >= 1", error=ConfigError, num_rollout=0),
    "--rollout-max-response-len True": bad(None, "--rollout-max-response-len", error=ConfigError,
                                           rollout_max_response_len=True),
    "--advantage-estimator ppo": bad(None, "--advantage-estimator ppo is not supported", error=ConfigError,
                                     advantage_estimator="ppo"),
    "--advantage-estimator None": bad(None, "--advantage-estimator None", error=ConfigError, advantage_estimator=None),
    "args without mismatch_ctrl": bad(None, "args has no 'mismatch_ctrl' settings", error=ConfigError, section=None),
    # guarded and counted: training goes on
    "rewards of 400 digits": kept(adv(data(rewards=[10**400] * N)), metric("nonfinite_reward_fraction",
                                                                              lambda v: v == 1.0)),
    "rewards 1e300": kept(adv(data(rewards=[1e300] * N)), metric("nonfinite_reward_fraction", lambda v: v == 1.0)),
    "log-probs above 0": kept(adv(each("log_probs", lambda x: x + 5)), metric("nonfinite_tokens", lambda v: v > 0)),
    "log-probs all -inf": kept(adv(each("log_probs", lambda x: torch.full_like(x, -math.inf))),
                               metric("nonfinite_tokens", lambda v: v > 100)),
    "rollout log-probs all NaN": kept(adv(each("rollout_log_probs", lambda x: torch.full_like(x, math.nan))),
                                      metric("nonfinite_tokens", lambda v: v > 100)),
    "float16 rewards of 60000": kept(adv(data(rewards=torch.full((N,), 6e4, dtype=torch.float16)), GRPO),
                                     lambda d: all(a.dtype == torch.float32 and bool(torch.isfinite(a).all())
                                                   for a in d["advantages"])),
    "float16 kl with rewards 60000": kept(adv(lambda: data(kl=[k.half() for k in data()["kl"]], rewards=[6e4] * N),
                                              GRPO), lambda d: all(bool(torch.isfinite(a).all())
                                                                   for a in d["advantages"])),
    "every loss mask 0": kept(adv(each("loss_masks", torch.zeros_like)),
                              lambda d: all(bool(torch.isfinite(a).all()) for a in d["advantages"])),
    "every response of length 0": kept(adv(data(response_lengths=[0] * N, total_lengths=[5] * N,
                                                kl=[torch.zeros(0)] * N, loss_masks=[torch.zeros(0)] * N,
                                                log_probs=[torch.zeros(0)] * N,
                                                rollout_log_probs=[torch.zeros(0)] * N)),
                                       lambda d: [a.numel() for a in d["advantages"]] == [0] * N),
    "no samples at all": kept(adv(data(rewards=[], response_lengths=[], total_lengths=[], loss_masks=[], log_probs=[],
                                       rollout_log_probs=[], kl=[])), lambda d: d["advantages"] == []),
    "log-probs that require grad": kept(adv(each("log_probs", lambda x: x.clone().requires_grad_())),
                                        same_advantages),
    "non-contiguous log-probs": kept(adv(each("log_probs", lambda x: torch.stack([x, x], 1)[:, 0])), same_advantages),
    "float64 log-probs": kept(adv(lambda: data(log_probs=[x.double() for x in data()["log_probs"]])),
                              lambda d: all(a.dtype == torch.float32 for a in d["advantages"])),
}


def tis(section: Any = TOKEN_TIS, **changes: Any) -> Any:
    def run(t):
        d = data()
        kwargs = {"pg_loss": torch.ones(TOKENS), "train_log_probs": d["log_probs"],
                  "rollout_log_probs": d["rollout_log_probs"], "loss_masks": d["loss_masks"],
                  "total_lengths": d["total_lengths"], "response_lengths": d["response_lengths"]}
        kwargs.update({k: v(d) if callable(v) else v for k, v in changes.items()})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return hooks.rollout_correction(args=make_args(section), **kwargs)
    return run


def tis_bad(*needles: str, **changes: Any) -> Any:
    return refused(tis(**changes), InputError, *needles)


def counted(name: str) -> Any:
    return lambda out: float(out[2][f"mismatch_ctrl/{name}"].float().sum()) > 0


def unchanged(out: Any) -> bool:
    return torch.equal(out[0], tis()(None)[0])


CORRECTION = {
    "pg_loss complex": tis_bad("floating-point per-token loss", pg_loss=torch.ones(TOKENS, dtype=torch.complex64)),
    "pg_loss a numpy array": tis_bad("got ndarray", pg_loss=np.ones(TOKENS)),
    "pg_loss a list": tis_bad("got list", pg_loss=[1.0] * TOKENS),
    "pg_loss sparse": tis_bad("pg_loss is a sparse_coo tensor", pg_loss=torch.ones(TOKENS).to_sparse()),
    "pg_loss 0-d": tis_bad("got a tensor of shape ()", pg_loss=torch.tensor(1.0)),
    "train_log_probs None": tis_bad("train_log_probs must be a list of tensors", train_log_probs=None),
    "train_log_probs one sample short": tis_bad("train_log_probs has 15 samples",
                                                train_log_probs=lambda d: d["log_probs"][:-1]),
    "rollout log-probs int64": tis_bad("rollout_log_probs must hold floating-point",
                                       rollout_log_probs=lambda d: [x.long() for x in d["rollout_log_probs"]]),
    "rollout log-probs of shape (1, n)": tis_bad("sample 0: rollout_log_probs", "1-D", rollout_log_probs=lambda d: [
        x[None] for x in d["rollout_log_probs"]]),
    "loss masks of shape (1, n)": tis_bad("sample 0: loss_masks", "1-D",
                                          loss_masks=lambda d: [m[None] for m in d["loss_masks"]]),
    "loss masks one token long": tis_bad("loss_masks has 26 tokens", loss_masks=lambda d: [
        torch.ones(m.numel() + 1) for m in d["loss_masks"]]),
    "response_lengths floats": tis_bad("got 25.0 (float)", response_lengths=[float(n) for n in BATCH.response_lengths]),
    "response_lengths booleans": tis_bad("got True (bool)", response_lengths=[True] * N),
    "total_lengths None": tis_bad("total_lengths must be a list of integers", total_lengths=None),
    "train log-probs on the meta device": tis_bad("is on meta", train_log_probs=lambda d: [
        x.to("meta") for x in d["log_probs"]]),
    # guarded and counted
    "float16 pg_loss of 60000": kept(tis(pg_loss=torch.full((TOKENS,), 6e4, dtype=torch.float16)),
                                     counted("pg_loss_overflow_fraction")),
    "pg_loss 3e38": kept(tis(pg_loss=torch.full((TOKENS,), 3e38)), counted("pg_loss_overflow_fraction")),
    "rollout log-probs above 0": kept(tis(rollout_log_probs=lambda d: [x + 0.5 for x in d["rollout_log_probs"]]),
                                      counted("nonfinite_token_fraction")),
    "pg_loss NaN everywhere": kept(tis(pg_loss=torch.full((TOKENS,), math.nan)),
                                   counted("nonfinite_pg_loss_fraction")),
    "every loss mask 0": kept(tis(loss_masks=lambda d: [torch.zeros_like(m) for m in d["loss_masks"]]),
                              lambda out: bool(torch.isfinite(out[0]).all())),
    "bfloat16 pg_loss": kept(tis(pg_loss=torch.ones(TOKENS, dtype=torch.bfloat16)),
                             lambda out: out[0].dtype == torch.bfloat16),
    "pg_loss a stride-0 view": kept(tis(pg_loss=torch.ones(1).expand(TOKENS)), unchanged),
    "pg_loss every other element": kept(tis(pg_loss=torch.ones(2 * TOKENS)[::2]), unchanged),
}


@pytest.mark.parametrize("case", list(ADVANTAGES) + list(CORRECTION))
def test_hooks(case, tmp_path):
    judge({**ADVANTAGES, **CORRECTION}[case], tmp_path)
