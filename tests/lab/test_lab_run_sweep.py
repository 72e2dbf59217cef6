"""The lab sweep: fingerprinted run folders, resuming, refusing other settings, the lock, Ctrl-C, unwritable
directories, long names, --report-only on bad files, progress and the summary table."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sweep_helpers import TINY_WARMUP, lab_command, start_lab

from mismatch_ctrl import cli
from mismatch_ctrl.lab.sweeps import run as lab_run
from mismatch_ctrl.lab.sweeps.executors import LocalExecutor, RunFailed
from mismatch_ctrl.lab.training.methods import RunSpec
from mismatch_ctrl.lab.sweeps.progress import SweepProgress
from mismatch_ctrl.lab.results.console import summary_table
from mismatch_ctrl.lab.results.table import RunTable
from mismatch_ctrl.lab.sweeps.run import rewrite_report, run_lab
from mismatch_ctrl.lab.sweeps.integrity import check_runs, run_folders
from mismatch_ctrl.lab.sweeps.lock import LOCK_FILE, OutLock
from mismatch_ctrl.lab.sweeps.sweep import (FINGERPRINT_FILE, RunTask, SweepError, differences, digest,
                                           fingerprint_inputs, record_digest)
from mismatch_ctrl.lab.training.settings import LabSettings

TINY = dict(steps=2, prompts_per_step=4, samples_per_prompt=4, eval_every=1, eval_prompts=8)
RUNS = [RunSpec("grpo", "none"), RunSpec("grpo", "e4m3")]


def lab(out: Path, runs: list[RunSpec] = RUNS, **kw) -> lab_run.LabResult:
    settings = {**TINY, **kw.pop("settings", {})}
    return run_lab(runs, LabSettings(**settings), out, cache_dir=out.parent / "cache", show_progress=False,
                   warmup=TINY_WARMUP, **kw)


def metrics(folder: Path) -> list[dict]:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


@pytest.fixture(autouse=True)
def tiny_cli(monkeypatch):
    """The CLI's warm-up preset replaced by the tiny warm-up (everything else as a user runs it)."""
    monkeypatch.setattr(lab_run, "warmup_preset", lambda task, policy: TINY_WARMUP)


def test_fingerprint_covers_every_dataclass_field_and_names_the_difference():
    spec, settings = RUNS[1], LabSettings(**TINY)
    inputs = fingerprint_inputs(spec, settings, TINY_WARMUP)
    assert set(inputs["settings"]) == set(LabSettings.__dataclass_fields__)
    assert set(inputs["warmup"]) == set(type(TINY_WARMUP).__dataclass_fields__)
    assert set(inputs["run"]) == set(RunSpec.__dataclass_fields__)
    assert inputs["method_config"]["name"] == "grpo"
    for changed in (fingerprint_inputs(spec, LabSettings(**{**TINY, "lr": 2e-3}), TINY_WARMUP),
                    fingerprint_inputs(RunSpec("grpo", "e5m2"), settings, TINY_WARMUP),
                    fingerprint_inputs(spec, settings, TINY_WARMUP.__class__(**{**TINY_WARMUP.__dict__, "lr": 1.0}))):
        assert digest(changed) != digest(inputs)
    assert digest(fingerprint_inputs(spec, LabSettings(**TINY), TINY_WARMUP)) == digest(inputs)
    assert differences({"a": {"b": 1, "c": 2}}, {"a": {"b": 1, "c": 3}, "d": 4}) == "a.c: 2 -> 3; d: '<absent>' -> 4"


def test_rerun_skips_finished_runs_trains_missing_ones_and_refuses_other_settings(tmp_path):
    out = tmp_path / "out"
    first = lab(out, runs=RUNS[:1])
    folder = out / "grpo@none" / "seed0"
    before = metrics(folder)
    stamp = (folder / "metrics.jsonl").stat().st_mtime_ns
    second = lab(out, seeds=(0, 1))
    assert (folder / "metrics.jsonl").stat().st_mtime_ns == stamp  # not trained again
    assert [(s["label"], s["seed"]) for s in second.summaries] == [("grpo@none", 0), ("grpo@none", 1),
                                                                   ("grpo@e4m3", 0), ("grpo@e4m3", 1)]
    assert second.summaries[0] == {**first.summaries[0]}
    lab(tmp_path / "fresh", runs=RUNS[:1])  # the same run trained from scratch elsewhere: resuming changes nothing
    assert metrics(folder) == before == metrics(tmp_path / "fresh" / "grpo@none" / "seed0")
    for folder in out.glob("*/seed*"):
        recorded = json.loads((folder / FINGERPRINT_FILE).read_text())
        assert recorded["sha256"] == record_digest(recorded["inputs"], recorded["files"])
    with pytest.raises(SweepError, match=r"out/grpo@\w+/seed\d was trained with other settings "
                                         r"\(settings.steps: 2 -> 3\)"):
        lab(out, settings={"steps": 3})
    with pytest.raises(SweepError, match="other settings"):  # other settings for a run not trained yet: refused too
        lab(out, runs=[RunSpec("dcgrpo", "e4m3")], settings={"lr": 5e-3})
    assert not (out / "dcgrpo@e4m3").exists()


def test_unfinished_folders_are_restarted_and_a_folder_without_fingerprint_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    partial = out / "grpo@none" / ".seed0.partial"
    partial.mkdir(parents=True)
    (partial / "metrics.jsonl").write_text('{"step": 0}\n')
    result = run_lab(RUNS[:1], LabSettings(**TINY), out, cache_dir=tmp_path / "cache", warmup=TINY_WARMUP,
                     show_progress=True)
    assert not partial.exists() and (out / "grpo@none" / "seed0" / FINGERPRINT_FILE).is_file()
    assert f"removed the unfinished run folder {partial}" in capsys.readouterr().out
    assert len(result.summaries) == 1
    stray = out / "grpo@e4m3" / "seed0"
    stray.mkdir(parents=True)
    with pytest.raises(SweepError, match=f"{stray}: a damaged run \\(no {FINGERPRINT_FILE}: made by an older lab"):
        lab(out)
    assert stray.is_dir()  # nothing deleted
    stray.rmdir()
    (out / "grpo@none" / "seed0" / FINGERPRINT_FILE).write_text('{"inputs": [')
    with pytest.raises(SweepError, match=f"{out / 'grpo@none' / 'seed0'}: a damaged run \\({FINGERPRINT_FILE} is "
                                         "unreadable or malformed"):
        lab(out)


def test_a_second_process_on_the_same_out_is_refused_ctrl_c_keeps_finished_runs_and_a_rerun_continues(tmp_path):
    out, cache = tmp_path / "out", tmp_path / "cache"
    first = start_lab(out, cache, "--methods", "grpo@none,grpo", "--steps", "3000", "--jobs", "1")
    try:
        line = ""
        while not line.startswith("start grpo@none seed 0"):
            line = first.stderr.readline()
            assert line or first.poll() is None, first.communicate()
        second = subprocess.run([sys.executable, "-c", "import sys; from mismatch_ctrl import cli; "
                                 "sys.exit(cli.main(sys.argv[1:]))",
                                 *lab_command(out, cache, "--methods", "grpo@none", "--steps", "3000")],
                                capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert second.returncode == 2
        assert f"another lab process (pid {first.pid}) is writing there" in second.stderr
        assert "Traceback" not in second.stderr
    finally:
        first.send_signal(signal.SIGINT)
        stdout, stderr = first.communicate(timeout=60)
    assert first.returncode == 130, stderr
    assert f"interrupted: 0 of 2 runs are finished and kept in {out}; rerun the same command" in stderr
    assert "Traceback" not in stderr
    assert not (out / LOCK_FILE).exists()
    assert not list(out.glob("*/.seed*"))  # nothing half-written


def test_ctrl_c_in_a_parallel_sweep_keeps_the_finished_run_and_the_rerun_trains_only_the_rest(tmp_path):
    out, cache = tmp_path / "out", tmp_path / "cache"
    sweep = ("--methods", "grpo@none,grpo", "--steps", "30", "--seeds", "0,1", "--jobs", "2")
    stdout, stderr = start_lab(out, cache, *sweep[2:4], "--methods", "grpo@none", "--seeds", "0").communicate()
    assert (out / "grpo@none" / "seed0" / FINGERPRINT_FILE).is_file(), stderr
    proc = start_lab(out, cache, *sweep)
    started = 0
    while started < 2:
        line = proc.stderr.readline()
        assert line or proc.poll() is None, proc.communicate()
        started += line.startswith("start ")
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr
    assert f"interrupted: 1 of 4 runs are finished and kept in {out}; rerun the same command" in stderr
    assert not list(out.glob("*/.seed*")) and not (out / LOCK_FILE).exists()
    assert [p.parent.name for p in out.glob(f"*/seed*/{FINGERPRINT_FILE}")] == ["seed0"]
    stdout, stderr = start_lab(out, cache, *sweep).communicate(timeout=300)
    assert f"1 of 4 runs already finished in {out}: kept, not trained again" in stdout, stderr
    assert stderr.count("start ") == 3 and stderr.count("done ") == 3
    assert len(list(out.glob(f"*/seed*/{FINGERPRINT_FILE}"))) == 4 and "grpo@e4m3" in stdout


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_a_parallel_sweep_stopped_by_a_signal_leaves_no_worker_training_on(how):
    """SIGTERM (a scheduler, ``timeout``) stops the sweep as Ctrl-C does; after SIGKILL the workers end with their
    parent. Before, both left the workers training, orphaned, for results nobody would read."""
    from sweep_helpers import gone, read_lines, start_sleeping_sweep

    proc, workers = start_sleeping_sweep(), []
    try:
        workers = [int(line) for line in read_lines(proc.stdout, 2, timeout=120)]
        assert len(workers) == 2, proc.stderr.read() if proc.poll() is not None else "the workers did not start"
        proc.send_signal(how)
        stdout, stderr = proc.communicate(timeout=60)
        if how == signal.SIGTERM:
            assert stdout.strip() == "interrupted" and "Traceback" not in stderr, stderr
        assert all(gone(pid, within=20) for pid in workers)
    finally:
        proc.kill()
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_stale_lock_of_a_dead_process_is_taken_over_with_a_message(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_FILE).write_text(f"{dead.pid}\n")
    messages = []
    with OutLock(out, messages.append):
        assert (out / LOCK_FILE).read_text().strip() == str(os.getpid())
        with pytest.raises(SweepError, match=f"another lab process \\(pid {os.getpid()}\\)"):
            OutLock(out).__enter__()
    assert messages == [f"taking over the stale lock {out / LOCK_FILE} (left by pid {dead.pid}, which no longer holds "
                        "it)"]
    assert not (out / LOCK_FILE).exists()


def _mount(path: Path, *options: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(path)], capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.decode().strip()}")


@pytest.fixture
def mounts(tmp_path):
    mounted: list[Path] = []
    yield lambda name, *options: (_mount(tmp_path / name, *options), mounted.append(tmp_path / name))[1] or \
        tmp_path / name
    for path in mounted:
        subprocess.run(["umount", str(path)], check=False)


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("options, needle", [(("ro",), "Read-only file system"), (("size=16k",), "MB free")])
def test_read_only_or_full_out_or_cache_is_refused_naming_the_path_before_the_warm_up(tmp_path, mounts, capsys,
                                                                                     monkeypatch, options, needle):
    def no_warmup(*_, **__):
        raise AssertionError("the warm-up must not start")

    monkeypatch.setattr(lab_run, "warmup_policy", no_warmup)
    bad = mounts("bad", *options)
    code, _, err = _cli(capsys, *lab_command(bad / "out" if "ro" in options else bad, tmp_path / "cache",
                                             "--methods", "grpo", "--steps", "2000"))
    assert code == 2 and f"--out {bad}" in err and needle in err
    if "ro" in options:
        code, _, err = _cli(capsys, *lab_command(tmp_path / "out", bad / "cache", "--methods", "grpo", "--steps", "2"))
        assert code == 2 and f"--cache-dir {bad / 'cache'}" in err and needle in err


def test_report_only_on_a_read_only_out_is_a_clear_error(tmp_path, mounts, capsys):
    out = mounts("out", "size=8m")
    lab(out, runs=RUNS[:1])
    code, stdout, _ = _cli(capsys, "lab", "--report-only", "--out", str(out))
    assert code == 0 and "grpo@none" in stdout and "late acc" in stdout
    subprocess.run(["mount", "-o", "remount,ro", str(out)], check=True)
    code, _, err = _cli(capsys, "lab", "--report-only", "--out", str(out))
    assert code == 2 and f"--out {out}" in err and "Read-only file system" in err and "Traceback" not in err


def test_a_disk_that_fills_during_the_sweep_is_a_clear_error_and_no_half_written_run(tmp_path, mounts, capsys):
    out = mounts("small", "size=64k")
    lab(tmp_path / "ref", runs=RUNS[:1])  # warm the cache
    code, _, err = _cli(capsys, *lab_command(out, tmp_path / "cache", "--methods", "grpo@none,grpo", "--steps", "2",
                                             "--dump-details", "--jobs", "1"))
    assert code == 2 and f"--out {out}: cannot write run" in err and "No space left on device" in err
    assert "Traceback" not in err
    assert not list(out.glob("*/.seed*")) and not (out / LOCK_FILE).exists()


def test_a_run_name_too_long_for_a_folder_is_refused_before_the_warm_up(tmp_path, capsys):
    from mismatch_ctrl.lab.sweeps.sweep import check_names

    long = RunSpec("x" * 300, "e4m3")
    with pytest.raises(SweepError, match="too long for a folder name"):
        check_names(tmp_path, [long])
    check_names(tmp_path, RUNS)
    code = cli.main(lab_command(tmp_path / "o", tmp_path / "c", "--methods", "x" * 5000))
    err = capsys.readouterr().err
    assert code == 2 and "--methods: unknown lab method 'xxx" in err and len(err) < 2000
    assert not (tmp_path / "o").exists()


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished sweep of ``RUNS`` (seed 0) that tests copy before they change it."""
    out = tmp_path_factory.mktemp("trained") / "out"
    lab(out)
    return out


@pytest.mark.parametrize("damage, needle", [
    (lambda f: (f / "run.json").write_text("{not json"), "run.json is unreadable or malformed"),
    (lambda f: (f / "run.json").write_bytes(b"\xff\xfe"), "run.json is unreadable or malformed"),
    (lambda f: (f / "run.json").write_text('{"method": "grpo"}'), "run.json is unreadable or malformed"),
    (lambda f: (f / "run.json").write_text((f / "run.json").read_text().replace('"lr": 0.001', '"lr": 0.5')),
     "run.json disagrees with fingerprint.json: settings.lr: 0.001 -> 0.5"),
    (lambda f: (f / "metrics.jsonl").write_text("[1, 2]\n"), "metrics.jsonl holds a line that is not a rollout's"),
    (lambda f: (f / "metrics.jsonl").write_text('{"step": 0, "rew'), "metrics.jsonl is unreadable"),
    (lambda f: (f / "metrics.jsonl").write_text((f / "metrics.jsonl").read_text().splitlines()[0] + "\n"),
     "metrics.jsonl holds 1 of the run's 2 rollouts"),
    (lambda f: (f / "metrics.jsonl").write_text((f / "metrics.jsonl").read_text().replace('"step": 1', '"step": 1.0')),
     "metrics.jsonl's line 2 is step 1.0, not 1"),
    (lambda f: (f / "metrics.jsonl").write_text("\n".join(2 * (f / "metrics.jsonl").read_text().splitlines()[1:])),
     "metrics.jsonl's line 1 is step 1, not 0: its rollouts are not steps 0 to 1 in order"),
    (lambda f: (f / "metrics.jsonl").write_text((f / "metrics.jsonl").read_text().replace('"reward": ', '"reward": '
                                                                                         'NaN, "x": ', 1)),
     "gives the summary's final_reward = nan, not a finite number"),
    (lambda f: (f / "metrics.jsonl").unlink() or (f / "metrics.jsonl").mkdir(), "metrics.jsonl is unreadable"),
    (lambda f: (f / "metrics.jsonl").write_text("[" * 100_000 + "]" * 100_000), "metrics.jsonl is unreadable"),
    (lambda f: (f / "run.json").write_text("[" * 100_000 + "]" * 100_000), "run.json is unreadable or malformed"),
    (lambda f: (f / FINGERPRINT_FILE).write_text("[" * 100_000 + "]" * 100_000),
     "fingerprint.json is unreadable or malformed"),
])
def test_report_only_names_a_malformed_file_of_a_run_without_recorded_hashes(trained, tmp_path, capsys, damage,
                                                                              needle):
    out = tmp_path / "out"
    shutil.copytree(trained, out)
    folder = out / "grpo@e4m3" / "seed0"
    fingerprint = json.loads((folder / FINGERPRINT_FILE).read_text())
    del fingerprint["files"]  # as the lab wrote it before it recorded the files' sha256
    fingerprint["sha256"] = digest(fingerprint["inputs"])
    (folder / FINGERPRINT_FILE).write_text(json.dumps(fingerprint))
    assert len(check_runs(run_folders(out), trust_unhashed=True)) == 2  # accepted without the hashes, on request
    damage(folder)
    code, _, err = _cli(capsys, "lab", "--report-only", "--out", str(out), "--trust-unhashed")
    assert code == 2 and f"{folder}: a damaged run (" in err and needle in err and "Traceback" not in err


def test_report_only_refuses_runs_trained_with_different_settings(tmp_path, capsys):
    out = tmp_path / "out"
    lab(out, runs=RUNS[:1])
    lab(tmp_path / "other", runs=RUNS[1:], settings={"lr": 2e-3})
    (tmp_path / "other" / "grpo@e4m3").rename(out / "grpo@e4m3")
    with pytest.raises(ValueError, match=r"different settings .*grpo@e4m3/seed0 vs .*grpo@none/seed0: "
                                         r"settings.lr: 0.002 -> 0.001"):
        rewrite_report(out)
    code, _, err = _cli(capsys, "lab", "--report-only", "--out", str(out))
    assert code == 2 and "different settings" in err
    (out / "grpo@e4m3").rename(tmp_path / "moved")
    assert [s["label"] for s in rewrite_report(out).summaries] == ["grpo@none"]


def test_cli_prints_a_summary_table_per_run_with_means_over_seeds(tmp_path, capsys):
    code, out, _ = _cli(capsys, *lab_command(tmp_path / "out", tmp_path / "cache", "--methods", "grpo@none,grpo",
                                             "--steps", "2", "--seeds", "0,1", "--jobs", "1"))
    assert code == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())["runs"]
    table = summary_table(RunTable.from_summaries(summary))
    assert table in out
    lines = table.splitlines()
    assert lines[0].split() == ["run", "seeds", "late", "acc", "late", "reward", "discrepancy", "collapsed"]
    for line, label in zip(lines[1:], ["grpo@none", "grpo@e4m3"]):
        rows = [r for r in summary if r["label"] == label]
        cells = line.split()
        assert cells[0] == label and cells[1:3] == ["2", "(0-1)"]  # how many seeds, and which
        assert cells[-1] == f"{sum(r['collapse_step'] is not None for r in rows)}/2"
        assert float(cells[3]) == pytest.approx(sum(r["late_acc_engine"] for r in rows) / 2, abs=5e-4)
        assert float(cells[4]) == pytest.approx(sum(r["late_reward"] for r in rows) / 2, abs=5e-4)


def test_the_seeds_column_names_a_count_and_the_seeds_never_a_bare_seed():
    """One seed 0 printed as ``0`` read as "zero seeds": the column gives the count and the seeds."""
    summary = [{"label": "grpo@e4m3", "seed": seed, "late_acc_engine": 0.5, "late_reward": 0.5,
                "discrepancy_mean": 0.01, "collapse_step": None} for seed in (0,)]
    assert summary_table(RunTable.from_summaries(summary)).splitlines()[1].split()[1:3] == ["1", "(0)"]


class _Stream:
    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> None:
        self.text += text

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def _tasks(steps: int = 4) -> list[RunTask]:
    return [RunTask(spec, LabSettings(**{**TINY, "steps": steps}), b"") for spec in RUNS]


def test_progress_without_a_terminal_prints_starts_warnings_interval_lines_with_eta_and_finished_runs():
    stream = _Stream()
    progress = SweepProgress(_tasks(), skipped=1, interval=0.0, stream=stream)
    key = ("grpo@none", 0)
    progress.event(("start", key))
    progress.event(("warn", key, "UserWarning: something"))
    progress.event(("step", key, 1))
    time.sleep(0.05)
    progress.event(("step", key, 1))
    lines = stream.text.splitlines()
    assert lines[0] == "start grpo@none seed 0 (4 rollouts); runs 1/3 done, 1 running"
    assert lines[1] == "warning [grpo@none seed 0]: UserWarning: something"
    assert lines[2].startswith("progress: runs 1/3 done; running grpo@none seed 0 1/4 (ETA ")
    assert "sweep ETA" in lines[3] and "?" not in lines[3]
    progress.event(("step", key, 2))
    progress.finish(key, {"late_acc_engine": 0.5, "late_reward": 0.25})
    assert stream.text.splitlines()[-1].startswith("done grpo@none seed 0 in 0s: late accuracy 0.500, late reward "
                                                   "0.250; runs 2/3 done")
    progress.close()


def test_progress_in_a_terminal_draws_bars_below_warnings_and_leaves_none_behind():
    stream = _Stream()
    progress = SweepProgress(_tasks(), terminal=True, stream=stream)
    a, b = ("grpo@none", 0), ("grpo@e4m3", 0)
    progress.event(("start", a))
    progress.event(("start", b))
    assert {bar.pos for bar in progress.bars.values()} in ({1, 2}, {-1, -2})
    progress.event(("warn", b, "RuntimeWarning: x"))
    assert "warning [grpo@e4m3 seed 0]: RuntimeWarning: x\n" in stream.text
    progress.event(("step", a, 4))
    progress.finish(a, {"late_acc_engine": 1.0, "late_reward": 1.0})
    assert list(progress.bars) == [b]
    progress.close()
    assert progress.bars == {} and progress.overall is None
    tail = stream.text.rsplit("done grpo@none seed 0", 1)[1]
    assert "\r" in tail  # the bars were cleared after the last line


def test_a_run_reports_start_steps_and_its_warnings_as_events_and_returns_its_files():
    import io

    import torch

    from mismatch_ctrl.lab.sweeps.executors import train_task
    from mismatch_ctrl.lab.model.policy import PolicyConfig, TinyPolicy
    from mismatch_ctrl.lab.model.tasks import make_task

    policy = TinyPolicy(PolicyConfig.for_task(make_task("add"), d_model=32, n_layers=1, n_heads=2, d_ff=16,
                                              n_experts=4, top_k=2), seed=1)
    buffer = io.BytesIO()
    torch.save({"policy_config": policy.config.to_dict(), "state_dict": policy.state_dict()}, buffer)

    class Sink(list):
        put = list.append

    events = Sink()
    # eps = 1e-4 is below the e5m2 engine's discrepancy floor: DC-GRPO warns after its calibration window
    task = RunTask(RunSpec("dcgrpo_tight_guard", "e5m2"), LabSettings(**{**TINY, "steps": 5}), buffer.getvalue())
    summary, files = train_task(task, events)
    key = ("dcgrpo_tight_guard@e5m2", 0)
    assert events[0] == ("start", key, os.getpid())
    assert [e for e in events if e[0] == "step"] == [("step", key, 1)] * 5
    warned = [e[2] for e in events if e[0] == "warn"]
    assert all(e[1] == key for e in events)
    assert len(warned) == 2 and "below the rollout engine's discrepancy floor" in warned[1]
    assert "acts as a constant penalty" in warned[1] and "eps: auto, or an eps above the floor" in warned[1]  # why
    assert "drift_window = 10 but --num-rollout is 5" in warned[0]  # the hook's init: a 5-rollout run
    assert {"run.json", "metrics.jsonl"} <= set(files) and any(name.startswith("state/") for name in files)
    assert len(files["metrics.jsonl"].decode().splitlines()) == 5 and summary["label"] == key[0]


def tiny_tasks(seeds: tuple[int, ...], policy_bytes: bytes = b"not a torch.save payload") -> list[RunTask]:
    return [RunTask(RunSpec("grpo", "e4m3"), LabSettings(**{**TINY, "seed": seed}), policy_bytes) for seed in seeds]


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_run_that_raises_is_named_with_its_error_not_a_traceback(jobs):
    finished = []
    with pytest.raises(RunFailed, match=r"run grpo@e4m3 seed 0 failed: \w+Error: .*runs finished before it are kept$"):
        LocalExecutor(jobs).run(tiny_tasks((0, 1)), lambda event: None, lambda task, out: finished.append(task))
    assert finished == []
    memory = RunFailed.of(tiny_tasks((3,))[0], RuntimeError("DefaultCPUAllocator: can't allocate memory: 5 GB"))
    assert str(memory).startswith("run grpo@e4m3 seed 3 failed: RuntimeError: DefaultCPUAllocator") and \
        str(memory).endswith("(too large for this machine's memory: lower --prompts / --samples)")


def test_a_worker_killed_by_the_system_stops_the_sweep_with_the_run_named_instead_of_hanging():
    from sweep_helpers import killed_by_the_system

    finished, started = [], time.monotonic()
    with pytest.raises(RunFailed, match=r"run grpo@e4m3 seed 1: its worker process \(pid \d+\) died without a "
                                        r"result, killed by the system \(out of memory\?\)"):
        LocalExecutor(2, target=killed_by_the_system).run(tiny_tasks((0, 1)), lambda event: None,
                                                         lambda task, out: finished.append(task.key))
    assert set(finished) <= {("grpo@e4m3", 0)} and time.monotonic() - started < 60  # seed 0 may not be back yet
