"""A real launch: preflight errors stop it before ray job submit; a ready cluster gets exactly the dry-run command."""

from __future__ import annotations

from pathlib import Path

from launch_harness import needs_the_recipe_imports


def errors_of(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ": error: " in line]


def test_bare_machine_reports_every_problem_and_submits_nothing(slow_runs) -> None:
    _, result, env = slow_runs.get("launch_on_a_bare_machine")
    assert result.returncode == 1, result.stderr
    errors = errors_of(result.stderr)
    expected = {
        "no GPU tool": "nvidia-smi not found",
        "no ray": "ray not found on PATH",
        "FP8 checkpoint not quantized": f"FP8_HF_DIR: {env['FP8_HF_DIR']}/config.json has no quantization_config",
        "no training data": f"PROMPT_DATA={env['DATA_DIR']}/dapo-math-17k.jsonl does not exist",
        "no eval data": "eval sets of EVAL_CONFIG",
    }
    for problem, fragment in expected.items():
        assert any(fragment in line for line in errors), (problem, result.stderr)
    assert "import checks (slime, megatron, hooks, reward) run once the problems below are fixed" in result.stderr
    assert "nothing was submitted" in result.stderr
    assert result.stdout == ""
    assert not Path(env["SAVE_DIR"]).exists()


def test_slime_not_importable(slow_runs) -> None:
    needs_the_recipe_imports()
    box, result, env = slow_runs.get("launch_without_slime")
    assert result.returncode == 1, result.stderr
    errors = errors_of(result.stderr)
    assert any(line.endswith("cannot import slime: ModuleNotFoundError: No module named 'slime'") for line in errors)
    assert any("SLIME_DIR" in line and "slimerl/slime image" in line for line in errors), result.stderr
    # The hooks, the reward and megatron.training (the stub) import fine: only slime is reported.
    assert not any("cannot import" in line and "slime:" not in line for line in errors), result.stderr
    assert ["job", "submit"] not in [call[:2] for call in box.calls("ray")]


def test_too_few_gpus_and_no_ray_server(slow_runs) -> None:
    box, result, _ = slow_runs.get("launch_on_a_small_node_without_ray")
    assert result.returncode == 1, result.stderr
    errors = errors_of(result.stderr)
    assert any("this node has 4 GPUs (nvidia-smi) but GPUS_PER_NODE=8" in line for line in errors), result.stderr
    assert any("Ray is not reachable at RAY_ADDRESS=http://127.0.0.1:8265" in line and "ray start --head" in line
               for line in errors), result.stderr
    assert [call[:2] for call in box.calls("ray")] == [["--version"], ["job", "list"]]  # probed, never submitted


def test_ray_cluster_smaller_than_the_layout(slow_runs) -> None:
    box, result, _ = slow_runs.get("launch_two_nodes_on_a_one_node_ray")
    assert result.returncode == 1, result.stderr
    assert any("the Ray cluster has 8 GPUs but the layout needs NUM_NODES x GPUS_PER_NODE = 16" in line
               for line in errors_of(result.stderr)), result.stderr
    assert ["job", "submit"] not in [call[:2] for call in box.calls("ray")]


def test_ready_cluster_submits_the_dry_run_command(slow_runs) -> None:
    needs_the_recipe_imports()
    box, result, env = slow_runs.get("launch_on_a_ready_cluster")
    assert result.returncode == 0, result.stderr
    assert not errors_of(result.stderr)
    submits = [call for call in box.calls("ray") if call[:2] == ["job", "submit"]]
    assert len(submits) == 1
    assert Path(env["SAVE_DIR"]).is_dir()

    dry_run = box.run("qwen3_30b_dcgrpo.sh", "--dry-run", env=env)
    assert dry_run.returncode == 0, dry_run.stderr
    # The same command, but for NCCL_NVLS_ENABLE=auto, which only a launch decides (a dry run runs no nvidia-smi).
    printed = [word.replace('"NCCL_NVLS_ENABLE":"auto"', '"NCCL_NVLS_ENABLE":"1"') for word in dry_run.command()]
    assert printed != dry_run.command() and ["ray", *submits[0]] == printed
