"""Config dataclasses from YAML and command-line overrides.

Every config is a dataclass whose defaults run. YAML and ``--set a.b=value`` only override
fields; an unknown key is an error naming the valid ones. Cross-field checks live in each
config's ``__post_init__``.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


def knob(default: Any, help: str) -> Any:
    """A dataclass field with a one-line help (mutable defaults are copied per instance)."""
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return dataclasses.field(default=default, metadata={"help": help})


def from_dict(cls: type[T], data: dict[str, Any], where: str = "") -> T:
    """Build ``cls`` from a dict, recursing into nested config dataclasses.

    Raises:
        ValueError: ``data`` has a key that is not a field of ``cls``.
    """
    if not isinstance(data, dict):
        raise ValueError(f"{where or cls.__name__}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"unknown config key(s) {unknown} in {where or cls.__name__}; valid keys: {sorted(names)}")
    kwargs = {}
    for key, value in data.items():
        tp = hints[key]
        if dataclasses.is_dataclass(tp) and isinstance(value, dict):
            value = from_dict(tp, value, f"{where}{key}.")
        kwargs[key] = value
    return cls(**kwargs)


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def load_yaml(cls: type[T], path: str | Path) -> T:
    """Read a YAML file into ``cls`` (missing keys keep their defaults)."""
    data = yaml.safe_load(Path(path).read_text()) or {}
    return from_dict(cls, data, where=f"{path}: ")


def apply_overrides(cfg: T, overrides: list[str]) -> T:
    """Apply ``["sft.epochs=2", "archer.actor_lr=1e-5"]`` (values parsed as YAML) and re-validate.

    Raises:
        ValueError: a path that names no field, or a malformed override.
    """
    data = to_dict(cfg)
    for item in overrides:
        path, sep, raw = item.partition("=")
        if not sep:
            raise ValueError(f"override {item!r} must look like key.sub=value")
        node = data
        keys = path.strip().split(".")
        for k in keys[:-1]:
            if not isinstance(node.get(k), dict):
                raise ValueError(f"override {item!r}: {k!r} is not a config section")
            node = node[k]
        if keys[-1] not in node:
            raise ValueError(f"override {item!r}: no field {keys[-1]!r}; valid: {sorted(node)}")
        node[keys[-1]] = yaml.safe_load(raw)
    return from_dict(type(cfg), data)


def describe(cls: type) -> str:
    """Every field with its default and help, one per line (for ``--help``-style listings)."""
    lines = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        if dataclasses.is_dataclass(hints[f.name]):
            lines.append(f"{f.name}:  # {f.metadata.get('help', '')}")
            lines += ["  " + ln for ln in describe(hints[f.name]).splitlines()]
        else:
            lines.append(f"{f.name} = {default!r}  # {f.metadata.get('help', '')}")
    return "\n".join(lines)
