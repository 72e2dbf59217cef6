"""The one validated configuration: the ``mismatch_ctrl:`` key of the YAML passed with ``--custom-config-path``.

Layers, later wins: schema defaults < ``configs/arch/<architecture>.yaml`` < the user's YAML. The architecture comes
from ``mismatch_ctrl.architecture`` (``dense`` / ``moe``), else from the caller (Megatron's ``num_experts`` or a
Hugging Face ``config.json``). Unknown keys, wrong types and impossible values raise :class:`ConfigError` naming the
key and the fix (the bad value shown bounded in length). Floats written ``1e-4`` (which PyYAML reads as a string) are
accepted; duplicate YAML keys, which PyYAML would silently resolve to the last one, are an error.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Mapping, Union

import yaml

from . import regular_files
from .acrl import ACRLSettings
from .architecture import Architecture, resolve_architecture
from .batch import LOG_RATIO_BOUND, NonFinitePolicy
from .correction import CorrectionSpec
from .dcgrpo import DCGRPOSettings
from .errors import ConfigError
from .formatting import brief, clip
from .lr_schedule import LengthDecaySettings
from .presets import FIELD_ALIASES, PRESET_ALIASES, PRESETS, SLIME_MIS_KEYS, canonical_preset, from_slime_mis

ROOT_KEY = "mismatch_ctrl"


@dataclass(frozen=True)
class StateSettings:
    """The ``state:`` section: controller state files in ``{args.save}/mismatch_ctrl/``. ``resume: fresh`` starts
    the controllers from their initial values when a resumed checkpoint has no state file (default: an error)."""

    keep_last: int = 3
    resume: Literal["require", "fresh"] = "require"

    def problems(self) -> list[tuple[str, str]]:
        """(key, message) pairs for every invalid value; the config loader raises on the first."""
        return [("keep_last", f"must be >= 1, got {self.keep_last}")] if self.keep_last < 1 else []


@dataclass(frozen=True)
class Config:
    """The resolved configuration every adapter reads. ``correction`` is the preset expanded with overrides."""

    name: str = "custom"
    architecture: Architecture | None = None
    nonfinite: NonFinitePolicy = "mask"
    torch_compile: bool = False
    dcgrpo: DCGRPOSettings = field(default_factory=DCGRPOSettings)
    correction_preset: str = "none"
    correction: CorrectionSpec = field(default_factory=CorrectionSpec)
    lr_decay: LengthDecaySettings = field(default_factory=LengthDecaySettings)
    acrl: ACRLSettings = field(default_factory=ACRLSettings)
    state: StateSettings = field(default_factory=StateSettings)

    @property
    def needs_train_log_probs(self) -> bool:
        """Whether the advantage hook needs the training engine's log-probs (slime's ``log_probs``)."""
        return self.dcgrpo.enabled or self.acrl.enabled

    def as_dict(self) -> dict[str, Any]:
        """Plain nested dict of every resolved setting (for logs and ``mismatch-ctrl check-config``)."""
        return dataclasses.asdict(self)


SECTIONS: dict[str, type] = {"dcgrpo": DCGRPOSettings, "lr_decay": LengthDecaySettings, "acrl": ACRLSettings,
                             "state": StateSettings}
TOP_LEVEL_KEYS = ("name", "architecture", "nonfinite", "torch_compile", "correction", *SECTIONS)


MAX_CONFIG_BYTES = 1 << 20
"""A method YAML is a few hundred bytes; anything over 1 MiB is not one (and ``/dev/zero`` must not hang)."""


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing duplicate mapping keys (PyYAML keeps the last one without a word)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # '<<: *base' may be overridden by the keys next to it
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:
                continue  # an unhashable key: the base class reports it
            if first != key_node.start_mark.line + 1:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {brief(key)} (first on line {first}); keep one of them",
                    key_node.start_mark)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        self._refuse_base_60(node)
        try:
            return super().construct_yaml_int(node)
        except ValueError:  # beyond Python's digit limit for int(str): no setting takes such a number
            raise yaml.constructor.ConstructorError(
                None, None, f"an integer of {len(node.value)} characters; no setting takes a number this large: write "
                            "the value the setting needs (a float such as 1e30 where it is a number)",
                node.start_mark) from None

    def construct_yaml_float(self, node: yaml.ScalarNode) -> float:
        self._refuse_base_60(node)
        value = super().construct_yaml_float(node)
        if value == 0.0 and re.search(r"[1-9]", node.value.lower().split("e")[0]):
            raise yaml.constructor.ConstructorError(
                None, None, f"{clip(node.value, 40)} is below the smallest float and would read as 0.0; write a "
                            "larger value (or 0)", node.start_mark)
        return value

    def _refuse_base_60(self, node: yaml.ScalarNode) -> None:
        """YAML 1.1 reads ``1:30`` as the base-60 number 90: no setting means that."""
        if ":" in node.value:
            value = super().construct_yaml_int(node) if node.tag.endswith(":int") else \
                super().construct_yaml_float(node)
            raise yaml.constructor.ConstructorError(
                None, None, f"{node.value} is a base-60 number in YAML 1.1 (read as {value}); write the number itself",
                node.start_mark)


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)
_StrictLoader.add_constructor("tag:yaml.org,2002:float", _StrictLoader.construct_yaml_float)


def read_yaml(path: str | Path) -> Any:
    """The YAML document in ``path`` (duplicate keys refused); :class:`ConfigError` naming the file otherwise."""
    path = Path(path)
    try:
        text = regular_files.read_text(path, MAX_CONFIG_BYTES)  # a FIFO or a device refused, never opened
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except OSError as exc:
        what = "is a directory" if path.is_dir() else exc.strerror or str(exc)
        raise ConfigError(f"{path}: {what}; give the method YAML (e.g. configs/methods/dcgrpo.yaml)") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {clip(str(exc))}") from None
    except (ValueError, RecursionError) as exc:  # a date that is none (2024-13-01), absurd nesting
        raise ConfigError(f"{path}: not valid YAML: {clip(str(exc), 200)}") from None


def load_config(path: str | Path, **resolve: Any) -> Config:
    """Read a YAML file with a top-level ``mismatch_ctrl:`` key and build its :class:`Config` (:func:`build_config`)."""
    document = read_yaml(path)
    if not isinstance(document, dict) or ROOT_KEY not in document:
        raise ConfigError(f"{path}: no top-level '{ROOT_KEY}:' key; mismatch_ctrl reads only that key "
                          f"(see configs/methods/ for examples)")
    siblings = [str(key) for key in document if key != ROOT_KEY and str(key) in TOP_LEVEL_KEYS]
    return build_config(required_section(document[ROOT_KEY], f"{path}: ", siblings), **resolve)


def required_section(section: Any, where: str = "", siblings: list[str] | None = None) -> Mapping[str, Any]:
    """The ``mismatch_ctrl`` section as slime hands it to the hooks (``args.mismatch_ctrl``): a non-empty mapping.
    check-config and ``on_megatron_init`` both check it here, so they refuse the same files."""
    if section is None or (isinstance(section, Mapping) and not section):
        hint = (f" The keys {', '.join(siblings)} are at the top level: indent them under '{ROOT_KEY}:'."
                if siblings else f" Give at least its name, e.g. '{ROOT_KEY}:\\n  name: grpo'.")
        raise ConfigError(f"{where}'{ROOT_KEY}:' is empty: mismatch_ctrl would run with no method.{hint}")
    if not isinstance(section, Mapping):
        raise ConfigError(f"{where}{ROOT_KEY}: expected a mapping of settings (name, dcgrpo, correction, ...), got "
                          f"{type(section).__name__} {brief(section)}")
    return section


def build_config(section: Mapping[str, Any] | None, *, architecture: str | None = None,
                 num_experts: int | None = None, hf_config: str | Path | None = None) -> Config:
    """Validate the ``mismatch_ctrl`` section and fill architecture defaults.

    The architecture is ``section['architecture']`` if set, else ``architecture``, else MoE iff ``num_experts > 0``,
    else read from the Hugging Face ``config.json`` at ``hf_config`` (a file or a model directory).
    """
    if section is not None and not isinstance(section, Mapping):
        raise ConfigError(f"{ROOT_KEY}: expected a mapping of settings (name, dcgrpo, correction, ...), got "
                          f"{type(section).__name__} {brief(section)}")
    section = dict(section or {})
    _reject_unknown(section, TOP_LEVEL_KEYS, ROOT_KEY)
    arch = _coerce(Union[Architecture, Literal["auto"], None], section.get("architecture"), f"{ROOT_KEY}.architecture")
    if arch in (None, "auto"):
        arch = resolve_architecture(architecture=architecture, num_experts=num_experts, hf_config=hf_config)
    if arch is not None:
        section = merge_sections(arch_defaults(arch), section)
    values: dict[str, Any] = {"architecture": arch}
    for key, tp in (("name", str), ("nonfinite", NonFinitePolicy), ("torch_compile", bool)):
        if section.get(key) is not None:
            values[key] = _coerce(tp, section[key], f"{ROOT_KEY}.{key}")
    if not values.get("name", "custom").strip():
        raise ConfigError(f"{ROOT_KEY}.name: give the method a name (it labels the logs and the state), got "
                          f"{brief(values['name'])}")
    for key, cls in SECTIONS.items():
        values[key] = _build(cls, _or_empty(section.get(key)), f"{ROOT_KEY}.{key}")
    correction = _or_empty(section.get("correction"))
    if not isinstance(correction, Mapping):
        raise ConfigError(f"{ROOT_KEY}.correction: expected a mapping (preset: ...), got {brief(correction)}")
    if not isinstance(correction.get("preset", ""), (str, type(None))):
        raise ConfigError(f"{ROOT_KEY}.correction.preset: expected a preset name, got {brief(correction['preset'])}")
    values["correction_preset"], values["correction"] = _build_correction(correction)
    config = Config(**values)
    _check_combination(config)
    return config


def arch_defaults(arch: str) -> dict[str, Any]:
    """The ``mismatch_ctrl`` section of ``configs/arch/<arch>.yaml`` shipped with the package."""
    text = resources.files("mismatch_ctrl").joinpath("configs", "arch", f"{arch}.yaml").read_text()
    return yaml.safe_load(text)[ROOT_KEY]


def _or_empty(value: Any) -> Any:
    """A sub-section as written, ``{}`` when it is empty (``dcgrpo:`` with nothing under it reads as None); any other
    non-mapping (``false``, ``[]``, ``0``) is kept, so the builder refuses it instead of reading it as the defaults."""
    return {} if value is None else value


def _build_correction(section: Mapping[str, Any]) -> tuple[str, CorrectionSpec]:
    path = f"{ROOT_KEY}.correction"
    if not isinstance(section, Mapping):
        raise ConfigError(f"{path}: expected a mapping, got {brief(section)}")
    fields, names = from_slime_mis(section, path)
    preset = fields.pop("preset", "none") or "none"
    try:
        preset = canonical_preset(str(preset))
    except KeyError:
        raise ConfigError(f"{path}.preset: unknown preset {brief(preset)}; choose one of {sorted(PRESETS)} or an "
                          f"alias of slime / verl: {sorted(PRESET_ALIASES)}") from None
    for alias, canonical in FIELD_ALIASES.items():
        if alias in fields:
            if canonical in fields:
                raise ConfigError(f"{path}.{alias}: duplicates {canonical}; keep one of them")
            fields[canonical] = fields.pop(alias)
    return preset, _build(CorrectionSpec, fields, path, base=PRESETS[preset],
                          extra_keys=("preset", *FIELD_ALIASES, *SLIME_MIS_KEYS), names=names)


def _check_combination(config: Config) -> None:
    d = config.dcgrpo
    if d.enabled:
        missing = [k for k in ("lambda_0", "eta", "eps", "lambda_max") if getattr(d, k) is None]
        if missing:
            raise ConfigError(
                f"{ROOT_KEY}.architecture: DC-GRPO needs {', '.join(missing)}; they default per architecture, which "
                "could not be resolved (no expert count: Megatron's --num-experts unset and no --hf-checkpoint "
                "config.json; check-config: no --arch, --num-experts or --hf-config): set architecture: dense or moe "
                "(or give the values in the dcgrpo section)")
    if config.acrl.enabled and config.correction.is_level is not None:
        raise ConfigError(f"{ROOT_KEY}.acrl.enabled: ACRL sets the token IS weights itself; drop the IS stage of "
                          f"correction (preset {config.correction_preset!r}) or disable acrl")
    if config.torch_compile:
        from .compiled import missing_support

        missing = missing_support()
        if missing:
            import torch

            raise ConfigError(f"{ROOT_KEY}.torch_compile: this torch ({torch.__version__}) cannot run the compiled "
                              f"hook: it lacks {', '.join(missing)}; set torch_compile: false, or use a newer torch "
                              "(tested with 2.13)")
    if config.acrl.enabled and config.torch_compile:
        raise ConfigError(f"{ROOT_KEY}.torch_compile: ACRL moves its IS band every rollout, and the compiled TIS hook "
                          "holds the band as constants, so every rollout would compile anew; set torch_compile: false "
                          "or disable acrl")


EPS_AUTO_FACTOR_WARN = 10.0
"""An ``eps_auto_factor`` above this sets a budget a working stack's ``C_bar`` rarely reaches (floors of FP8 MoE
rollouts span about 1e-3 to 2e-2): DC-GRPO would rarely act [ours]."""


def inert_settings(config: Config, num_rollout: int | None = None) -> tuple[list[str], list[str]]:
    """``(errors, warnings)``: settings that would leave a controller or a guard inert, over a run of ``num_rollout``
    rollouts when given. An error is a controller that would never act (DC-GRPO calibrating ``eps: auto`` for the
    whole run or fixed at ``lambda_0 = 0``, ACRL measuring its reference for the whole run, with a band fixed at
    ``c_min = c_max`` or a reference no ``D`` can exceed); a warning a guard or schedule that could not or would
    rarely act (the infeasible-budget guard's floor window, the drift guard's streak or, under ``penalty_form:
    fixed``, any drift guard, the LR decay's period or the surge detector's windows, an ``eps_auto_factor`` far above
    the floor). One rule for ``mismatch-ctrl check-config``, the launchers' ``--dry-run`` and slime's
    ``on_megatron_init``, so the first two refuse what the third would, before a cluster starts. (Values that are
    never valid, an ``eps_auto_factor`` at or below 1 among them, are refused when the config is read.)"""
    errors, warnings = [], []
    d, a, decay = config.dcgrpo, config.acrl, config.lr_decay
    fixed, auto = d.penalty_form == "fixed", d.eps == "auto"
    factor_used = not fixed and (auto or d.eps_guard == "clamp" or d.drift_guard != "off")
    if d.enabled and factor_used and d.eps_auto_factor > EPS_AUTO_FACTOR_WARN:
        warnings.append(f"{ROOT_KEY}.dcgrpo.eps_auto_factor = {d.eps_auto_factor:g}: eps is set to that many times the "
                        f"measured floor (eps: auto, the floor guard, the drift guard); above {EPS_AUTO_FACTOR_WARN:g} "
                        "C_bar rarely reaches the budget and DC-GRPO rarely acts (the default is 1.1)")
    if d.enabled and fixed and d.lambda_0 == 0:
        errors.append(f"{ROOT_KEY}.dcgrpo.lambda_0 = 0 with penalty_form: fixed: the penalty is lambda_0 c and lambda "
                      "never moves, so DC-GRPO would never shape an advantage; give lambda_0 a value > 0 or another "
                      "penalty_form")
    if d.enabled and fixed and d.drift_guard != "off":
        warnings.append(f"{ROOT_KEY}.dcgrpo.drift_guard = {d.drift_guard} with penalty_form: fixed: there is no dual "
                        "update, so the drift guard never acts (drift_guard: off to say so)")
    if a.enabled and a.c_min == a.c_max:
        errors.append(f"{ROOT_KEY}.acrl.c_min = c_max = {a.c_max:g}: the band [1 / (1 + c), 1 + c] is fixed and ACRL "
                      "would never move it; widen [c_min, c_max] or use a token IS preset (correction.preset: "
                      "token_tis) for a fixed clip")
    if a.enabled and a.reference is not None and a.band_high * a.reference >= LOG_RATIO_BOUND:
        errors.append(f"{ROOT_KEY}.acrl.reference = {a.reference:g}: D, the median per-sequence mean |log-ratio|, "
                      f"never exceeds {LOG_RATIO_BOUND:g} (log-ratios are clamped there), so it never rises above "
                      f"band_high x reference = {a.band_high * a.reference:g} and ACRL could only widen its band; give "
                      "a D measured in a run (rollout/mismatch_ctrl/acrl_discrepancy) or null to calibrate it")
    if num_rollout is None:
        return errors, warnings
    run = f"--num-rollout is {num_rollout}"
    if d.enabled and auto and d.calibration_rollouts >= num_rollout:
        errors.append(f"{ROOT_KEY}.dcgrpo.calibration_rollouts = {d.calibration_rollouts} with eps: auto, but "
                      f"{run}: DC-GRPO would calibrate for the whole run and never shape an advantage; lower "
                      "calibration_rollouts or give eps a number")
    elif d.enabled and not fixed:
        if not auto and d.eps_guard == "clamp" and d.floor_rollouts >= num_rollout:
            warnings.append(f"{ROOT_KEY}.dcgrpo.floor_rollouts = {d.floor_rollouts} but {run}: the infeasible-budget "
                            "guard would never measure the floor it checks eps against")
        start = d.calibration_rollouts if auto else 0
        if d.drift_guard != "off" and start < num_rollout <= start + d.drift_window:
            warnings.append(f"{ROOT_KEY}.dcgrpo.drift_window = {d.drift_window} but {run}"
                            f"{f' and eps: auto calibrates for {start}' if auto else ''}: the drift guard could never "
                            "complete a streak (lower drift_window, or drift_guard: off to say so)")
    if a.enabled and a.reference is None and a.calibration_rollouts >= num_rollout:
        errors.append(f"{ROOT_KEY}.acrl.calibration_rollouts = {a.calibration_rollouts} without a reference, but "
                      f"{run}: ACRL would measure its reference for the whole run and never move its band; lower "
                      "calibration_rollouts or give acrl.reference")
    if decay.enabled and isinstance(decay.period, int) and decay.period >= num_rollout:
        warnings.append(f"{ROOT_KEY}.lr_decay.period = {decay.period} but {run}: the learning rate never halves in "
                        "this run")
    elif decay.enabled and decay.period == "auto" and decay.surge.first_trigger() >= num_rollout:
        warnings.append(f"{ROOT_KEY}.lr_decay.surge: the detector needs {decay.surge.first_trigger() + 1} rollouts "
                        f"(baseline_window + gap + consecutive, or warmup + consecutive) before it can trigger, but "
                        f"{run}: with period: auto the learning rate never halves in this run (shorten the surge "
                        "windows or give period a number)")
    return errors, warnings


def merge_sections(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge; ``None`` in ``override`` keeps the base value (``eps: null`` means "the default")."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_sections(out[key], value)
        elif value is not None or key not in out:
            out[key] = value
    return out


def _reject_unknown(data: Mapping[str, Any], known: tuple[str, ...], path: str) -> None:
    for key in data:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(f"{path}.{clip(str(key), 60)}: unknown key; {hint}valid keys: {', '.join(known)}")


def _build(cls: type, data: Any, path: str, base: Any = None, extra_keys: tuple[str, ...] = (),
           names: Mapping[str, str] | None = None) -> Any:
    """``cls`` from ``data`` over ``base``; the first of its ``problems()`` raised. ``names``: the key the user wrote
    for each field (slime's mis.yaml vocabulary), used for the field in the error's path and its message."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a mapping of keys, got {brief(data)}")
    hints = typing.get_type_hints(cls)
    fields = tuple(f.name for f in dataclasses.fields(cls))
    _reject_unknown(data, fields + extra_keys, path)
    values = {k: _coerce(hints[k], v, f"{path}.{k}") for k, v in data.items() if k in fields}
    obj = dataclasses.replace(base, **values) if base is not None else cls(**values)
    for key, message in obj.problems() if hasattr(obj, "problems") else ():
        if names:
            key = names.get(key, key)
            message = re.sub(r"\b(" + "|".join(map(re.escape, names)) + r")\b",
                             lambda m: names[m.group(1)].split(" (")[0], message)
        raise ConfigError(f"{path}.{key}: {message}")
    return obj


def _describe(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string", type(None): "null"}.get(
        tp, getattr(tp, "__name__", str(tp)))


_INT_MAX = 2**63 - 1
"""The largest integer setting: counts of rollouts or files, reported as float metrics and stored as JSON numbers."""
_FLOAT_MAX = 1.7976931348623157e308
"""The largest finite float: an integer above it (a YAML number of 309 digits) is read as infinite, not an overflow."""

YAML_SWITCHES = {False: "off", True: "on"}
"""What a setting whose values include ``off`` (``eps_guard``, ``drift_guard``) reads from YAML's bare ``off``."""


class _NumberOutOfRange(ConfigError):
    """A number that is NaN or infinite, or an integer beyond 64 bits: reported as such, not as a type mismatch of a
    union's other options."""


def _coerce(tp: Any, value: Any, path: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value if value is not None else {}, path)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for option in args:
            if option is type(None):
                continue
            try:
                return _coerce(option, value, path)
            except _NumberOutOfRange:
                raise
            except ConfigError:
                continue
    elif origin is Literal:
        if isinstance(value, bool) and YAML_SWITCHES[value] in args:  # YAML 1.1 reads a bare off / on as a boolean
            return YAML_SWITCHES[value]
        if value in args:
            return value
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if abs(value) > _INT_MAX:
                raise _NumberOutOfRange(f"{path}: must be an integer of at most 64 bits (|value| < 2^63), got "
                                        f"{brief(value)}")
            return value
    elif tp is float:
        number = value
        if isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                number = None
        if isinstance(number, (int, float)) and not isinstance(number, bool):
            if isinstance(number, int) and abs(number) > _FLOAT_MAX:  # an integer beyond float range
                number = math.inf if number > 0 else -math.inf
            if not math.isfinite(number):
                raise _NumberOutOfRange(f"{path}: must be a finite number, got {brief(value)}")
            return float(number)
    elif tp is str:
        if isinstance(value, str):
            return value
    raise ConfigError(f"{path}: expected {_describe(tp)}, got {brief(value)}")
