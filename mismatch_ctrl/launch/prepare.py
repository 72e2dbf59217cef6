"""``--prepare``: the recipe data, BF16 HF -> Megatron torch_dist, BF16 HF -> FP8 (block 128x128 e4m3; not with
``TRAIN_PRECISION=fp16``, whose engines serve the BF16 checkpoint).

A conversion writes ``DIR.partial``, is verified, marked complete (``.mismatch_ctrl_complete``) and renamed to
``DIR``: an interrupted one is redone, and a ``DIR`` without the marker was not written here and is never deleted.
Commands are printed (stdout) before they run; with ``--dry-run`` they are only printed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable, Sequence

from .. import regular_files
from ..slime.names import TRACKER, is_megatron_checkpoint
from .command import format_command, job_pythonpath
from .model_shape import MegatronModel, inspect_checkpoint
from .preflight import EVAL_CONFIG_ERRORS, eval_config_error, import_problems, job_data_files, local_gpu_problems
from .settings import DATA_MODULE, Settings

COMPLETE_MARKER = ".mismatch_ctrl_complete"
"""Written into a conversion's output when it is verified; a directory without it was not written by --prepare."""


class PrepareFailed(Exception):
    """A step failed; the message says which and what is left on disk."""


def conversion_state(directory: str) -> str:
    """``complete`` (has the marker), ``missing``, or ``foreign`` (exists without the marker)."""
    path = Path(directory)
    if (path / COMPLETE_MARKER).is_file():
        return "complete"
    return "foreign" if path.exists() else "missing"


class Preparation:
    """The plan and the steps of ``--prepare`` for one launcher's settings."""

    def __init__(self, s: Settings, model: MegatronModel, launcher: str, dry_run: bool,
                 note: Callable[[str], None]):
        self.s, self.model, self.launcher, self.dry_run, self.note = s, model, launcher, dry_run, note
        try:  # the files the launch's preflight asks for: what --prepare must leave behind
            files, self.data_error = job_data_files(s), ""
        except EVAL_CONFIG_ERRORS as exc:
            files, self.data_error = [s["PROMPT_DATA"]], eval_config_error(s, exc)
        self.data_files = len(files)
        self.data_missing = [path for path in files if not Path(path).is_file()]
        self.torch_dist = conversion_state(s["TORCH_DIST_DIR"])
        self.fp8 = "not needed" if s.rollout_checkpoint == "MODEL_DIR" else conversion_state(s["FP8_HF_DIR"])

    @property
    def converts(self) -> bool:
        return "missing" in (self.torch_dist, self.fp8)

    def problems(self) -> list[str]:
        """What stops the preparation (for ``--dry-run``: what would)."""
        s, out = self.s, [self.data_error] if self.data_error else []
        for name, state in (("TORCH_DIST_DIR", self.torch_dist), ("FP8_HF_DIR", self.fp8)):
            if state == "foreign":
                out.append(f"{name}={s[name]} exists without {COMPLETE_MARKER}, so --prepare did not write it and "
                           f"leaves it alone: if it is a finished checkpoint run 'touch {s[name]}/{COMPLETE_MARKER}', "
                           "otherwise remove it")
            elif state == "missing":
                out += _stale_partial_problems(name, f"{s[name]}.partial")
        if self.converts:
            if Path(s["MODEL_DIR"]).is_dir():
                out += inspect_checkpoint(s["MODEL_DIR"], "bf16", "MODEL_DIR", self.model).all_problems
            else:
                out.append(f"MODEL_DIR={s['MODEL_DIR']} does not exist; download the BF16 model there (e.g. hf "
                           f"download Qwen/{s.profile.hf_name} --local-dir {s['MODEL_DIR']})")
        tools = Path(s["SLIME_DIR"], "tools")
        if self.torch_dist == "missing":
            if not (tools / "convert_hf_to_torch_dist.py").is_file():
                out.append(f"SLIME_DIR={s['SLIME_DIR']} has no tools/convert_hf_to_torch_dist.py")
            if not self.dry_run and shutil.which("torchrun") is None:
                out.append("torchrun not found on PATH (it comes with torch in the slimerl/slime image)")
        if self.fp8 == "missing" and not (tools / "convert_hf_to_fp8.py").is_file():
            out.append(f"SLIME_DIR={s['SLIME_DIR']} has no tools/convert_hf_to_fp8.py")
        if self.converts and not self.dry_run:
            out += local_gpu_problems(s) + import_problems(s, ("slime", "megatron.training"))
        return out

    def _show_and_run(self, words: Sequence[str]) -> bool:
        print(format_command(words), flush=True)
        return self.dry_run or subprocess.run(list(words)).returncode == 0

    def _step(self, name: str, words: Sequence[str]) -> None:
        """Run a file step of a conversion; :class:`PrepareFailed` if it fails."""
        if not self._show_and_run(words):
            raise PrepareFailed(f"[{name}] '{format_command(words)}' failed; fix it and rerun --prepare")

    def _convert(self, name: str, directory: str, verify: Callable[[str], str], words: Sequence[str]) -> None:
        partial = f"{directory}.partial"
        if os.path.isdir(partial) and not os.path.islink(partial):  # anything else is named by problems()
            self.note(f"[{name}] removing {partial}, left by an interrupted run")
            self._step(name, ["rm", "-rf", "--", partial])
        if not self._show_and_run(words):
            raise PrepareFailed(f"[{name}] conversion failed; {partial} is incomplete and will be redone by the next "
                                "--prepare")
        if not self.dry_run:
            problem = verify(partial)
            if problem:
                raise PrepareFailed(f"[{name}] conversion finished but its output is not usable: {problem} (left in "
                                    f"{partial})")
        self._step(name, ["touch", f"{partial}/{COMPLETE_MARKER}"])
        self._step(name, ["mv", "--", partial, directory])

    def run(self) -> None:
        """The three steps, each skipped when its output is complete; raises :class:`PrepareFailed`."""
        s, pythonpath = self.s, job_pythonpath(self.s)
        if self.data_missing:
            print(f"# [data] {len(self.data_missing)} of the {self.data_files} data files the job reads are missing: "
                  f"write DATA_DIR={s['DATA_DIR']}", flush=True)
            if not self._show_and_run(["env", f"PYTHONPATH={s['REPO_ROOT']}", s["PYTHON"], "-m", DATA_MODULE,
                                       "--out", s["DATA_DIR"], *s["DATA_ARGS"].split()]):
                raise PrepareFailed(f"[data] python -m {DATA_MODULE} failed (it needs the Hugging Face hub, or "
                                    "DATA_ARGS='--source NAME=PATH ...')")
        else:
            print(f"# [data] skip: every data file the job reads exists (DATA_DIR={s['DATA_DIR']})", flush=True)

        if self.torch_dist == "missing":
            print(f"# [torch_dist] convert MODEL_DIR={s['MODEL_DIR']} to TORCH_DIST_DIR={s['TORCH_DIST_DIR']}",
                  flush=True)
            self._convert("torch_dist", s["TORCH_DIST_DIR"], _verify_torch_dist, [
                "env", f"PYTHONPATH={pythonpath}", "torchrun", "--nproc-per-node", s["GPUS_PER_NODE"],
                f"{s['SLIME_DIR']}/tools/convert_hf_to_torch_dist.py", *self.model.args,
                "--hf-checkpoint", s["MODEL_DIR"], "--save", f"{s['TORCH_DIST_DIR']}.partial"])
        else:
            print(f"# [torch_dist] skip: TORCH_DIST_DIR={s['TORCH_DIST_DIR']} is {self.torch_dist}", flush=True)

        if self.fp8 == "missing":
            print(f"# [fp8] convert MODEL_DIR={s['MODEL_DIR']} to FP8_HF_DIR={s['FP8_HF_DIR']} (block 128x128 e4m3)",
                  flush=True)
            self._convert("fp8", s["FP8_HF_DIR"], self._verify_fp8, [
                "env", f"PYTHONPATH={pythonpath}", s["PYTHON"], f"{s['SLIME_DIR']}/tools/convert_hf_to_fp8.py",
                "--model-dir", s["MODEL_DIR"], "--save-dir", f"{s['FP8_HF_DIR']}.partial", "--strategy", "block",
                "--block-size", "128", "128", "--max-workers", s["FP8_CONVERT_WORKERS"]])
        else:
            why = "TRAIN_PRECISION=fp16 serves MODEL_DIR in float16" if self.fp8 == "not needed" else self.fp8
            print(f"# [fp8] skip: FP8_HF_DIR={s['FP8_HF_DIR']} is {why}", flush=True)

    def _verify_fp8(self, directory: str) -> str:
        return "; ".join(inspect_checkpoint(directory, "fp8", "FP8_HF_DIR", self.model).all_problems)


def _stale_partial_problems(name: str, partial: str) -> list[str]:
    """A ``DIR.partial`` that an interrupted conversion cannot have left (a symbolic link, a file, a FIFO, ...): the
    conversion would remove it (``rm -rf``) or write through it, so it is named with what it is, and left alone."""
    if os.path.islink(partial):
        return [f"{name}: {partial} is a symbolic link (to {os.readlink(partial)}), not the folder an interrupted "
                "--prepare leaves (which the next one removes and converts again): remove the link yourself (rm "
                f"{partial}; its target stays) or point {name} elsewhere, then rerun --prepare"]
    what = regular_files.what_is(partial) or "a file"
    if what in ("missing", "a directory"):
        return []
    return [f"{name}: {partial} is {what}, not the folder an interrupted --prepare leaves (which the next one removes "
            f"and converts again): move it away or delete it, then rerun --prepare"]


def _verify_torch_dist(directory: str) -> str:
    return "" if is_megatron_checkpoint(directory) else f"{directory} has no {TRACKER}"

