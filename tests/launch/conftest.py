"""Fixtures of the launcher tests (see launch_harness.py).

A few runs are slow because they import torch: the real ``check-config`` and the preflight's import check
(``mismatch_ctrl.slime.hooks``). They, and the other real launches, are the scenarios below; ``slow_runs`` starts
them all in a small background pool when the first launcher test runs, so they overlap with the fast tests, and each
test waits for its own.
"""

from __future__ import annotations

import inspect
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterator

import pytest

from launch_harness import Result, Sandbox

BROKEN_METHOD_YAML = "mismatch_ctrl:\n  name: dcgrpo\n  bogus_setting: 3\n"
MISPLACED_METHOD_YAML = "mismatch_ctrl: {name: dcgrpo, correction: {preset: geo_mis}}\ndcgrpo: {enabled: true}\n"
INERT_METHOD_YAML = "mismatch_ctrl:\n  name: acrl_short\n  acrl:\n    enabled: true\n    calibration_rollouts: 10\n"


Run = tuple[Sandbox, Result, dict[str, str]]  # the sandbox, the launcher's result, the environment it got


def real_check_30b(box: Sandbox) -> Run:
    """30B DC-GRPO dry run on a prepared cluster, with the real check-config."""
    env = box.make_cluster()
    return box, box.run("qwen3_30b_dcgrpo.sh", "--dry-run", env=env, real_check=True), env


def broken_method_yaml(box: Sandbox) -> Run:
    """A method YAML with an unknown key, checked by the real check-config."""
    config = box.root / "broken.yaml"
    config.write_text(BROKEN_METHOD_YAML)
    env = {"METHOD_CONFIG": str(config)}
    return box, box.run("qwen3_30b_dcgrpo.sh", "--dry-run", env=env, real_check=True), env


def inert_method_for_the_run(box: Sandbox) -> Run:
    """A method whose ACRL would calibrate for the whole run (NUM_ROLLOUT=5), checked by the real check-config."""
    config = box.root / "acrl_short.yaml"
    config.write_text(INERT_METHOD_YAML)
    env = {"METHOD_CONFIG": str(config), "NUM_ROLLOUT": "5"}
    return box, box.run("qwen3_30b_dcgrpo.sh", "--dry-run", env=env, real_check=True), env


def misplaced_method_block(box: Sandbox) -> Run:
    """A method YAML whose dcgrpo block stands beside mismatch_ctrl: instead of under it (slime would train GRPO)."""
    config = box.root / "misplaced.yaml"
    config.write_text(MISPLACED_METHOD_YAML)
    env = {"METHOD_CONFIG": str(config)}
    return box, box.run("qwen3_30b_dcgrpo.sh", "--dry-run", env=env, real_check=True), env


def launch_on_a_bare_machine(box: Sandbox) -> Run:
    """Launch with no nvidia-smi and no ray on PATH, an FP8 dir without quantization_config and no data."""
    env = box.make_cluster(fp8_quantized=False)
    for path in Path(env["DATA_DIR"]).rglob("*.jsonl"):
        path.unlink()
    return box, box.run("qwen3_30b_dcgrpo.sh", env=env), env


def launch_without_slime(box: Sandbox) -> Run:
    """GPUs, Ray and paths in place, but SLIME_DIR holds no importable slime package."""
    box.add_nvidia_smi(gpus=8)
    box.add_ray(reachable=True, cluster_gpus=8)
    env = box.make_cluster(slime_package=False)
    return box, box.run("qwen3_30b_dcgrpo.sh", env=env), env


def launch_on_a_small_node_without_ray(box: Sandbox) -> Run:
    """Launch on a node with 4 GPUs while the layout needs 8, Ray installed but not running."""
    box.add_nvidia_smi(gpus=4)
    box.add_ray(reachable=False)
    env = box.make_cluster()
    return box, box.run("qwen3_30b_dcgrpo.sh", env=env), env


def launch_two_nodes_on_a_one_node_ray(box: Sandbox) -> Run:
    """NUM_NODES=2 while the Ray cluster only has the 8 GPUs of one node."""
    box.add_nvidia_smi(gpus=8)
    box.add_ray(reachable=True, cluster_gpus=8)
    env = {**box.make_cluster(), "NUM_NODES": "2"}
    return box, box.run("qwen3_30b_dcgrpo.sh", env=env), env


def launch_on_a_ready_cluster(box: Sandbox) -> Run:
    """Everything in place: the job is submitted."""
    box.add_nvidia_smi(gpus=8)
    box.add_ray(reachable=True, cluster_gpus=8)
    env = box.make_cluster()
    return box, box.run("qwen3_30b_dcgrpo.sh", env=env), env


SCENARIOS: dict[str, Callable[[Sandbox], Run]] = {
    function.__name__: function for function in (
        real_check_30b, broken_method_yaml, inert_method_for_the_run, misplaced_method_block, launch_without_slime,
        launch_on_a_ready_cluster,
        launch_on_a_bare_machine, launch_on_a_small_node_without_ray, launch_two_nodes_on_a_one_node_ray)
}


class SlowRuns:
    def __init__(self, futures: dict[str, Future]):
        self._futures = futures

    def get(self, name: str) -> Run:
        return self._futures[name].result(timeout=300)


@pytest.fixture(scope="session", autouse=True)
def slow_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlowRuns]:
    wanted = any("slow_runs" in inspect.signature(item.function).parameters
                 for item in request.session.items if isinstance(item, pytest.Function))
    # The sandboxes are made here, in the main thread: pytest's temp-dir factory is not thread-safe.
    sandboxes = {name: Sandbox(tmp_path_factory.mktemp(name)) for name in SCENARIOS} if wanted else {}
    pool = ThreadPoolExecutor(max_workers=3)
    try:
        yield SlowRuns({name: pool.submit(SCENARIOS[name], box) for name, box in sandboxes.items()})
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # a partial run (-k, one file) skips the unstarted ones


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    return Sandbox(tmp_path)
