"""The lab's Ray executor against a real local Ray instance (2 CPUs, in this process): the same runs as the local
executor, a resumed sweep trains only the missing runs, and an unreachable address is refused before the warm-up."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from sweep_helpers import TINY_WARMUP, lab_command, start_lab

from mismatch_ctrl import cli
from mismatch_ctrl.lab.sweeps import run as lab_run
from mismatch_ctrl.lab.sweeps.executors import LocalExecutor, RayExecutor
from mismatch_ctrl.lab.training.methods import RunSpec
from mismatch_ctrl.lab.sweeps.run import run_lab
from mismatch_ctrl.lab.sweeps.sweep import FINGERPRINT_FILE
from mismatch_ctrl.lab.training.settings import LabSettings

ray = pytest.importorskip("ray")

SETTINGS = LabSettings(steps=2, prompts_per_step=4, samples_per_prompt=4, eval_every=1, eval_prompts=8)
RUNS = [RunSpec("grpo", "none"), RunSpec("dcgrpo", "e4m3")]


@pytest.fixture
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def metrics(folder: Path) -> list[dict]:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


def sweep(out: Path, executor, seeds: tuple[int, ...]) -> lab_run.LabResult:
    return run_lab(RUNS, SETTINGS, out, cache_dir=out.parent / "cache", show_progress=False, warmup=TINY_WARMUP,
                   seeds=seeds, executor=executor)


def test_ray_tasks_train_the_same_runs_as_local_processes_and_a_resumed_sweep_trains_only_the_rest(tmp_path,
                                                                                                   local_ray):
    on_ray = sweep(tmp_path / "ray", RayExecutor("auto"), seeds=(0,))
    local = sweep(tmp_path / "local", LocalExecutor(1), seeds=(0,))
    for spec in RUNS:
        folder = Path(spec.label) / "seed0"
        assert metrics(tmp_path / "ray" / folder) == metrics(tmp_path / "local" / folder)
        recorded = [json.loads((tmp_path / where / folder / FINGERPRINT_FILE).read_text())
                    for where in ("ray", "local")]
        assert [(r["inputs"], sorted(r["files"])) for r in recorded[:1]] == \
            [(r["inputs"], sorted(r["files"])) for r in recorded[1:]]  # the files' hashes (and sha256): times differ
    assert [s["late_acc_engine"] for s in on_ray.summaries] == [s["late_acc_engine"] for s in local.summaries]
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "ray").glob("*/seed0/metrics.jsonl")}
    trained = []
    executor = RayExecutor("auto")
    run = executor.run
    executor.run = lambda tasks, *a: (trained.extend(t.key for t in tasks), run(tasks, *a))[1]
    resumed = sweep(tmp_path / "ray", executor, seeds=(0, 1))
    assert sorted(trained) == [("dcgrpo@e4m3", 1), ("grpo@none", 1)]
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    assert [(s["label"], s["seed"]) for s in resumed.summaries] == [("grpo@none", 0), ("grpo@none", 1),
                                                                    ("dcgrpo@e4m3", 0), ("dcgrpo@e4m3", 1)]


@pytest.fixture
def closed_port():
    """A local port bound by this test and never listened on, so nothing else can take it while the test runs and a
    connection to it is refused (a port found free and then released may be taken by a parallel test)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@pytest.mark.parametrize("address, message", [
    (None, "cannot reach a Ray cluster there"),
    ("no-port", "expected HOST:PORT"),
    ("127.0.0.1:port", "expected HOST:PORT"),
])
def test_unreachable_or_malformed_ray_address_is_refused_before_the_warm_up(tmp_path, monkeypatch, capsys, address,
                                                                            message, closed_port):
    def no_warmup(*_, **__):
        raise AssertionError("the warm-up must not start")

    monkeypatch.setattr(lab_run, "warmup_policy", no_warmup)
    monkeypatch.setattr(lab_run, "warmup_preset", lambda task, policy: TINY_WARMUP)
    address = address or f"127.0.0.1:{closed_port}"
    code = cli.main(lab_command(tmp_path / "out", tmp_path / "cache", "--methods", "grpo", "--steps", "2",
                                "--ray-address", address))
    err = capsys.readouterr().err
    assert code == 2 and f"--ray-address {address}" in err and message in err
    assert not ray.is_initialized()


def test_cli_sends_the_runs_to_a_ray_cluster_by_address_and_a_rerun_continues(tmp_path, local_ray):
    address = ray.get_runtime_context().gcs_address
    assert address.rpartition(":")[2].isdigit()
    out, cache = tmp_path / "out", tmp_path / "cache"
    args = ("--methods", "grpo@none,grpo", "--steps", "2", "--ray-address", address)
    stdout, stderr = start_lab(out, cache, *args, "--seeds", "0").communicate(timeout=300)
    assert "late acc" in stdout and stderr.count("done ") == 2, stderr
    stdout, stderr = start_lab(out, cache, *args, "--seeds", "0,1").communicate(timeout=300)
    assert f"2 of 4 runs already finished in {out}: kept, not trained again" in stdout, stderr
    assert stderr.count("start ") == 2 and "Traceback" not in stderr
    assert len(list(out.glob(f"*/seed*/{FINGERPRINT_FILE}"))) == 4
