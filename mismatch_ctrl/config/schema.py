"""The resolved configuration (:class:`Config`) and how it is built from the ``mismatch_ctrl:`` section: schema
defaults < ``configs/arch/<architecture>.yaml`` < the user's YAML; the correction preset expanded with its overrides;
combinations that cannot run refused."""

from __future__ import annotations

import dataclasses
import unicodedata
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Mapping, Union

import yaml

from ..acrl import ACRLSettings
from ..architecture import Architecture, resolve_architecture
from ..batch import NonFinitePolicy
from ..correction import CorrectionSpec
from ..dcgrpo import DCGRPOSettings
from ..errors import ConfigError
from ..formatting import brief
from ..lr_schedule import LengthDecaySettings
from ..presets import FIELD_ALIASES, PRESET_ALIASES, PRESETS, SLIME_MIS_KEYS, canonical_preset, from_slime_mis
from ..verl_vocabulary import VERL_KEYS, from_verl_keys
from .coerce import build_section, coerce, reject_unknown
from .yaml_file import read_yaml

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


def load_config(path: str | Path, **resolve: Any) -> Config:
    """Read a YAML file with a top-level ``mismatch_ctrl:`` key and build its :class:`Config` (:func:`build_config`)."""
    document = read_yaml(path)
    if not isinstance(document, dict) or ROOT_KEY not in document:
        raise ConfigError(f"{path}: no top-level '{ROOT_KEY}:' key; mismatch_ctrl reads only that key "
                          f"(see configs/methods/ for examples)")
    section = required_section(document[ROOT_KEY], f"{path}: ", misplaced_keys(document))
    refuse_misplaced(document, f"{path}: ")
    return build_config(section, **resolve)


def misplaced_keys(document: Mapping[Any, Any]) -> list[str]:
    """mismatch_ctrl's own keys (``dcgrpo``, ``correction``, ``name``, ...) written at the top level of the YAML,
    beside ``mismatch_ctrl:`` instead of under it, in any case and with lookalike letters (``Dcgrpo``, a Cyrillic
    ``о``, full-width letters): slime's own keys are ASCII, so such a key is ours, misspelt."""
    ours = {_skeleton(key): key for key in TOP_LEVEL_KEYS}
    return [str(key) for key in document if key != ROOT_KEY and _skeleton(str(key)) in ours]


_LOOKALIKES = str.maketrans("аесіјоргхуѕԁһкмтвн", "aecijoprxysdhkmtbh")
"""Cyrillic letters that look like Latin ones (the key a keyboard layout or a copy from a web page gives)."""


def _skeleton(key: str) -> str:
    """``key`` folded for comparison: NFKC (full-width letters), case-folded, Cyrillic lookalikes made Latin."""
    return unicodedata.normalize("NFKC", key).casefold().translate(_LOOKALIKES)


def refuse_misplaced(document: Mapping[Any, Any], where: str = "") -> None:
    """:class:`ConfigError` when the YAML has :func:`misplaced_keys`: slime merges every top-level key into its
    ``args`` (SLIME.md section 3), where mismatch_ctrl never reads them, so a block indented one level too little
    would be ignored without a word (``dcgrpo: {enabled: true}`` beside ``mismatch_ctrl:`` trains plain GRPO).
    One rule for check-config, the launchers' ``--dry-run`` (which runs it) and ``on_megatron_init``."""
    keys = misplaced_keys(document)
    if keys:
        them = "it" if len(keys) == 1 else "them"
        raise ConfigError(f"{where}{', '.join(keys)}: mismatch_ctrl's own {'key' if len(keys) == 1 else 'keys'} at the "
                          f"top level of the YAML, beside '{ROOT_KEY}:'; slime would merge {them} into its args, where "
                          f"nothing reads {them}: indent {them} under '{ROOT_KEY}:'")


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
    reject_unknown(section, TOP_LEVEL_KEYS, ROOT_KEY)
    arch = coerce(Union[Architecture, Literal["auto"], None], section.get("architecture"), f"{ROOT_KEY}.architecture")
    if arch in (None, "auto"):
        arch = resolve_architecture(architecture=architecture, num_experts=num_experts, hf_config=hf_config)
    if arch is not None:
        section = merge_sections(arch_defaults(arch), section)
    values: dict[str, Any] = {"architecture": arch}
    for key, tp in (("name", str), ("nonfinite", NonFinitePolicy), ("torch_compile", bool)):
        if section.get(key) is not None:
            values[key] = coerce(tp, section[key], f"{ROOT_KEY}.{key}")
    if not values.get("name", "custom").strip():
        raise ConfigError(f"{ROOT_KEY}.name: give the method a name (it labels the logs and the state), got "
                          f"{brief(values['name'])}")
    for key, cls in SECTIONS.items():
        values[key] = build_section(cls, _or_empty(section.get(key)), f"{ROOT_KEY}.{key}")
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
    fields = from_verl_keys(fields, path)
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
    return preset, build_section(CorrectionSpec, fields, path, base=PRESETS[preset],
                                 extra_keys=("preset", *FIELD_ALIASES, *SLIME_MIS_KEYS, *VERL_KEYS), names=names)


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
        from ..compiled import missing_support

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


def merge_sections(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge; ``None`` in ``override`` keeps the base value (``eps: null`` means "the default")."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_sections(out[key], value)
        elif value is not None or key not in out:
            out[key] = value
    return out
