"""Checks of the cluster: paths (warnings in ``--dry-run``, errors before a launch), GPUs, Ray, imports, host RAM."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import yaml

from .. import regular_files
from ..formatting import clip
from ..errors import StateError
from .known_flags import KNOWN_FLAGS, offline_findings
from ..slime.names import HOOK_FLAGS, TRACKER, is_megatron_checkpoint, read_tracker, tracker_in
from .command import REWARD_FUNCTION, job_env, job_pythonpath
from .context_length import flag_value_in
from .model_shape import CheckpointReport
from .settings import Settings

IMPORT_TARGETS = ("slime", "megatron.training",
                  *(":".join(path.rsplit(".", 1)) for path in (*HOOK_FLAGS.values(), REWARD_FUNCTION)))
_INTERPOLATION = re.compile(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)(?:,([^}]*))?\}")


EVAL_CONFIG_ERRORS = (OSError, yaml.YAMLError, TypeError, KeyError, AttributeError, ValueError, RecursionError)
"""What reading an unusable EVAL_CONFIG raises in :func:`eval_sets`."""
MAX_EVAL_CONFIG_BYTES = 1 << 20
"""slime's eval config lists a few datasets: a few KB; a larger file is not one."""


def file_problem(name: str, path: str, what_for: str, missing: str) -> str | None:
    """None when the setting ``name`` names a regular file, else a line naming what ``path`` is instead: ``missing``
    (the advice for a path that does not exist) or, for a directory, a FIFO, a device or a broken link, that it must
    be ``what_for``."""
    what = regular_files.what_is(path)
    if what is None:
        return None
    if what == "missing":
        return f"{name}={path} does not exist ({missing})"
    return f"{name}={path} is {what}, not a regular file: give {what_for}"


@dataclass(frozen=True)
class EvalSet:
    """One dataset of ``EVAL_CONFIG`` with the values it runs with. ``max_response_len_from``: where its response
    length comes from (``EVAL_CONFIG``, ``--eval-max-response-len`` or ``MAX_RESPONSE_LEN``)."""

    name: str
    path: str
    samples: int
    max_response_len: int
    max_response_len_from: str


def eval_sets(s: Settings, extra: Sequence[str] = ()) -> list[EvalSet]:
    """The datasets of ``s``'s ``EVAL_CONFIG`` as slime 624b824a reads them (none with ``EVAL_INTERVAL=0``): the
    ``eval`` mapping or the file's root, at least one dataset (``slime/utils/arguments.py:1730-1750``), datasets as a
    list of named entries or a mapping keyed by name (``slime/utils/eval_config.py::ensure_dataset_list``), each value
    the dataset's, else ``defaults``', else the flag's (``DATASET_RUNTIME_SPECS``: ``--eval-max-response-len`` among
    ``extra``, else ``MAX_RESPONSE_LEN``; ``--n-samples-per-eval-prompt``, default 1). slime hands these numbers to
    SGLang unconverted, so a string (``${oc.env:...}`` always gives one) or a null is refused here. Paths get
    ``${oc.env:NAME,default}`` resolved as slime's OmegaConf loader does in the job driver (where ``DATA_DIR`` is
    set). Raises one of :data:`EVAL_CONFIG_ERRORS` for a file that cannot be read or a value of the wrong form."""
    if s.int("EVAL_INTERVAL") == 0:
        return []
    root = yaml.safe_load(regular_files.read_text(s["EVAL_CONFIG"], MAX_EVAL_CONFIG_BYTES)) or {}
    if not isinstance(root, dict):
        raise ValueError("not a mapping at its root, as slime needs")
    config = root.get("eval", root)
    if not isinstance(config, dict):
        raise ValueError(f"its eval: is {config!r}, not a mapping, as slime needs")
    defaults = config.get("defaults") or {}
    datasets = config.get("datasets") or []
    if isinstance(datasets, dict):
        datasets = [{**(entry or {}), "name": name} for name, entry in datasets.items()]
    if not isinstance(defaults, dict) or not isinstance(datasets, list) or not all(
            isinstance(d, dict) for d in datasets):
        raise ValueError("defaults must be a mapping and datasets a list of mappings (or a mapping keyed by name)")
    if not datasets:
        raise ValueError("it defines no datasets: slime refuses to start (give at least one, or set EVAL_INTERVAL=0)")
    environment = {**os.environ, "DATA_DIR": s["DATA_DIR"]}

    def number(dataset: dict, key: str, flag: str, flag_value: int) -> tuple[int, str]:
        for where in (dataset, defaults):
            if key in where:
                given = where[key]
                if isinstance(given, bool) or not isinstance(given, int) or given < 1:
                    raise ValueError(f"dataset {dataset['name']}: {key} is {given!r}, not a positive integer (slime "
                                     "passes it on unconverted: write the number itself)")
                return given, "EVAL_CONFIG"
        return flag_value, flag

    eval_length = flag_value_in(extra, "--eval-max-response-len")
    length_flag = ("--eval-max-response-len", eval_length) if eval_length is not None else \
        ("MAX_RESPONSE_LEN", s.int("MAX_RESPONSE_LEN"))
    samples_flag = ("--n-samples-per-eval-prompt", flag_value_in(extra, "--n-samples-per-eval-prompt") or 1)
    out = []
    for dataset in datasets:
        if "name" not in dataset:
            raise ValueError("a dataset entry has no name, which slime needs")
        samples, _ = number(dataset, "n_samples_per_eval_prompt", *samples_flag)
        length, source = number(dataset, "max_response_len", *length_flag)
        path = _INTERPOLATION.sub(lambda m: environment.get(m.group(1), (m.group(2) or "").strip()),
                                  str(dataset["path"]))
        out.append(EvalSet(str(dataset["name"]), path, samples, length, source))
    return out


def job_data_files(s: Settings, extra: Sequence[str] = ()) -> list[str]:
    """The data files the job reads: PROMPT_DATA and, with evaluation on, the eval sets of EVAL_CONFIG (raises one of
    :data:`EVAL_CONFIG_ERRORS` if EVAL_CONFIG cannot be read or holds a value of the wrong form)."""
    return [s["PROMPT_DATA"], *(dataset.path for dataset in eval_sets(s, extra))]


def path_problems(s: Settings, launcher: str, served: CheckpointReport) -> list[str]:
    """Missing or wrong cluster paths: slime, Megatron-LM, the checkpoint SGLang serves (``served``: the FP8 one, or
    the BF16 ``MODEL_DIR`` with ``TRAIN_PRECISION=fp16``) and the torch_dist one, the data."""
    out = []
    if not Path(s["SLIME_DIR"], "train.py").is_file():
        out.append(f"SLIME_DIR={s['SLIME_DIR']} has no train.py; set SLIME_DIR to the slime checkout (/root/slime "
                   "in the slimerl/slime image)")
    if not Path(s["MEGATRON_DIR"], "megatron").is_dir():
        out.append(f"MEGATRON_DIR={s['MEGATRON_DIR']} has no megatron/ package; set MEGATRON_DIR to the Megatron-LM "
                   "checkout (/root/Megatron-LM in the image)")
    if Path(s[s.rollout_checkpoint]).is_dir():
        out += served.problems
    elif s.rollout_checkpoint == "MODEL_DIR":
        out.append(f"MODEL_DIR={s['MODEL_DIR']} does not exist; TRAIN_PRECISION=fp16 serves the BF16 model from "
                   f"there: hf download Qwen/{s.profile.hf_name} --local-dir {s['MODEL_DIR']}")
    else:
        out.append(f"FP8_HF_DIR={s['FP8_HF_DIR']} does not exist; run '{launcher} --prepare' (converts MODEL_DIR) or "
                   f"hf download Qwen/{s.profile.hf_name}-FP8 --local-dir {s['FP8_HF_DIR']}")
    if not is_megatron_checkpoint(s["TORCH_DIST_DIR"]):
        out.append(f"TORCH_DIST_DIR={s['TORCH_DIST_DIR']} is not a Megatron checkpoint (no {TRACKER}); run "
                   f"'{launcher} --prepare'")
    out += resume_problems(s)
    if not Path(s["PROMPT_DATA"]).is_file():
        out.append(f"PROMPT_DATA={s['PROMPT_DATA']} does not exist; run '{launcher} --prepare' (writes DATA_DIR)")
    try:
        missing = [path for path in job_data_files(s)[1:] if not Path(path).is_file()]
    except EVAL_CONFIG_ERRORS as exc:
        out.append(eval_config_error(s, exc))
    else:
        if missing:
            out.append(f"eval sets of EVAL_CONFIG (with DATA_DIR={s['DATA_DIR']}) do not exist: "
                       f"{' '.join(missing)}; run '{launcher} --prepare' or set EVAL_INTERVAL=0")
    return out


def resume_point(s: Settings) -> int | None:
    """The iteration slime resumes from LOAD_DIR (None: a fresh start, or a ``release`` checkpoint, where the
    controllers start afresh); :class:`StateError` for a tracker file that Megatron and the hooks refuse."""
    tracker = tracker_in(s["LOAD_DIR"])
    return None if tracker is None else read_tracker(tracker)


def resume_problems(s: Settings) -> list[str]:
    """LOAD_DIR's checkpoint tracker, read as the hooks read it at ``on_megatron_init`` (after the model loaded)."""
    try:
        resume_point(s)
    except StateError as exc:
        return [f"LOAD_DIR={s['LOAD_DIR']} (train.py's --load): {exc}"]
    return []


def eval_config_error(s: Settings, exc: Exception) -> str:
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
    return f"EVAL_CONFIG={s['EVAL_CONFIG']} could not be read: {clip(reason, 300)}"


def local_gpu_problems(s: Settings) -> list[str]:
    """This node's GPU count (``nvidia-smi``) against GPUS_PER_NODE."""
    if shutil.which("nvidia-smi") is None:
        return ["nvidia-smi not found: run on a GPU node, inside the container started with --gpus all"]
    try:
        listing = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        listing = ""
    count = sum(1 for line in listing.splitlines() if re.match(r"\s*[0-9]", line))
    wanted = s.int("GPUS_PER_NODE")
    if count < wanted:
        return [f"this node has {count} GPUs (nvidia-smi) but GPUS_PER_NODE={wanted}; use a node with {wanted} GPUs "
                "or set GPUS_PER_NODE (and a layout that fits)"]
    return []


def ray_problems(s: Settings, warn: Callable[[str], None]) -> list[str]:
    """Ray reachable at RAY_ADDRESS (``ray job list``) with at least NUM_NODES x GPUS_PER_NODE GPUs (``ray status``)."""
    needed, per_node = s.int("NUM_NODES") * s.int("GPUS_PER_NODE"), s["GPUS_PER_NODE"]
    if shutil.which("ray") is None:
        return ["ray not found on PATH: run inside the slimerl/slime image (docker/README.md)"]
    try:
        reachable = subprocess.run(["ray", "job", "list", "--address", s["RAY_ADDRESS"]], capture_output=True,
                                   timeout=60).returncode == 0
    except subprocess.TimeoutExpired:
        reachable = False
    if not reachable:
        return [f"Ray is not reachable at RAY_ADDRESS={s['RAY_ADDRESS']}; start it on the head node with 'ray start "
                f"--head --num-gpus {per_node} --dashboard-host=0.0.0.0 --dashboard-port=8265' (other nodes: 'ray "
                f"start --address=<head-ip>:6379 --num-gpus {per_node}') or set RAY_ADDRESS"]
    environment = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    try:
        status = subprocess.run(["ray", "status"], capture_output=True, text=True, timeout=60, env=environment).stdout
    except subprocess.TimeoutExpired:
        status = ""
    found = re.search(r"[0-9.]+/([0-9]+)(?:\.[0-9]+)? GPU", status)
    if found is None:
        warn(f"could not read the cluster's GPU count from 'ray status'; Ray will wait if fewer than {needed} GPUs "
             "join")
    elif int(found.group(1)) < needed:
        return [f"the Ray cluster has {found.group(1)} GPUs but the layout needs NUM_NODES x GPUS_PER_NODE = {needed}; "
                f"start Ray on every node with --num-gpus {per_node} or lower NUM_NODES"]
    return []


def import_problems(s: Settings, targets: tuple[str, ...]) -> list[str]:
    """Each ``module`` or ``module:attribute`` importable by PYTHON with the job's PYTHONPATH (``.imports``)."""
    environment = job_env(s)
    done = subprocess.run([s["PYTHON"], "-m", "mismatch_ctrl.launch.imports", *targets], capture_output=True,
                          text=True, env=environment)
    failed = [line.removeprefix("import-check: ") for line in done.stdout.splitlines()
              if line.startswith("import-check: ")]
    if done.returncode != 0 and not failed:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-3:])
        return [f"PYTHON={s['PYTHON']} failed while checking imports: {tail}"]
    if failed:
        failed.append(f"imports use PYTHONPATH={job_pythonpath(s)}: slime and megatron come with the slimerl/slime "
                      "image (SLIME_DIR, MEGATRON_DIR); mismatch_ctrl and recipes need REPO_ROOT and pip install -e "
                      "'.[recipe]' (docker/Dockerfile)")
    return failed


def user_flags(extra: Sequence[str]) -> list[str]:
    """The flags among the user's arguments after ``--`` (``--name`` or ``--name=value``, by name; a word with a
    space is a value, e.g. ``"--x y"`` for a JSON-ish flag)."""
    return [word.partition("=")[0] for word in extra
            if word.startswith("--") and len(word) > 2 and not any(c.isspace() for c in word.partition("=")[0])]


FLAG_CHECK_SECONDS = 300
"""The most the check of the flags after ``--`` may take (it imports slime and Megatron): past it, a warning."""


def flag_problems(s: Settings, extra: Sequence[str], train_arguments: Sequence[str]) -> tuple[list[str], list[str]]:
    """(errors, warnings) for the user's flags after ``--``, as slime's own parsers read ``train_arguments`` with the
    job's PYTHONPATH (:mod:`.flags`): a flag none of them knows (slime would drop it silently), an abbreviation one
    of them completes (the launcher's checks read full names), arguments slime's parsing rejects. When the parsers
    cannot be run, a warning saying why. Nothing to check, and no process started, without flags after ``--``."""
    errors, not_checked = slime_flag_check(s, extra, train_arguments)
    return errors, [not_checked] if not_checked else []


def dry_run_flag_problems(s: Settings, extra: Sequence[str], train_arguments: Sequence[str]
                          ) -> tuple[list[str], list[str]]:
    """``--dry-run``'s (errors, warnings) for the flags after ``--``: slime's parsers' verdict where they can be
    imported (:func:`flag_problems`); else a warning that says so, and argparse's abbreviation rule on the flags the
    launcher knows (:func:`.known_flags.offline_findings`): an abbreviation is an error naming the full flag, a flag
    the launcher does not know is named in a warning (with the closest known spelling)."""
    errors, not_checked = slime_flag_check(s, extra, train_arguments)
    if not not_checked:
        return errors, []
    warnings = [f"{not_checked}; checked here only by argparse's abbreviation rule against the {len(KNOWN_FLAGS)} "
                "flags the launcher knows (a launch runs slime's parsers on them)"]
    unknown = []
    for item in offline_findings(user_flags(extra)):
        if item["kind"] == "abbreviation":
            errors.append(f"{item['flag']} after -- is not a full flag name: it begins {' and '.join(item['full'])}; "
                          f"write the flag in full ({ABBREVIATION_RULE})")
        elif item["like"]:
            warnings.append(f"{item['flag']} after -- is not a flag the launcher knows: did you mean "
                            f"{item['like'][0]}? (slime drops a misspelt flag without a word; a launch refuses it)")
        else:
            unknown.append(item["flag"])
    if unknown:
        warnings.append(f"not judged without slime's parsers (not among the flags the launcher knows): "
                        f"{', '.join(unknown)}")
    return errors, warnings


ABBREVIATION_RULE = ("slime's SGLang parser, built with argparse's default allow_abbrev=True, would complete it past "
                     "the launcher's checks, its other parsers, built with allow_abbrev=False, would drop it; a launch "
                     "refuses it")


def slime_flag_check(s: Settings, extra: Sequence[str], train_arguments: Sequence[str]) -> tuple[list[str], str]:
    """(errors, why not checked) of slime's parsers on ``train_arguments`` (:func:`flag_problems`); the second is
    empty when they ran, or when there are no flags after ``--`` to check (then no process is started)."""
    flags = user_flags(extra)
    if not flags:
        return [], ""
    where = f"slime at SLIME_DIR={s['SLIME_DIR']}"
    not_checked = f"the flags after -- were not checked against the parsers of {where}"
    try:
        done = subprocess.run([s["PYTHON"], "-m", "mismatch_ctrl.launch.flags", json.dumps(flags), *train_arguments],
                              capture_output=True, text=True, env=job_env(s), timeout=FLAG_CHECK_SECONDS)
    except subprocess.TimeoutExpired:
        return [], f"{not_checked}: the check took over {FLAG_CHECK_SECONDS} s"
    try:
        found = [json.loads(line.removeprefix("flag-check: ")) for line in done.stdout.splitlines()
                 if line.startswith("flag-check: ")]
        readable = all(isinstance(item, dict) for item in found)
    except ValueError:
        found, readable = [], False
    if done.returncode != 0 or not readable:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-3:])
        return [], f"{not_checked}: PYTHON={s['PYTHON']} failed: {clip(tail, 300)}"
    errors, why = [], []
    for item in found:
        kind = item.get("kind")
        if kind == "unknown":
            like = f" (did you mean {' or '.join(item['like'])}?)" if item.get("like") else ""
            errors.append(f"{item['flag']} after -- is not a flag of {where}, Megatron or SGLang{like}: slime parses "
                          "train.py's arguments with ignore_unknown_args and would drop it without a word")
        elif kind == "abbreviation":
            errors.append(f"{item['flag']} after -- is an abbreviation that a parser of slime's completes to "
                          f"{' or '.join(item['full'])}: write the flag in full (the launcher's checks read full "
                          "names, and only that parser would read it)")
        elif kind == "refused":
            errors.append(f"{where} rejects train.py's arguments (the launcher's and yours), as it would when the job "
                          f"starts: {item['message']}")
        else:
            why.append(f"{not_checked}: {item.get('error')}")
    return errors, "; ".join(why)


def host_memory_bytes() -> float | None:
    """This node's RAM (``MemTotal`` of ``/proc/meminfo``), or None where there is no such file."""
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    found = re.search(r"^MemTotal:\s+([0-9]+) kB", text, re.M)
    return int(found.group(1)) * 1024.0 if found else None

