"""Refusals before a verl run starts: verl settings under which a configured method would silently not run, each with
the override that fixes it. No verl import: the trainer calls :func:`check_verl_config` on verl's
composed config, the launchers' ``--dry-run`` on the config composed from the pinned wheel.

The rules, read in verl 0.9.1 (paths under ``verl/``):

- bypass mode sets ``old_log_probs := rollout_log_probs`` (``trainer/ppo/v1/trainer_base.py:1642-1646``): ``c`` is
  then 0 and DC-GRPO does nothing; our corrections would weigh a ratio of 1.
- ``rollout.calculate_log_probs: false`` leaves ``rollout_log_probs`` out of the batch (``:1679-1680``).
- DC-GRPO shapes a per-sequence advantage: verl's ``grpo`` (the v1 trainer's multi-trajectory path,
  ``trainer/ppo/v1/utils.py:148-217``).
- ``trainer.v1.trainer_mode`` other than the adapter's runs verl's own trainer (the async ones on stale policies),
  which never reads the YAML.
- ``parameter_sync_step > 1`` runs the advantage step several times per step on stale log-probs
  (``trainer_base.py:533-560``): the dual update is once per step.
- A preset verl computes natively must be verl's own ``algorithm.rollout_correction`` keys (the one table,
  :data:`~mismatch_ctrl.verl_vocabulary.PRESET_KEYS`); one verl cannot express runs from our core, with verl's
  own correction off.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

from ..config import Config
from ..errors import ConfigError
from ..formatting import brief
from ..presets import PRESETS
from ..verl_vocabulary import PRESET_KEYS, VERL_KEYS, VERL_VERSION, verl_keys

log = logging.getLogger("mismatch_ctrl")

TRAINER_MODE = "mismatch_ctrl"
"""``trainer.v1.trainer_mode`` that selects the adapter's trainer (registered by the plugin)."""
CONFIG_KEY = "mismatch_ctrl.config"
"""The verl config key naming the method YAML (``+mismatch_ctrl.config=PATH`` on verl's command line)."""
RC = "algorithm.rollout_correction"


def get(cfg: Any, dotted: str, default: Any = None) -> Any:
    """``cfg[a][b][c]`` for ``"a.b.c"`` (a verl DictConfig or nested dicts), ``default`` when a key is missing."""
    node = cfg
    for key in dotted.split("."):
        if not isinstance(node, Mapping) or key not in node:
            return default
        node = node[key]
    return node


def correction_keys(config: Config) -> dict[str, Any] | None:
    """verl's ``rollout_correction`` values for the configured correction (the preset's row of the table, or the
    same rule for custom settings); None when mismatch_ctrl runs it on verl's driver."""
    if config.correction_preset != "none" and config.correction == PRESETS[config.correction_preset]:
        return PRESET_KEYS[config.correction_preset]
    return verl_keys(config.correction)


def _same(a: Any, b: Any) -> bool:
    """verl reads a threshold as a float or a ``"lo_hi"`` string: compare numbers as numbers."""
    if isinstance(a, str) and isinstance(b, str):
        parts = [p.split("_") for p in a.split(",")], [p.split("_") for p in b.split(",")]
        try:
            return [[float(x) for x in p] for p in parts[0]] == [[float(x) for x in p] for p in parts[1]]
        except ValueError:
            return a == b
    if isinstance(a, (int, float, str)) and isinstance(b, (int, float, str)) and not isinstance(a, bool) \
            and not isinstance(b, bool):
        try:
            return float(a) == float(b)
        except ValueError:
            return False
    return a == b


def _shown(value: Any) -> str:
    """A verl value as its override would write it: booleans as true/false, strings quoted (``'true'`` is a string,
    not the boolean)."""
    return str(value).lower() if isinstance(value, bool) else brief(value)


def overrides(keys: Mapping[str, Any]) -> str:
    """The Hydra overrides that set ``keys`` under ``algorithm.rollout_correction`` (strings quoted for the shell)."""
    def value(v: Any) -> str:
        return "null" if v is None else str(v).lower() if isinstance(v, bool) else f"'{v}'" if isinstance(v, str) \
            else repr(v)
    return " ".join(f"{RC}.{k}={value(v)}" for k, v in keys.items())


def check_verl_config(cfg: Any, config: Config) -> None:
    """Raise :class:`ConfigError` naming the verl key and the override that fixes it, for every setting of ``cfg``
    (verl's composed config) under which ``config`` would not run as configured."""
    use_v1 = get(cfg, "trainer.use_v1", True)
    if use_v1 is not True:
        what = "runs verl's deprecated legacy trainer" if use_v1 is False else "is not the boolean true"
        raise ConfigError(f"trainer.use_v1={_shown(use_v1)} {what}, which mismatch_ctrl does not plug into: set "
                          "trainer.use_v1=true")
    mode = get(cfg, "trainer.v1.trainer_mode", "sync")
    if mode != TRAINER_MODE:
        stale = "its staleness is not handled by mismatch_ctrl; " if "async" in str(mode) else ""
        raise ConfigError(f"trainer.v1.trainer_mode={brief(mode)} runs verl's own trainer, which ignores {CONFIG_KEY} "
                          f"({stale}the adapter runs verl's synchronous trainer): set "
                          f"trainer.v1.trainer_mode={TRAINER_MODE}")
    sync = get(cfg, "trainer.v1.sync.parameter_sync_step", 1)
    if sync not in (None, 1):
        raise ConfigError(f"trainer.v1.sync.parameter_sync_step={brief(sync)}: mismatch_ctrl updates its controllers "
                          "once per training step on log-probs of the current policy; stale batches are not handled: "
                          "remove it (1)")
    if config.acrl.enabled:
        raise ConfigError("mismatch_ctrl.acrl: the ACRL band is not available on verl (its clip band would have to "
                          "change verl's rollout_is_threshold every step); use it on slime, or a fixed preset here")
    rc = get(cfg, RC)
    needs_log_probs = config.needs_train_log_probs or config.correction.active
    bypass = get(cfg, f"{RC}.bypass_mode", False)
    if needs_log_probs and bypass:
        raise ConfigError(f"{RC}.bypass_mode={_shown(bypass)} (which verl reads as true) sets old_log_probs to "
                          f"rollout_log_probs, so c = |p_train - "
                          f"p_rollout| is 0 and {'DC-GRPO' if config.dcgrpo.enabled else 'the correction'} would "
                          f"silently do nothing: set {RC}.bypass_mode=false")
    calculate = get(cfg, "actor_rollout_ref.rollout.calculate_log_probs", True)
    if needs_log_probs and calculate is not True:
        raise ConfigError(f"actor_rollout_ref.rollout.calculate_log_probs={_shown(calculate)}: not true, so the "
                          "rollout engine's log-probs may not be recorded, and mismatch_ctrl compares them with the "
                          "trainer's: set actor_rollout_ref.rollout.calculate_log_probs=true")
    estimator = get(cfg, "algorithm.adv_estimator", "grpo")
    if config.dcgrpo.enabled and estimator != "grpo":
        raise ConfigError(f"algorithm.adv_estimator={brief(estimator)}: DC-GRPO shapes GRPO's per-sequence advantage "
                          "A_i; set algorithm.adv_estimator=grpo")
    wanted = correction_keys(config)
    given = {key: get(rc, key) for key in VERL_KEYS} if rc is not None else None
    if config.correction.active and wanted is None:
        if given is not None and (given["rollout_is"] is not None or given["rollout_rs"] is not None):
            raise ConfigError(f"mismatch_ctrl.correction ({config.correction_preset}) runs from mismatch_ctrl on "
                              f"verl's driver (verl 0.9.1 cannot express it), and {RC} sets verl's own correction "
                              f"too: set {RC}.rollout_is=null {RC}.rollout_rs=null")
    elif config.correction.active:
        if given is None or not all(_same(given[k], v) for k, v in wanted.items()):
            raise ConfigError(f"mismatch_ctrl.correction ({config.correction_preset}) is computed by verl itself, "
                              f"from its own {RC} keys, which do not say so (they hold {brief(given, 200)}): add "
                              f"{overrides(wanted)}")
    if config.torch_compile:
        log.warning("mismatch_ctrl.torch_compile: only slime's rollout-correction hook compiles; ignored on verl")


def check_version(version: str) -> str | None:
    """The warning for a verl other than the one the adapter was tested against (None for that one)."""
    if version == VERL_VERSION:
        return None
    return (f"mismatch_ctrl: verl {version} is installed; the verl adapter was read from and tested against verl "
            f"{VERL_VERSION} (it overrides methods of verl's trainer, which change between releases): pin "
            f"verl=={VERL_VERSION}, or rerun tests/verl against this version")

