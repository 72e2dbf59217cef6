"""``mismatch-ctrl analyze``: read a run's dumps one rollout at a time and gather every number of the report.

The result is a plain JSON-able dict (``--json`` prints it; :mod:`.report` renders it), built in one pass over the
rollout files, holding one file in memory at a time.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import re
import warnings
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Literal

import torch

from ..batch import DROPPED_WARNING, TokenBatch
from ..architecture import ARCHITECTURES, resolve_architecture
from ..config import Config, arch_defaults, load_config
from ..dcgrpo import EPS_MAX
from ..errors import ConfigError, InputError
from ..formatting import brief, clip
from ..sketch import histogram_quantiles
from .consistency import RunChecks
from .dumps import DumpError, RolloutDump, Skipped, find_rollouts, read_rollout
from .replay import Replay
from .stats import (PRESET_NAMES, PROB_DIFF_QUANTILES, TAIL_THRESHOLDS, one_engine_batch, quantile_key, rollout_stats,
                    token_batch)

DEFAULT_METHOD = "dcgrpo_length_decay"
DEFAULT_ARCHITECTURE = "moe"
"""Used for the DC-GRPO defaults when neither the method nor the options name an architecture: the recipe trains
Qwen3-30B-A3B (MoE)."""


@dataclass(frozen=True)
class AnalyzeOptions:
    """Settings of one analysis (the command-line options of ``mismatch-ctrl analyze``)."""

    config: str | Path | None = None
    architecture: str | None = None
    num_experts: int | None = None
    hf_config: str | Path | None = None
    eps: float | Literal["auto"] | None = None
    lambda_0: float | None = None
    eta: float | None = None
    max_response_len: int | None = None
    progress: bool = True
    unsafe_load: bool = False
    reward_key: str | None = None


def eps_option(text: str) -> float | Literal["auto"]:
    """``--eps``: a number in ``(0, EPS_MAX)`` or ``auto``."""
    if text == "auto":
        return "auto"
    value = _float(text)
    if not 0 < value < EPS_MAX:
        raise argparse.ArgumentTypeError(f"must be a number > 0 and < {EPS_MAX} or 'auto', got {brief(text)}")
    return value


def number_option(minimum: float, strict: bool = False) -> Callable[[str], float]:
    """An option type: a finite number ``>= minimum`` (``> minimum`` if ``strict``)."""
    def parse(text: str) -> float:
        value = _float(text)
        if not math.isfinite(value) or value < minimum or (strict and value == minimum):
            raise argparse.ArgumentTypeError(f"must be a finite number {'>' if strict else '>='} {minimum:g}, got "
                                             f"{brief(text)}")
        return value
    return parse


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def method_path(config: str | Path | None) -> Path:
    """A method YAML: a path, or the name of a shipped method (``configs/methods/<name>.yaml``); default
    ``dcgrpo_length_decay``."""
    if config is not None and Path(config).is_file():
        return Path(config)
    name = DEFAULT_METHOD if config is None else str(config).removesuffix(".yaml")
    shipped = resources.files("mismatch_ctrl").joinpath("configs", "methods", f"{name}.yaml")
    if "/" not in name and shipped.is_file():
        return Path(str(shipped))
    if config is not None and (Path(config).exists() or Path(config).is_symlink()):
        return Path(config)  # a directory, device or broken link: reading it names what it is
    raise ConfigError(f"--config {config}: no such file (give a method YAML or the name of one in configs/methods/)")


def resolve_config(options: AnalyzeOptions) -> tuple[Config, Path, str]:
    """The method's configuration with the overrides, its file, and where its architecture came from."""
    path = method_path(options.config)
    arch = resolve_architecture(architecture=options.architecture, num_experts=options.num_experts,
                                hf_config=options.hf_config)
    config = load_config(path, architecture=arch or DEFAULT_ARCHITECTURE)
    if config.architecture != (arch or DEFAULT_ARCHITECTURE):
        source = "the method file"
    elif arch is not None:
        source = "the options"
    else:
        source = f"default ({DEFAULT_ARCHITECTURE}: the recipe's Qwen3-30B-A3B; set --arch)"
    overrides = {k: v for k, v in (("eps", options.eps), ("lambda_0", options.lambda_0), ("eta", options.eta))
                 if v is not None}
    dcgrpo = dataclasses.replace(config.dcgrpo, **overrides)
    for key, message in dcgrpo.problems():
        raise ConfigError(f"{path}: dcgrpo.{key} with --eps / --lambda-0 / --eta applied: {message}")
    return dataclasses.replace(config, dcgrpo=dcgrpo), path, source


def _skipped_text(skipped: list[Skipped], shown: int = 5) -> str:
    """The first ``shown`` skipped files with their reasons, for an error message of bounded length."""
    if not skipped:
        return ""
    more = f"; and {len(skipped) - shown} more" if len(skipped) > shown else ""
    return "; skipped " + "; ".join(f"{clip(s.path, 200)}: {clip(s.reason, 300)}" for s in skipped[:shown]) + more


def analyze_dumps(directory: str | Path, options: AnalyzeOptions = AnalyzeOptions()) -> dict[str, Any]:
    """Every number of the report for the dumps under ``directory`` (see :func:`.dumps.find_rollouts`)."""
    config, method, arch_source = resolve_config(options)
    groups, skipped = find_rollouts(directory, options.unsafe_load)
    if not groups:
        lab = Path(directory)
        if (lab / "summary.json").is_file() or any(lab.glob("*/seed*/metrics.jsonl")) or \
                (lab / "metrics.jsonl").is_file():
            raise DumpError(f"{directory}: a mismatch-ctrl lab output without dumps; train the runs with "
                            "`mismatch-ctrl lab --dump-details ...` and analyse OUT/<run>/seed<k>/dump")
        raise DumpError(f"{directory}: no dump files ({{rollout_id}}.pt under train_data/ or rollout_data/, or "
                        "*.pt; names with eval_<n> are slime's evaluation dumps, left out); run slime with "
                        f"--dump-details DIR and analyse DIR{_skipped_text(skipped)}")
    replay = Replay(config)
    rows: list[dict[str, Any]] = []
    pooled = None
    tail_counts = [0.0] * len(TAIL_THRESHOLDS)
    pooled_tokens = 0.0
    truncated_lengths: list[int] = []
    checks, samples = RunChecks(options.max_response_len), 0
    for files in _progress(groups, options.progress):
        try:
            dump = read_rollout(files, options.unsafe_load, options.reward_key)
            checks.observe(dump)
            samples += dump.num_samples
            with warnings.catch_warnings():  # dropped tokens are counted in the report
                warnings.filterwarnings("ignore", message=re.escape(DROPPED_WARNING))
                batch = token_batch(dump, config.nonfinite)
                one_engine = one_engine_batch(dump, config.nonfinite) if batch is None else None
        except (DumpError, InputError) as exc:
            skipped.append(Skipped.of(files.paths, exc))
            continue
        problems = _problems(dump, batch, one_engine)
        if batch is not None and not bool((batch.mask > 0).any()):
            batch = None  # nothing to measure: the hook would skip the dual update too
        stats = rollout_stats(dump, batch, options.max_response_len, one_engine)
        row = stats.row
        row.update(problems, measured=batch is not None, train_log_probs=dump.train_log_probs is not None)
        rewards = None if dump.rewards is None else [r if math.isfinite(r) else 0.0 for r in dump.rewards]
        row["replay"] = replay.observe(dump.rollout_id, batch, rewards, row["mean_response_length"])
        row["replay"].pop("rollout_id")
        row["files"], row["notes"] = dump.files, dump.notes
        if dump.truncated is not None:
            truncated_lengths += [n for n, t in zip(dump.response_lengths, dump.truncated) if t]
        if stats.histogram is not None:
            pooled = stats.histogram if pooled is None else pooled + stats.histogram
            trained = float(stats.histogram.sum())
            pooled_tokens += trained
            for i, t in enumerate(TAIL_THRESHOLDS):
                tail_counts[i] += row["prob_diff_tail"][f">{t:g}"] * trained
        rows.append(row)
        del dump, batch, one_engine, stats
    if not rows:
        raise DumpError(f"{directory}: no readable rollout{_skipped_text(skipped)}")
    if not samples:
        raise DumpError(f"{directory}: the dumps of its {len(rows)} rollout(s) hold no samples (every 'samples' list "
                        "is empty): nothing to measure; analyse the dumps of a run that trained"
                        f"{_skipped_text(skipped)}")

    max_len, max_len_source = options.max_response_len, "--max-response-len"
    if max_len is None and truncated_lengths:
        max_len, max_len_source = max(truncated_lengths), "inferred: the longest truncated response"
    elif max_len is None:
        max_len_source = None
    ids = [row["rollout_id"] for row in rows]
    missing = missing_ids(ids)
    result = {
        "source": str(directory),
        "generated": datetime.datetime.now().isoformat(timespec="seconds"),
        "method": {"file": str(method), "name": config.name, "architecture": config.architecture,
                   "architecture_source": arch_source, "dcgrpo": config.dcgrpo.enabled},
        "counts": {"rollouts": len(rows), "first": min(ids), "last": max(ids), "missing": missing,
                   **{f"with_{key}": sum(bool(r[key]) for r in rows)
                      for key in ("train_log_probs", "rollout_log_probs", "both_log_probs", "trained_tokens")},
                   "measured": sum(r["measured"] for r in rows),
                   **{key: sum(r[key] or 0 for r in rows)
                      for key in ("nonfinite_tokens", "impossible_tokens", "nonfinite_rewards")}},
        "max_response_len": {"value": max_len, "source": max_len_source},
        "prob_diff_pooled": None if pooled is None else {
            "tokens": pooled_tokens,
            "quantiles": dict(zip(map(quantile_key, PROB_DIFF_QUANTILES),
                                  histogram_quantiles(pooled, list(PROB_DIFF_QUANTILES)))),
            "tail": {f">{t:g}": c / pooled_tokens if pooled_tokens else 0.0
                     for t, c in zip(TAIL_THRESHOLDS, tail_counts)},
        },
        "recommendation": _recommendation(replay),
        "dcgrpo_replay": replay.dcgrpo_summary(),
        "presets": _preset_summary(rows),
        "surge": replay.surge(max_len),
        "rollouts": rows,
        "skipped": [dataclasses.asdict(s) for s in skipped],
        "consistency": checks.findings(missing, min(ids), max(ids)),
    }
    return _finite(result)


def missing_ids(ids: list[int], limit: int = 20) -> dict[str, Any]:
    """Rollout ids absent between the first and the last of ``ids``: their count and the first ``limit`` gaps as
    ``[first, last]`` ranges (never the ids one by one: the ids come from file names and may be far apart)."""
    ordered = sorted(set(ids))
    gaps = [[a + 1, b - 1] for a, b in zip(ordered, ordered[1:]) if b - a > 1]
    return {"count": sum(b - a + 1 for a, b in gaps), "ranges": gaps[:limit], "more_ranges": max(len(gaps) - limit, 0)}


def _problems(dump: RolloutDump, batch: TokenBatch | None, one_engine: TokenBatch | None = None) -> dict[str, Any]:
    """What the rollout lacks or holds that cannot be used: which log-probs exist, the trained tokens left (both
    engines), the tokens dropped for a NaN/inf or an impossible (> 0) log-prob (of either engine, or of the one there
    is: ``one_engine``), and the non-finite rewards (replayed as advantage 0)."""
    checked = batch if batch is not None else one_engine
    impossible = None if checked is None else checked.impossible_tokens
    rewards = dump.rewards if dump.rewards is not None else dump.raw_rewards
    return {
        "both_log_probs": batch is not None,
        "trained_tokens": None if batch is None else int((batch.mask > 0).sum()),
        "nonfinite_tokens": None if checked is None else checked.nonfinite_tokens - impossible,
        "impossible_tokens": impossible,
        "nonfinite_rewards": None if rewards is None else sum(not math.isfinite(r) for r in rewards),
    }


def _recommendation(replay: Replay) -> dict[str, Any]:
    """The ``eps: auto`` value and spread, the architecture defaults, and for each candidate eps the fraction of
    rollouts whose C_bar exceeds it."""
    out = replay.eps_recommendation()
    out["arch_defaults"] = {arch: arch_defaults(arch)["dcgrpo"] for arch in ARCHITECTURES}
    c_bars = replay.c_bars()
    candidates = [("eps: auto (measured)", out["eps_auto"])]
    candidates += [(f"{arch} default", out["arch_defaults"][arch]["eps"]) for arch in ARCHITECTURES]
    chosen = replay.settings.eps
    if isinstance(chosen, float):
        candidates.append(("chosen (method + options)", chosen))
    out["candidates"] = [{"name": name, "eps": eps,
                          "fraction_above": sum(c > eps for c in c_bars) / len(c_bars) if c_bars else None}
                         for name, eps in candidates if eps is not None]
    return out


def _progress(groups: list[Any], enabled: bool) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        return groups
    return tqdm(groups, desc="rollouts", unit="rollout", disable=None if enabled else True, dynamic_ncols=True)


def _preset_summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per preset: mean and max over rollouts of the rejected token and sequence fractions, mean clipped fraction."""
    measured = [r["rejection"] for r in rows if "rejection" in r]
    out = {}
    for name in PRESET_NAMES:
        tokens = [m[name]["tokens"] for m in measured]
        seqs = [m[name]["sequences"] for m in measured]
        clipped = [m[name]["clipped"] for m in measured if m[name]["clipped"] is not None]
        out[name] = {
            "tokens_mean": sum(tokens) / len(tokens) if tokens else None, "tokens_max": max(tokens, default=None),
            "sequences_mean": sum(seqs) / len(seqs) if seqs else None, "sequences_max": max(seqs, default=None),
            "clipped_mean": sum(clipped) / len(clipped) if clipped else None,
        }
    return out


def _finite(value: Any) -> Any:
    """The result with NaN / infinity replaced by None (strict JSON) and tensors by numbers."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, torch.Tensor):
        return _finite(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
