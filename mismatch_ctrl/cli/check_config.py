"""``mismatch-ctrl check-config``: a method YAML validated as the hooks will read it."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from ..errors import ConfigError


def check_config_command(ns: argparse.Namespace) -> int:
    """Validate for the architecture given, else for each one (the YAML may set it): what resolves, per key; then
    the settings that would leave a controller or guard inert (over ``--num-rollout`` rollouts when given): the
    errors the hook's init would raise exit 2, the warnings it would log are printed."""
    from ..config import inert_settings, load_config

    given = ns.arch is not None or ns.num_experts is not None or ns.hf_config is not None
    try:
        configs = ([load_config(ns.path, architecture=ns.arch, num_experts=ns.num_experts, hf_config=ns.hf_config)]
                   if given else [load_config(ns.path, architecture=arch) for arch in ("dense", "moe")])
    except ConfigError as exc:
        print(f"mismatch-ctrl check-config: {exc}", file=sys.stderr)
        return 2
    if not given and configs[0] == configs[1]:
        configs = configs[:1]  # the YAML sets its architecture
    elif not given and not configs[0].dcgrpo.enabled:
        configs = [dataclasses.replace(configs[0], architecture=None)]  # only DC-GRPO's defaults depend on it
    found = [inert_settings(config, ns.num_rollout) for config in configs]
    errors, warnings = (list(dict.fromkeys(m for pair in found for m in pair[k])) for k in (0, 1))
    for warning in warnings:
        print(f"mismatch-ctrl check-config: warning: {warning}", file=sys.stderr)
    if errors:
        print(f"mismatch-ctrl check-config: {errors[0]}", file=sys.stderr)
        return 2
    if ns.json:
        print(json.dumps(configs[0].as_dict() if given else {c.architecture or "any": c.as_dict() for c in configs},
                         indent=1))
        return 0
    for config in configs:
        where = "" if given or len(configs) == 1 else " (no --arch / --num-experts / --hf-config: each architecture)"
        print(f"{ns.path}: OK (method {config.name!r}, architecture {config.architecture or 'any'}){where}")
        if config.dcgrpo.enabled:
            print("dcgrpo:\n" + "\n".join(f"  {line}" for line in config.dcgrpo.explain()))
        if config.correction.active:
            preset = f" (preset {config.correction_preset!r})" if config.correction_preset != "none" else ""
            print(f"correction{preset}:\n" +
                  "\n".join(f"  {line}" for line in config.correction.explain()))
        if config.torch_compile:
            print("torch_compile: true (the TIS hook's device work runs as one compiled graph; docs/performance.md)")
    return 0
