"""--prepare: the steps it lists, idempotence by the completion marker, recovery after an interruption."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from launch_harness import Sandbox, contains_run, model_args

MARKER = ".mismatch_ctrl_complete"


def steps(stdout: str) -> tuple[list[str], list[list[str]]]:
    """(the '# [step] ...' lines, the commands as argv lists) of a --prepare output."""
    comments, commands = [], []
    for line in stdout.replace("\\\n", " ").splitlines():
        if line.startswith("# "):
            comments.append(line)
        elif line.strip():
            commands.append(shlex.split(line))
    return comments, commands


def unprepared(sandbox: Sandbox) -> dict[str, str]:
    """A cluster with the BF16 model and slime's tools but no data, FP8 or torch_dist checkpoint."""
    return sandbox.make_cluster(prepared=False)


def test_prepare_dry_run_lists_the_three_steps_and_changes_nothing(sandbox: Sandbox) -> None:
    env = unprepared(sandbox)
    before = sorted(path for path in sandbox.cluster.rglob("*"))
    result = sandbox.run("qwen3_30b_dcgrpo.sh", "--prepare", "--dry-run", env=env)
    assert result.returncode == 0, result.stderr
    comments, commands = steps(result.stdout)
    assert [comment.split()[1] for comment in comments] == ["[data]", "[torch_dist]", "[fp8]"]

    data, convert_dist, mark_dist, move_dist, convert_fp8, mark_fp8, move_fp8 = commands
    assert data[-4:] == ["-m", "recipes.qwen3_30b_a3b.data", "--out", env["DATA_DIR"]]
    torchrun = convert_dist[convert_dist.index("torchrun"):]
    assert torchrun[1:4] == ["--nproc-per-node", "8", f"{env['SLIME_DIR']}/tools/convert_hf_to_torch_dist.py"]
    assert contains_run(torchrun, model_args("qwen3_30b_a3b"))
    assert contains_run(torchrun, ["--hf-checkpoint", env["MODEL_DIR"]])  # from the BF16 model
    assert contains_run(torchrun, ["--save", env["TORCH_DIST_DIR"] + ".partial"])
    assert mark_dist == ["touch", f"{env['TORCH_DIST_DIR']}.partial/{MARKER}"]
    assert move_dist == ["mv", "--", env["TORCH_DIST_DIR"] + ".partial", env["TORCH_DIST_DIR"]]
    assert f"{env['SLIME_DIR']}/tools/convert_hf_to_fp8.py" in convert_fp8
    for run in (["--model-dir", env["MODEL_DIR"]], ["--save-dir", env["FP8_HF_DIR"] + ".partial"],
                ["--strategy", "block"], ["--block-size", "128", "128"]):
        assert contains_run(convert_fp8, run), run
    assert mark_fp8 == ["touch", f"{env['FP8_HF_DIR']}.partial/{MARKER}"]
    assert move_fp8 == ["mv", "--", env["FP8_HF_DIR"] + ".partial", env["FP8_HF_DIR"]]

    assert sorted(path for path in sandbox.cluster.rglob("*")) == before
    assert not sandbox.calls("torchrun") and not sandbox.calls("convert_hf_to_fp8")


def test_prepare_runs_the_conversions_once(sandbox: Sandbox) -> None:
    env = unprepared(sandbox)
    sandbox.write_data(Path(env["DATA_DIR"]))  # the data step would need the hub: here it is already done
    sandbox.add_nvidia_smi(gpus=8)
    sandbox.add_torchrun()
    first = sandbox.run("qwen3_30b_dcgrpo.sh", "--prepare", env=env)
    assert first.returncode == 0, first.stderr
    torch_dist, fp8 = Path(env["TORCH_DIST_DIR"]), Path(env["FP8_HF_DIR"])
    assert (torch_dist / MARKER).is_file() and (torch_dist / "latest_checkpointed_iteration.txt").is_file()
    assert (fp8 / MARKER).is_file()
    quantization = json.loads((fp8 / "config.json").read_text())["quantization_config"]
    assert quantization["weight_block_size"] == [128, 128]
    assert not Path(f"{torch_dist}.partial").exists() and not Path(f"{fp8}.partial").exists()
    assert len(sandbox.calls("torchrun")) == len(sandbox.calls("convert_hf_to_fp8")) == 1
    assert "[data] skip" in first.stdout

    second = sandbox.run("qwen3_30b_dcgrpo.sh", "--prepare", env=env)
    assert second.returncode == 0, second.stderr
    assert "[torch_dist] skip" in second.stdout and "[fp8] skip" in second.stdout
    assert len(sandbox.calls("torchrun")) == len(sandbox.calls("convert_hf_to_fp8")) == 1

    launch_check = sandbox.run("qwen3_30b_dcgrpo.sh", "--dry-run", env=env)
    assert launch_check.returncode == 0 and "warning" not in launch_check.stderr, launch_check.stderr


def test_an_interrupted_conversion_is_redone(sandbox: Sandbox) -> None:
    env = unprepared(sandbox)
    sandbox.write_data(Path(env["DATA_DIR"]))
    sandbox.add_nvidia_smi(gpus=8)
    sandbox.add_torchrun(fail=True)
    failed = sandbox.run("qwen3_30b_dcgrpo.sh", "--prepare", env=env)
    assert failed.returncode == 1
    assert "[torch_dist] conversion failed" in failed.stderr
    assert not Path(env["TORCH_DIST_DIR"]).exists()

    leftover = Path(env["TORCH_DIST_DIR"] + ".partial")
    leftover.mkdir()
    (leftover / "half_written.distcp").write_text("x")
    sandbox.add_torchrun()
    again = sandbox.run("qwen3_30b_dcgrpo.sh", "--prepare", env=env)
    assert again.returncode == 0, again.stderr
    assert f"rm -rf -- {leftover}" in again.stdout
    assert not leftover.exists()
    assert sorted(p.name for p in Path(env["TORCH_DIST_DIR"]).iterdir()) == sorted(
        [MARKER, "iter_0000000", "latest_checkpointed_iteration.txt"])


def test_an_fp8_conversion_without_block_quantization_is_not_marked_complete(sandbox: Sandbox) -> None:
    env = unprepared(sandbox)
    sandbox.write_data(Path(env["DATA_DIR"]))
    sandbox.add_nvidia_smi(gpus=8)
    sandbox.add_torchrun()
    result = sandbox.run("qwen3_30b_dcgrpo.sh", "--prepare", env={**env, "FAKE_FP8_NO_QUANT": "1"})
    assert result.returncode == 1
    assert "[fp8] conversion finished but its output is not usable" in result.stderr
    assert not Path(env["FP8_HF_DIR"]).exists()
    assert not (Path(env["FP8_HF_DIR"] + ".partial") / MARKER).exists()


def test_a_directory_not_written_by_prepare_is_never_deleted(sandbox: Sandbox) -> None:
    env = unprepared(sandbox)
    sandbox.add_nvidia_smi(gpus=8)
    sandbox.add_torchrun()
    foreign = Path(env["TORCH_DIST_DIR"])
    foreign.mkdir()
    (foreign / "precious").write_text("user data")
    dry = sandbox.run("qwen3_30b_dcgrpo.sh", "--prepare", "--dry-run", env=env)
    assert dry.returncode == 0
    assert f"TORCH_DIST_DIR={foreign} exists without {MARKER}" in dry.stderr
    real = sandbox.run("qwen3_30b_dcgrpo.sh", "--prepare", env=env)
    assert real.returncode == 1
    assert "nothing was prepared" in real.stderr
    assert (foreign / "precious").read_text() == "user data"
    assert not sandbox.calls("torchrun") and not sandbox.calls("convert_hf_to_fp8")


def test_prepare_refuses_an_fp8_model_dir(sandbox: Sandbox) -> None:
    env = unprepared(sandbox)
    config = Path(env["MODEL_DIR"]) / "config.json"
    bf16 = json.loads(config.read_text())
    config.write_text(json.dumps({**bf16, "quantization_config": {"quant_method": "fp8"}}))
    result = sandbox.run("qwen3_30b_dcgrpo.sh", "--prepare", "--dry-run", env=env)
    assert "MODEL_DIR" in result.stderr and "it must be the BF16 model" in result.stderr


def test_prepare_without_the_bf16_model_shows_the_hf_download(sandbox: Sandbox) -> None:
    env = {**unprepared(sandbox), "MODEL_DIR": str(sandbox.root / "nowhere")}
    result = sandbox.run("qwen3_30b_dcgrpo.sh", "--prepare", "--dry-run", env=env)
    assert result.returncode == 0, result.stderr
    assert f"hf download Qwen/Qwen3-30B-A3B --local-dir {sandbox.root / 'nowhere'}" in result.stderr
