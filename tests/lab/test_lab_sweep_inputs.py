"""What a sweep refuses or announces before any work (issue 23, item 5): an empty ``--ray-address``, a seed list whose
warm-ups would exhaust memory or take long, and a ``commands.txt`` that is not UTF-8."""

from __future__ import annotations

import re

import pytest
from sweep_helpers import TINY_WARMUP, lab_command

from mismatch_ctrl import cli
from mismatch_ctrl.lab.sweeps import budget
from mismatch_ctrl.lab.sweeps import run as lab_run


class WarmupStarted(Exception):
    """Raised by the replaced warm-up: everything before it has run."""


@pytest.fixture
def no_warmup(monkeypatch):
    def started(*_, **__):
        raise WarmupStarted

    monkeypatch.setattr(lab_run, "warmup_policy", started)


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("value", ["", "  "])
@pytest.mark.parametrize("report_only", [False, True])
def test_an_empty_ray_address_is_an_error_not_a_local_run(tmp_path, capsys, no_warmup, value, report_only):
    args = ["lab", "--out", str(tmp_path / "out"), "--ray-address", value] + (["--report-only"] if report_only else [])
    with pytest.raises(SystemExit) as stop:
        cli.main(args)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "argument --ray-address: empty (an unset variable?)" in err
    assert not (tmp_path / "out").exists()


def test_seeds_whose_warmed_up_policies_exceed_the_memory_are_refused_before_any_warm_up(tmp_path, capsys, no_warmup,
                                                                                         monkeypatch):
    monkeypatch.setattr(lab_run, "warmup_preset", lambda task, policy: TINY_WARMUP)
    monkeypatch.setattr(budget, "available_memory", lambda: 10_000_000)
    code, _, err = _cli(capsys, *lab_command(tmp_path / "out", tmp_path / "cache", "--methods", "grpo",
                                             "--seeds", ",".join(map(str, range(1000)))))
    assert code == 2 and "Traceback" not in err
    assert "--seeds: 1000 seeds to train hold 1000 warmed-up moe policies in memory at once" in err
    assert "this machine has 0.0 GB available. Train at most ~" in err


def test_the_warm_ups_of_many_uncached_seeds_are_announced_with_their_estimate_before_they_start(tmp_path, capsys,
                                                                                                no_warmup, monkeypatch):
    monkeypatch.setattr(budget, "available_memory", lambda: 10**12)  # the time estimate, whatever this machine has
    with pytest.raises(WarmupStarted):
        cli.main(lab_command(tmp_path / "out", tmp_path / "cache", "--methods", "grpo", "--seeds",
                             ",".join(map(str, range(800)))))
    out = capsys.readouterr().out
    assert "warm-up: 800 of the seeds are not cached yet; their warm-ups alone take ~" in out
    assert "(a rough estimate; 175 to 500 steps each, CPUs differ)" in out and " h on one thread" in out
    low, high = (float(x) for x in re.search(r"take ~([0-9.]+) h to ~([0-9.]+) h", out).groups())
    assert high / low == pytest.approx(500 / 175 * budget.CPU_SPREAD, rel=0.05)  # steps x the slower CPU
    with pytest.raises(WarmupStarted):
        cli.main(lab_command(tmp_path / "out2", tmp_path / "cache", "--methods", "grpo", "--seeds", "0,1"))
    assert "warm-up:" not in capsys.readouterr().out  # a few seconds of warm-up: nothing to announce


@pytest.mark.parametrize("content", [b"\xff\xfe mismatch-ctrl lab\n", b"mismatch-ctrl lab \xe9\n"])
def test_a_commands_file_that_is_not_utf8_is_named_before_any_warm_up(tmp_path, capsys, no_warmup, monkeypatch,
                                                                       content):
    monkeypatch.setattr(lab_run, "warmup_preset", lambda task, policy: TINY_WARMUP)
    out = tmp_path / "out"
    out.mkdir()
    (out / lab_run.COMMANDS_FILE).write_bytes(content)
    code, _, err = _cli(capsys, *lab_command(out, tmp_path / "cache", "--methods", "grpo", "--steps", "1"))
    assert code == 2 and "Traceback" not in err
    assert f"--out {out}: {out / lab_run.COMMANDS_FILE} cannot be read or written as UTF-8 text" in err
    assert (out / lab_run.COMMANDS_FILE).read_bytes() == content  # untouched
