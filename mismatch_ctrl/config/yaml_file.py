"""The method YAML read strictly: duplicate keys (a second ``<<`` and merged mappings that disagree included),
base-60 and leading-zero (octal) numbers, numbers that underflow to 0 and absurd sizes are refused with
:class:`~mismatch_ctrl.errors.ConfigError` naming the file (PyYAML would read each without a word)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from .. import regular_files
from ..errors import ConfigError
from ..formatting import brief, clip

MAX_CONFIG_BYTES = 1 << 20
"""A method YAML is a few hundred bytes; anything over 1 MiB is not one (and ``/dev/zero`` must not hang)."""


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing duplicate mapping keys (PyYAML keeps the last one without a word)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, tuple[int, int]] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # '<<: *base' may be overridden by the keys next to it,
                self._refuse_merge_conflicts(value_node, deep)  # but not by another merged mapping
                key: Any = "<<"
            else:
                key = self.construct_object(key_node, deep=deep)
            where = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            try:
                first = seen.setdefault(key, where)
            except TypeError:
                continue  # an unhashable key: the base class reports it
            if first != where:  # block style (another line) or flow style ({a: 1, a: 2}: the same line)
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {brief(key)} (first on line {first[0]}, column {first[1]}); keep one "
                                "of them", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)

    def _refuse_merge_conflicts(self, value_node: yaml.Node, deep: bool) -> None:
        """``<<: [*a, *b]`` where ``a`` and ``b`` give one key different values: YAML keeps the first without a word."""
        if not isinstance(value_node, yaml.SequenceNode):
            return
        first: dict[Any, Any] = {}
        for source in value_node.value:
            if not isinstance(source, yaml.MappingNode):
                return  # the base class reports it
            for key_node, item_node in source.value:
                key, value = self.construct_object(key_node, deep=True), self.construct_object(item_node, deep=True)
                try:
                    earlier = first.setdefault(key, value)
                except TypeError:
                    continue
                if earlier != value:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {brief(key)} in the merged mappings ({brief(earlier)} and "
                                    f"{brief(value)}; YAML would keep the first without a word): keep one of them, or "
                                    "set the key beside '<<'", source.start_mark)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        self._refuse_base_60(node)
        digits = node.value.replace("_", "").lstrip("+-")
        if len(digits) > 1 and digits[0] == "0" and digits.isdigit():
            raise yaml.constructor.ConstructorError(
                None, None, f"{node.value} is an octal number in YAML 1.1 (read as "
                            f"{super().construct_yaml_int(node)}); "
                            "write it without the leading zero", node.start_mark)
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
