"""Bad input, round six, part 3: analyze's dumps, the command lines of check-config, analyze and the lab, the
launchers' settings (``--dry-run`` in the sandbox of ``tests/launch``), the benchmarks' options and the verl
adapter's config checks. See ``test_hostile_round_six.py`` for the round."""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from analyze.synthetic import make_rollout, write_run
from hostile import kept, judge, refused
from launch_harness import Sandbox
from no_hang import within_deadline

from mismatch_ctrl.analyze import AnalyzeOptions, analyze_dumps
from mismatch_ctrl.cli import main
from mismatch_ctrl.config import build_config
from mismatch_ctrl.errors import ConfigError
from mismatch_ctrl.verl.checks import check_verl_config

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


@pytest.fixture(autouse=True)
def no_plots(monkeypatch):
    monkeypatch.setattr("mismatch_ctrl.analyze.report.write_plots", lambda result, out_dir: [])


# --- analyze: one rollout's train dump edited after slime wrote it ----------------------------------------------------

def dumps(change: Callable[[dict[str, Any]], Any] | None = None, raw: Callable[[Path], Any] | None = None
          ) -> Callable[[Path], dict[str, Any]]:
    def run(tmp: Path) -> dict[str, Any]:
        g = torch.Generator().manual_seed(0)
        write_run(tmp / "run", [make_rollout(i, g, samples=6) for i in range(3)], rollout_dumps=False)
        path = tmp / "run" / "train_data" / "1.pt"
        if change is not None:
            payload = torch.load(path, weights_only=False)
            change(payload)
            torch.save(payload, path)
        if raw is not None:
            raw(path)
        return analyze_dumps(tmp / "run", AnalyzeOptions(progress=False, architecture="moe"))
    return run


def column(key: str, f: Callable[[Any], Any]) -> Callable[[dict[str, Any]], None]:
    def change(payload: dict[str, Any]) -> None:
        for sample in payload["samples"]:
            sample[key] = f(sample[key])
    return change


def skipped(*needles: str) -> Callable[[dict[str, Any]], bool]:
    return lambda r: len(r["skipped"]) == 1 and all(n in r["skipped"][0]["reason"] for n in needles)


def rollout_1(test: Callable[[dict[str, Any]], bool]) -> Callable[[dict[str, Any]], bool]:
    return lambda r: not r["skipped"] and test(next(row for row in r["rollouts"] if row["rollout_id"] == 1))


def noted(*needles: str) -> Callable[[dict[str, Any]], bool]:
    return rollout_1(lambda row: any(all(n in note for n in needles) for note in row["notes"]))


ANALYZE = {
    "log-probs that require grad": kept(dumps(column("log_probs", lambda v: v.clone().requires_grad_())),
                                        lambda r: not r["skipped"] and len(r["rollouts"]) == 3),
    "complex log-probs": kept(dumps(column("log_probs", lambda v: v.to(torch.complex64))),
                              lambda r: skipped("complex64", "not floating-point")(r)
                              and "integers" not in r["skipped"][0]["reason"]),
    "a response length as a string": kept(dumps(column("response_lengths", str)), skipped("response_lengths",
                                                                                          "integer")),
    "a response length of 12.5": kept(dumps(column("response_lengths", lambda v: v + 0.5)),
                                      skipped("response_lengths", "integer")),
    "a response length of -1": kept(dumps(column("response_lengths", lambda v: -1)), skipped("between 0 and")),
    "booleans as rewards": kept(dumps(column("rewards", lambda v: True)), noted("rewards is True, not a number")),
    "raw_reward of one value for 6 samples": kept(dumps(lambda p: p.update(raw_reward=[1.0])),
                                                  noted("raw_reward has 1 values for 6 samples")),
    "rewards as strings": kept(dumps(column("rewards", lambda v: "1.0")), noted("rewards is '1.0', not a number")),
    "NaN rewards": kept(dumps(column("rewards", lambda v: math.nan)), rollout_1(lambda row: row["nonfinite_rewards"])),
    "log-probs above 0": kept(dumps(column("log_probs", lambda v: v + 3)),
                              rollout_1(lambda row: row["impossible_tokens"] > 0)),
    "NaN log-probs": kept(dumps(column("log_probs", lambda v: torch.full_like(v, math.nan))),
                          rollout_1(lambda row: row["nonfinite_tokens"] > 0)),
    "float16 log-probs": kept(dumps(column("log_probs", lambda v: v.half())), rollout_1(lambda row: row["measured"])),
    "log-probs a string": kept(dumps(column("log_probs", lambda v: "abc")), skipped("not a list of numbers")),
    "loss masks of 2": kept(dumps(column("loss_masks", lambda v: v * 2)), skipped("loss_masks=2")),
    "truncated 2": kept(dumps(column("truncated", lambda v: 2)), skipped("truncated must be true/false or 0/1")),
    "samples a dict": kept(dumps(lambda p: p.update(samples={"a": 1})), skipped("not a slime debug dump")),
    "samples of integers": kept(dumps(lambda p: p.update(samples=[1, 2])),
                                skipped("'samples' must be a list of dicts")),
    "another rollout_id inside": kept(dumps(lambda p: p.update(rollout_id=7)), skipped("stores rollout_id 7")),
    "the dump a FIFO": kept(dumps(raw=lambda p: (p.unlink(), os.mkfifo(p))), skipped("not a regular file")),
    "the dump empty": kept(dumps(raw=lambda p: p.write_bytes(b"")), skipped("empty or truncated")),
    "the dump JSON": kept(dumps(raw=lambda p: p.write_text("{}")), skipped("cannot be read as a torch dump")),
    "the dump a pickled list": kept(dumps(raw=lambda p: torch.save([1, 2], p)), skipped("a list")),
}


@pytest.mark.parametrize("case", ANALYZE)
def test_analyze(case, tmp_path):
    judge(ANALYZE[case], tmp_path)


# --- command lines: exit 2 and a message naming the option, never a traceback -----------------------------------------

def cli(argv: Callable[[Path], list[str]] | list[str], *needles: str) -> tuple[Any, tuple[str, ...]]:
    return argv, needles


CLI = {
    "check-config ''": cli(["check-config", ""], "check-config", "empty"),
    "analyze --config ''": cli(lambda t: ["analyze", str(t), "--config", ""], "--config", "empty"),
    "check-config --hf-config /dev/zero": cli(["check-config", "configs/methods/dcgrpo.yaml", "--hf-config",
                                               "/dev/zero"], "/dev/zero (a character device"),
    "check-config --hf-config a folder without config.json": cli(lambda t: ["check-config",
                                                                             "configs/methods/dcgrpo.yaml",
                                                                             "--hf-config", str(t)], "config.json"),
    "check-config --num-experts 1e3": cli(["check-config", "configs/methods/dcgrpo.yaml", "--num-experts", "1e3"],
                                          "--num-experts: expected an integer >= 0"),
    "lab --seeds 1,1": cli(["lab", "--seeds", "1,1"], "--seeds: expected distinct integers"),
    "lab --lr 1e-400": cli(["lab", "--lr", "1e-400"], "--lr: expected a finite number > 0"),
    "lab --quant tempnan": cli(["lab", "--quant", "tempnan"], "--quant", "needs an engine temperature"),
    "lab --quant E4M3": cli(["lab", "--quant", "E4M3"], "--quant", "unknown 'E4M3'"),
    "lab --methods grpo@e4m3+r4": cli(lambda t: ["lab", "--methods", "grpo@e4m3+r4", "--out", str(t / "o")],
                                      "suffix 'r4'"),
    "lab --methods ../../etc/passwd": cli(lambda t: ["lab", "--methods", "../../etc/passwd", "--out", str(t / "o")],
                                          "unknown lab method '../../etc/passwd'"),
    "lab --num-steps-per-rollout 2**40": cli(lambda t: ["lab", "--num-steps-per-rollout", str(2**40), "--out",
                                                        str(t / "o")], "--num-steps-per-rollout"),
    "lab --device cuda:0": cli(["lab", "--device", "cuda:0"], "--device: expected one of"),
    "lab --out a FIFO": cli(lambda t: (os.mkfifo(t / "f"), ["lab", "--out", str(t / "f")])[1], "not a directory"),
    "lab compare the same folder twice": cli(lambda t: ["lab", "compare", str(t), str(t)], "is given twice"),
    "lab compare --against grpo@": cli(lambda t: ["lab", "compare", str(t), "--against", "grpo@"], "--against"),
}


@pytest.mark.parametrize("case", CLI)
def test_cli(case, tmp_path, capsys):
    argv, needles = CLI[case]
    words = argv(tmp_path) if callable(argv) else argv
    try:
        code = within_deadline(lambda: main(words), [], deadline=60)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err


# --- the launchers' settings ------------------------------------------------------------------------------------------

LAUNCH = {  # setting -> (value, substring of the configuration error)
    "GPU_MEMORY_GB=80000 (MB given as GB)": ({"GPU_MEMORY_GB": "80000"}, "GPU_MEMORY_GB=80000"),
    "GPU_MEMORY_GB=1e308": ({"GPU_MEMORY_GB": "1e308"}, "GPU_MEMORY_GB=1e308"),
    "RUN_NAME=../../etc": ({"RUN_NAME": "../../etc"}, "RUN_NAME='../../etc' must be a plain name"),
    "RUN_NAME with a newline": ({"RUN_NAME": "a\nb"}, "RUN_NAME='a\\nb' must be a plain name"),
    "RUN_NAME with a slash": ({"RUN_NAME": "team/run"}, "RUN_NAME='team/run'"),
    "NUM_ROLLOUT in Arabic-Indic digits": ({"NUM_ROLLOUT": "\u0665"}, "NUM_ROLLOUT=\u0665 must be a positive integer"),
    "NUM_ROLLOUT=+5": ({"NUM_ROLLOUT": "+5"}, "NUM_ROLLOUT=+5 must be a positive integer"),
    "NUM_ROLLOUT=010": ({"NUM_ROLLOUT": "010"}, "NUM_ROLLOUT=010 must be a positive integer"),
    "TP with a leading space": ({"TP": " 2"}, "TP= 2 must be a positive integer"),
    "METHOD=../../etc/passwd": ({"METHOD": "../../etc/passwd"}, "does not exist (METHOD=../../etc/passwd"),
    "LR with a shell command": ({"LR": "1e-6; rm -rf /"}, "must be a finite number > 0"),
    "PASS_ENV of a name with a dash": ({"PASS_ENV": "A-B"}, "PASS_ENV holds 'A-B'"),
    "EVAL_PROTOCOL=Light": ({"EVAL_PROTOCOL": "Light"}, "EVAL_PROTOCOL=Light must be light or full"),
    "NCCL_NVLS_ENABLE=true": ({"NCCL_NVLS_ENABLE": "true"}, "NCCL_NVLS_ENABLE=true must be 0, 1 or auto"),
    "ROLLOUT_TEMPERATURE=1e-9": ({"ROLLOUT_TEMPERATURE": "1e-9"}, "outside [0.1, 2]"),
    "MODEL with a Cyrillic a": ({"MODEL": "qwen3_30b_\u04303b"}, "is unknown; known models"),
}


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> tuple[Sandbox, dict[str, str]]:
    box = Sandbox(tmp_path_factory.mktemp("launch"))
    return box, box.make_cluster()


@pytest.mark.parametrize("case", LAUNCH)
def test_launcher(case, sandbox):
    box, cluster = sandbox
    env, needle = LAUNCH[case]
    result = box.run("qwen3_30b_dcgrpo.sh", "--dry-run", env={**cluster, **env})
    assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr, result.stderr
    assert any(needle in line for line in result.stderr.splitlines() if "error" in line), result.stderr


# --- the benchmarks' options ------------------------------------------------------------------------------------------

def _json_of(tmp: Path, content: Any) -> str:
    (tmp / "a.json").write_text(content if isinstance(content, str) else json.dumps(content))
    return str(tmp / "a.json")


BENCH = {
    "bench_gpu --json a folder": ("bench_gpu", lambda t: ["--json", str(t)], "--json", "is a directory"),
    "bench_gpu --json a FIFO": ("bench_gpu", lambda t: (os.mkfifo(t / "f"), ["--json", str(t / "f")])[1], "--json",
                                "FIFO"),
    "lab_mismatch --json a folder": ("lab_mismatch", lambda t: ["--json", str(t)], "--json", "is a directory"),
    "lab_mismatch --json under a missing folder": ("lab_mismatch", lambda t: ["--json", str(t / "no" / "a.json")],
                                                   "--json", "not a directory"),
    "lab_floor_pairs of a FIFO": ("lab_floor_pairs", lambda t: (os.mkfifo(t / "f"), [str(t / "f")])[1], "FIFO"),
    "lab_floor_pairs of a folder": ("lab_floor_pairs", lambda t: [str(t)], "a directory"),
    "lab_floor_pairs of text": ("lab_floor_pairs", lambda t: [_json_of(t, "not json")], "a.json", "JSON"),
    "lab_floor_pairs of another JSON": ("lab_floor_pairs", lambda t: [_json_of(t, {"x": 1})], "a.json",
                                        "lab_mismatch.py --json"),
    "lab_floor_pairs with a seed twice": ("lab_floor_pairs", lambda t: [_json_of(t, {
        "args": {"seeds": [0, 0]}, "results": {"moe@e4m3": {"seeds": [{"floor": 0.1}, {"floor": 0.2}]}}})],
        "seed 0 is in another file too"),
}


@pytest.mark.parametrize("case", BENCH)
def test_benchmark_options(case, tmp_path, monkeypatch, capsys):
    script, argv, *needles = BENCH[case]
    module = importlib.import_module(script)
    monkeypatch.setattr(sys, "argv", [f"{script}.py", *argv(tmp_path)])
    with pytest.raises(SystemExit) as info:
        within_deadline(module.main, [], deadline=60)
    captured = capsys.readouterr()
    assert info.value.code == 2 and captured.out == "" and "Traceback" not in captured.err, captured.err
    for needle in needles:
        assert needle in captured.err, captured.err


# --- the verl adapter's checks (no verl import) -----------------------------------------------------------------------

DCGRPO = build_config({"name": "dcgrpo", "dcgrpo": {"enabled": True}}, architecture="moe")
OURS = {"trainer": {"v1": {"trainer_mode": "mismatch_ctrl"}}}


def verl(extra: dict[str, Any]) -> Callable[[Path], Any]:
    def merged(base: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
        out = dict(base)
        for key, value in more.items():
            out[key] = merged(out.get(key, {}), value) if isinstance(value, dict) else value
        return out
    return lambda t: check_verl_config(merged(OURS, extra), DCGRPO)


VERL = {
    "trainer.use_v1 the string 'true'": refused(verl({"trainer": {"use_v1": "true"}}), ConfigError,
                                                "trainer.use_v1='true'", "true"),
    "calculate_log_probs 1": refused(verl({"actor_rollout_ref": {"rollout": {"calculate_log_probs": 1}}}),
                                     ConfigError, "calculate_log_probs=1"),
    "bypass_mode the string 'false'": refused(verl({"algorithm": {"rollout_correction": {"bypass_mode": "false"}}}),
                                              ConfigError, "bypass_mode='false'"),
    "parameter_sync_step 2": refused(verl({"trainer": {"v1": {"sync": {"parameter_sync_step": 2}}}}), ConfigError,
                                     "parameter_sync_step=2"),
    "trainer_mode async": refused(verl({"trainer": {"v1": {"trainer_mode": "async"}}}), ConfigError,
                                  "trainer_mode='async'", "staleness"),
    "adv_estimator gae with DC-GRPO": refused(verl({"algorithm": {"adv_estimator": "gae"}}), ConfigError,
                                              "algorithm.adv_estimator='gae'"),
    "our own trainer mode": kept(verl({}), lambda result: result is None),
}


@pytest.mark.parametrize("case", VERL)
def test_verl_checks(case, tmp_path):
    judge(VERL[case], tmp_path)
