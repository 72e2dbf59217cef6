"""The one validated configuration: the ``mismatch_ctrl:`` key of the YAML passed with ``--custom-config-path``.

Layers, later wins: schema defaults < ``configs/arch/<architecture>.yaml`` < the user's YAML. The architecture comes
from ``mismatch_ctrl.architecture`` (``dense`` / ``moe``), else from the caller (Megatron's ``num_experts`` or a
Hugging Face ``config.json``). Unknown keys, wrong types and impossible values raise :class:`ConfigError` naming the
key and the fix (the bad value shown bounded in length). Floats written ``1e-4`` (which PyYAML reads as a string) are
accepted; duplicate YAML keys, which PyYAML would silently resolve to the last one, are an error.
"""

from ..architecture import resolve_architecture
from .inert import EPS_AUTO_FACTOR_WARN, inert_settings
from .schema import (ROOT_KEY, SECTIONS, TOP_LEVEL_KEYS, Config, StateSettings, arch_defaults, build_config,
                     load_config, merge_sections, misplaced_keys, refuse_misplaced, required_section)
from .yaml_file import MAX_CONFIG_BYTES, read_yaml

__all__ = ["EPS_AUTO_FACTOR_WARN", "MAX_CONFIG_BYTES", "ROOT_KEY", "SECTIONS", "TOP_LEVEL_KEYS", "Config",
           "StateSettings", "arch_defaults", "build_config", "inert_settings", "load_config", "merge_sections",
           "misplaced_keys", "read_yaml", "refuse_misplaced", "required_section", "resolve_architecture"]
