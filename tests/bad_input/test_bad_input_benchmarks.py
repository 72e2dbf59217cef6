"""The benchmarks' options (issue 37, item 8): every numeric option of every script in benchmarks/ is checked when
the command line is parsed, before any work: a bad value ends the script with exit status 2 and a message naming the
option (and nothing on standard output, where the work would print)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

CASES = {
    "bench_core": [
        (["--seqs", "0"], "argument --seqs: expected an integer from 1 to 65536"),
        (["--seqs", "-3"], "argument --seqs"), (["--seqs", "1e3"], "argument --seqs"),
        (["--min-len", "0"], "argument --min-len: expected an integer from 1 to 1048576"),
        (["--max-len", "99999999"], "argument --max-len"),
        (["--min-len", "2000", "--max-len", "1000"], "--min-len 2000 is above --max-len 1000"),
        (["--seqs", "65536", "--max-len", "16000"], "--seqs x --max-len = 1,048,576,000 is above 33,554,432"),
        (["--repeats", "0"], "argument --repeats: expected an integer from 1 to 1000"),
        (["--loop-repeats", "-1"], "argument --loop-repeats"),
        (["--threads", "0"], "argument --threads: expected an integer from 1 to 1024"),
        (["--seed", "-1"], "argument --seed: expected an integer from 0 to 4294967295"),
        (["--seed", str(2**70)], "argument --seed"),
    ],
    "bench_hooks": [
        (["--tokens", "-5"], "argument --tokens: expected an integer from 1 to 16777216"),
        (["--tokens", "0"], "argument --tokens"),
        (["--seqs", "8", "0"], "argument --seqs: expected an integer from 1 to 65536"),
        (["--seqs", "300", "--tokens", "100"], "--seqs = 300 is above 100"),
        (["--token-counts", "10"], "argument --token-counts: expected an integer from 64 to 33554432"),
        (["--time-seqs", "100000"], "argument --time-seqs: expected an integer from 1 to 2048"),
        (["--repeats", "0"], "argument --repeats"), (["--seed", "x"], "argument --seed"),
    ],
    "bench_gpu": [(["--repeats", "0"], "argument --repeats"), (["--repeats", "99999999"], "argument --repeats"),
                  (["--seed", "-2"], "argument --seed")],
    "bench_fused": [(["--repeats", "-1"], "argument --repeats"), (["--seed", "1.5"], "argument --seed")],
    "gpu_check": [(["--budget", "0"], "argument --budget"), (["--budget", str(10**9)], "argument --budget"),
                  (["--steps", "2"], "argument --steps"), (["--jobs", "1000"], "argument --jobs")],
    "lab_mismatch": [(["--rollouts", "0"], "argument --rollouts"), (["--prompts", "100000"], "argument --prompts"),
                     (["--samples", "0"], "argument --samples"), (["--repeats", "0"], "argument --repeats"),
                     (["--threads", "-1"], "argument --threads"), (["--seeds", "-1"], "argument --seeds")],
    "lab_rollouts": [(["--prompts", "0"], "argument --prompts"), (["--samples", "100000"], "argument --samples"),
                     (["--repeats", "0"], "argument --repeats"), (["--threads", "0"], "argument --threads")],
}


@pytest.mark.parametrize("script, argv, message", [(s, a, m) for s, cases in CASES.items() for a, m in cases],
                         ids=[f"{s} {' '.join(a)}" for s, cases in CASES.items() for a, _ in cases])
def test_a_bad_numeric_option_exits_2_naming_it_before_any_work(script, argv, message, monkeypatch, capsys, tmp_path):
    module = importlib.import_module(script)
    extra = ["--out", str(tmp_path)] if script == "gpu_check" else []
    monkeypatch.setattr(sys, "argv", [f"{script}.py", *extra, *argv])
    with pytest.raises(SystemExit) as exit_info:
        module.main()
    captured = capsys.readouterr()
    assert exit_info.value.code == 2 and message in captured.err, captured.err
    assert captured.out == ""


def test_every_numeric_option_of_every_script_is_covered():
    """Each option of the benchmarks that takes a number appears in CASES (a new option must get its bound)."""
    import argparse

    numeric = set()
    for script in CASES:
        module = importlib.import_module(script)
        captured: list[argparse.ArgumentParser] = []
        original = argparse.ArgumentParser.parse_args

        def grab(self, *args, **kwargs):
            captured.append(self)
            raise SystemExit(0)

        argparse.ArgumentParser.parse_args = grab
        try:
            with pytest.raises(SystemExit):
                module.main(*([[]] if script.startswith("lab_") else []))
        finally:
            argparse.ArgumentParser.parse_args = original
        for action in captured[0]._actions:
            if action.type is not None and action.option_strings and action.type not in (str, Path) and \
                    getattr(action.type, "__name__", "").startswith(("integer", "seed_list")):
                numeric.add((script, action.option_strings[0]))
    tested = {(script, a[0]) for script, cases in CASES.items() for a, _ in cases}
    assert len(numeric) >= 25 and numeric <= tested, (len(numeric), sorted(numeric - tested))
