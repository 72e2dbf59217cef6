"""Per-process state of the slime hooks: the validated config, the controllers and where their state is saved.

The runtime lives on the ``args`` object slime passes to every hook (one per Ray actor process), so a new ``args``
(a new run, or the next method of the CPU lab) starts a new runtime. It is created by the first hook that runs -
normally ``on_megatron_init`` - which validates the configuration against slime's flags and restores the
controllers when a checkpoint is being resumed (SLIME.md section 5).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import SECTIONS, Config, build_config, inert_settings, read_yaml, refuse_misplaced, required_section
from ..controllers import ControllerSet, restore
from ..errors import ConfigError, StateError
from ..formatting import brief
from ..state import StateStore
from ._groups import topology
from .names import ADVANTAGE_HOOK, LR_HOOK, TIS_HOOK, read_tracker, tracker_in

log = logging.getLogger("mismatch_ctrl")

GRPO_ESTIMATORS = ("grpo", "gspo", "cispo")
_ATTR = "_mismatch_ctrl_runtime"


@dataclass
class Runtime:
    """What the hooks of one process share: the config, the controllers, the state store, the next rollout id, the
    LR factor applied to the current rollout, and the warnings already given."""

    config: Config
    controllers: ControllerSet
    store: StateStore | None
    next_rollout: int
    lr_applied: tuple[int, float] | None = None
    warned: frozenset[str] = frozenset()

    def warn_once(self, key: str, message: str) -> None:
        if key not in self.warned:
            self.warned = self.warned | {key}
            log.warning(message)


def get_runtime(args: Any) -> Runtime:
    """The runtime attached to ``args``, created (validated, resumed) on first use."""
    runtime = getattr(args, _ATTR, None)
    if runtime is None:
        runtime = _create(args)
        setattr(args, _ATTR, runtime)
    return runtime


def architecture_source(args: Any) -> dict[str, Any]:
    """Where the architecture comes from: Megatron's ``--num-experts`` (None for a dense model: Megatron's default),
    else the Hugging Face ``config.json`` of ``--hf-checkpoint`` (which slime's rollout engines load)."""
    num_experts = getattr(args, "num_experts", None)
    if num_experts is None and getattr(args, "hf_checkpoint", None):
        return {"hf_config": args.hf_checkpoint}
    return {"num_experts": num_experts}


def _create(args: Any) -> Runtime:
    if not hasattr(args, "mismatch_ctrl"):
        raise ConfigError("args has no 'mismatch_ctrl' settings: pass a YAML with a top-level 'mismatch_ctrl:' key "
                          "with --custom-config-path, as an absolute path (slime reads it from the directory train.py "
                          "runs in), e.g. /workspace/mismatch-ctrl/configs/methods/dcgrpo.yaml")
    section = required_section(args.mismatch_ctrl, "args.mismatch_ctrl: ")
    check_config_file(args)
    config = build_config(section, **architecture_source(args))
    check_slime_args(args, config)
    controllers, next_rollout = _resume(args, config)
    save = getattr(args, "save", None)
    store = StateStore(Path(save) / "mismatch_ctrl", config.state.keep_last) if save else None
    if store is not None:
        check_writable(store.directory)
        # Files of rollouts this run will write (all, on a fresh start) are another run's or an abandoned attempt's:
        # mixed in, they would be overwritten, or kept while this run's own newer files are pruned.
        if topology().is_main_rank:
            later = [r for r in store.rollout_ids() if controllers.last_rollout is None or r >= next_rollout]
            if later:
                _move_aside(store, later, "starts afresh" if controllers.last_rollout is None else
                            f"resumes after rollout {controllers.last_rollout}")
    elif controllers.dcgrpo or controllers.lr or controllers.acrl:
        log.warning("mismatch_ctrl: no --save directory, controller state will not be persisted")
    log.info("mismatch_ctrl: method %r, architecture %s, first rollout %d", config.name, config.architecture,
             next_rollout)
    return Runtime(config, controllers, store, next_rollout)


def check_config_file(args: Any) -> None:
    """What slime's merge of ``--custom-config-path`` hides (SLIME.md section 3: ``yaml.safe_load``, then every
    top-level key set on ``args``), refused as ``check-config`` refuses it: the file is read again strictly, so a
    duplicate key (which ``safe_load`` resolves to the last without a word) or a mismatch_ctrl block written beside
    ``mismatch_ctrl:`` instead of under it is an error naming the key. Where the file is not on this machine (a
    relative path, another node), a block of ours that slime set on ``args`` as a mapping is still refused."""
    path = getattr(args, "custom_config_path", None)
    where = f"--custom-config-path {path}: "
    if path and Path(path).exists():
        document = read_yaml(path)
        if isinstance(document, dict):
            refuse_misplaced(document, where)
    elif path and topology().is_main_rank:
        log.warning("mismatch_ctrl: %snot found on this machine (cwd %s), so its duplicate keys and top-level blocks "
                    "are not checked here; `mismatch-ctrl check-config` checks them", where, os.getcwd())
    merged = [key for key in ("correction", *SECTIONS) if isinstance(getattr(args, key, None), dict)]
    if merged:
        refuse_misplaced(dict.fromkeys(merged), "args (merged from --custom-config-path): ")


def _move_aside(store: StateStore, rollouts: list[int], why: str) -> None:
    """Move the state files of ``rollouts`` out of this run's way into a new ``<store>.previous-<time>[-k]``
    directory next to the store, so that nothing is lost."""
    stamp = store.directory.with_name(f"{store.directory.name}.previous-{time.strftime('%Y%m%d-%H%M%S')}")
    aside, k = stamp, 1
    try:
        while True:
            try:
                aside.mkdir()
                break
            except FileExistsError:  # a restart within the same second
                k += 1
                aside = stamp.with_name(f"{stamp.name}-{k}")
        for rollout in rollouts:
            os.replace(store.path(rollout), aside / store.path(rollout).name)
    except OSError as exc:
        raise StateError(f"{store.directory}: cannot move the state files of rollouts {brief(rollouts)} aside to "
                         f"{aside} ({exc.strerror or exc}): make --save writable, or move them away yourself") from None
    log.warning("mismatch_ctrl: %s held controller state of rollouts %s while this run %s (another run's, or an "
                "attempt that went on past its last checkpoint); moved it to %s", store.directory, brief(rollouts), why,
                aside)


def _resume(args: Any, config: Config) -> tuple[ControllerSet, int]:
    """The controllers (restored if a checkpoint is being resumed) and the first rollout id of this run.

    Resuming = not ``--finetune`` and ``{args.load}/latest_checkpointed_iteration.txt`` names iteration N: then the
    state saved after rollout N is loaded and this run starts at N + 1 (slime's own rule).
    """
    controllers = ControllerSet(config)
    start = getattr(args, "start_rollout_id", None)
    load = getattr(args, "load", None)
    tracker = tracker_in(load) if load and not getattr(args, "finetune", False) else None
    if tracker is None:
        return controllers, int(start or 0)
    iteration = read_tracker(tracker)
    if iteration is None:
        log.info("mismatch_ctrl: %s names a release checkpoint: the controllers start afresh", tracker)
        return controllers, int(start or 0)
    controllers = restore(config, StateStore(Path(load) / "mismatch_ctrl"), iteration, f"rollout {iteration}")
    if controllers.last_rollout is not None:
        log.info("mismatch_ctrl: restored controller state of rollout %d from %s", iteration, load)
    return controllers, iteration + 1


def check_writable(directory: Path) -> None:
    """Create the state directory and write a probe file in it now, so a read-only ``--save`` or a file in the way is
    reported at init, not after the first rollout's work."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".probe.")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise StateError(f"{directory}: cannot write the controller state there ({exc.strerror or exc}); make --save "
                         "a writable directory (on a file system every rank shares)") from None


COUNT_FLAGS = {
    "rollout_max_response_len": (1, "the length-surge detector caps its threshold by it"),
    "num_rollout": (1, "the last rollout saves a checkpoint, and the state with it"),
    "save_interval": (0, "the state is kept for the rollouts a checkpoint follows"),
    "start_rollout_id": (0, "the first rollout id, which names the state files"),
}
"""slime flags the hooks compute with, each ``type=int`` with default None in slime's parser
(``slime/utils/arguments.py`` at 624b824a, :374, :609, :680; Megatron's for ``--save-interval``): checked at init, so
a value given another way (a config merged into args, a ``Namespace`` built by hand) fails there, not after a
rollout's work. The least value, and what the hooks use it for."""


def check_slime_args(args: Any, config: Config) -> None:
    """Reject slime flag combinations under which the configured method would silently not run."""
    stateful = [name for name, on in (("dcgrpo", config.dcgrpo.enabled), ("lr_decay", config.lr_decay.enabled),
                                      ("acrl", config.acrl.enabled)) if on]
    preset = config.correction_preset
    weighting = [who for who, on in ((f"correction preset {preset!r}" if preset != "none" else "the correction section",
                                      config.correction.active), ("acrl", config.acrl.enabled)) if on]
    paths = {
        "custom_advantage_function_path": (ADVANTAGE_HOOK, bool(stateful),
                                           f"{', '.join(stateful)} need{'s' if len(stateful) == 1 else ''}"),
        "custom_tis_function_path": (TIS_HOOK, bool(weighting),
                                     f"{' and '.join(weighting)} need{'s' if len(weighting) == 1 else ''}"),
        "custom_megatron_before_train_step_hook_path": (LR_HOOK, config.lr_decay.enabled, "lr_decay needs"),
    }
    for attr, (expected, needed, who) in paths.items():
        if needed and getattr(args, attr, None) != expected:
            flag = "--" + attr.replace("_", "-")
            raise ConfigError(f"{who} {flag} {expected} (got {getattr(args, attr, None)!r})")
    if (config.correction.active or config.acrl.enabled) and not (
            getattr(args, "get_mismatch_metrics", False) or getattr(args, "use_tis", False)):
        raise ConfigError("slime calls the rollout-correction hook only with --get-mismatch-metrics (or --use-tis): "
                          "add --get-mismatch-metrics")
    estimator = getattr(args, "advantage_estimator", "grpo")
    if getattr(args, "custom_advantage_function_path", None) == ADVANTAGE_HOOK and estimator not in GRPO_ESTIMATORS:
        raise ConfigError(f"{ADVANTAGE_HOOK} computes GRPO-style advantages; --advantage-estimator {estimator} is not "
                          f"supported (use one of {GRPO_ESTIMATORS})")
    if config.lr_decay.enabled:
        lr, min_lr = getattr(args, "lr", None), getattr(args, "min_lr", None)
        if not (_finite(lr) and lr > 0):
            raise ConfigError(f"lr_decay scales --lr, which must be a finite number > 0, got {brief(lr)}")
        if min_lr is not None and not (_finite(min_lr) and min_lr >= 0):
            raise ConfigError(f"lr_decay scales --min-lr, which must be a finite number >= 0, got {brief(min_lr)}")
    for attr, (least, use) in COUNT_FLAGS.items():
        value = getattr(args, attr, None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            raise ConfigError(f"--{attr.replace('_', '-')} must be an integer >= {least} ({use}), got {brief(value)}")
    rollouts = getattr(args, "num_rollout", None)
    errors, warnings = inert_settings(config, rollouts if isinstance(rollouts, int) and
                                      not isinstance(rollouts, bool) and rollouts > 0 else None)
    if errors:
        raise ConfigError(errors[0])
    for warning in warnings:
        log.warning("mismatch_ctrl: %s", warning)
    if config.lr_decay.enabled and getattr(args, "decoupled_lr", None) is not None:
        raise ConfigError("lr_decay with --decoupled-lr is not supported: the decoupled param groups cannot be told "
                          "apart in megatron-core 0.16 param groups")
    skipped = skips_log_prob_recompute(args)
    if config.needs_train_log_probs and skipped:
        raise ConfigError(f"DC-GRPO / ACRL need the training engine's log-probs in the advantage hook, and slime skips "
                          f"that recompute here ({skipped}): add --get-mismatch-metrics")
    if config.needs_train_log_probs and skipped is None:
        log.warning("mismatch_ctrl: DC-GRPO / ACRL need the training engine's log-probs in the advantage hook; "
                    "slime skips that recompute with one optimizer step per rollout unless --get-mismatch-metrics "
                    "is set: add it")
    if config.dcgrpo.enabled and getattr(args, "normalize_advantages", False):
        log.warning("mismatch_ctrl: --normalize-advantages whitens the DC-GRPO-shaped advantages after the hook; "
                    "the penalty then acts relative to the advantage scale")


def skips_log_prob_recompute(args: Any) -> str | None:
    """Why slime will not recompute the training engine's log-probs before the advantage hook ('' if it will; None
    if ``args`` do not tell). slime 624b824 ``backends/megatron_utils/actor.py:461-475``: never with
    ``--get-mismatch-metrics``; else always with ``--use-rollout-logprobs``, and with one optimizer step per rollout
    (``rollout_batch_size * n_samples_per_prompt // global_batch_size == 1``) when the loss can reuse them (policy
    loss, ``kl_coef`` 0, no critic, old actor, OPD or GSPO, routing replay only as rollout routing replay)."""
    if getattr(args, "get_mismatch_metrics", False):
        return ""
    if getattr(args, "use_rollout_logprobs", False):
        return "--use-rollout-logprobs"
    sizes = [getattr(args, name, None) for name in ("rollout_batch_size", "n_samples_per_prompt", "global_batch_size")]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes):
        return None
    steps = sizes[0] * sizes[1] // sizes[2]
    flag = functools.partial(getattr, args)
    reusable = (steps == 1 and flag("loss_type", "policy_loss") == "policy_loss" and flag("kl_coef", 0.0) == 0
                and not any(flag(name, False) for name in ("use_critic", "keep_old_actor", "use_opd"))
                and (not flag("use_routing_replay", False) or flag("use_rollout_routing_replay", False))
                and flag("advantage_estimator", "grpo") != "gspo")
    return ("one optimizer step per rollout: rollout_batch_size x n_samples_per_prompt // global_batch_size = "
            f"{sizes[0]} x {sizes[1]} // {sizes[2]} = 1") if reusable else ""


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
