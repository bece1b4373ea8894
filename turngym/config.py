"""Config dataclasses from YAML and command-line overrides.

Every config is a dataclass whose defaults run. YAML and ``--set a.b=value`` only override
fields; an unknown key is an error naming the valid ones. Cross-field checks live in each
config's ``__post_init__``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


def knob(default: Any, help: str) -> Any:
    """A dataclass field with a one-line help (mutable defaults are copied per instance; a nested
    config given as a zero-argument callable is built per instance)."""
    if callable(default) and (not isinstance(default, type) or dataclasses.is_dataclass(default)):
        return dataclasses.field(default_factory=default, metadata={"help": help})
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
    # a config may reconcile its sections before they are built (e.g. the top-level algo names pg.algo)
    prepare = getattr(cls, "prepare_fields", None)
    if prepare is not None:
        data = prepare(dict(data))
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"unknown config key(s) {unknown} in {where or cls.__name__}; valid keys: {sorted(names)}")
    kwargs = {}
    defaults = {f.name: f for f in dataclasses.fields(cls)}
    for key, value in data.items():
        tp = hints[key]
        if dataclasses.is_dataclass(tp) and isinstance(value, dict):
            # a nested section overrides the parent's default for it, field by field
            base = _default_of(defaults[key])
            merged = {**(dataclasses.asdict(base) if base is not None else {}), **value}
            value = from_dict(tp, merged, f"{where}{key}.")
        kwargs[key] = _coerce(value, tp, f"{where}{key}")
    try:
        return cls(**kwargs)
    except ValueError as e:  # a section's own check: say which section, e.g. "sft: epochs must be >= 0"
        if not where:
            raise
        raise ValueError(f"{where.rstrip('.')}: {e}") from e


def _coerce(value: Any, tp: Any, name: str) -> Any:
    """Convert a YAML scalar to the field's number type: YAML reads ``1e-4`` as a string (it wants
    ``1.0e-4``) and ``1`` as an int, and both are common in configs and ``--set`` overrides.

    Raises:
        ValueError: a string that is not a number, for a number field.
    """
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        if value is None:
            return None
        tp = next((a for a in typing.get_args(tp) if a is not type(None)), tp)
    if isinstance(value, bool) or tp not in (int, float):
        return value
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ValueError(f"{name}: expected a number, got {value!r}") from None
    if tp is float and isinstance(value, int):
        return float(value)
    if tp is int and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return None


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


def describe(cfg: Any) -> str:
    """Every field of a config (class or instance) with its value and help, one per line."""
    inst = cfg() if isinstance(cfg, type) else cfg
    lines = []
    for f in dataclasses.fields(inst):
        value = getattr(inst, f.name)
        if dataclasses.is_dataclass(value):
            lines.append(f"{f.name}:  # {f.metadata.get('help', '')}")
            lines += ["  " + ln for ln in describe(value).splitlines()]
        else:
            lines.append(f"{f.name} = {value!r}  # {f.metadata.get('help', '')}")
    return "\n".join(lines)


def default_value(cls: type, name: str) -> Any:
    """The default of field ``name`` of config class ``cls``."""
    return _default_of(next(f for f in dataclasses.fields(cls) if f.name == name))


def refuse_unless(cfg: Any, name: str, read: bool, when: str) -> None:
    """A knob set away from its default where nothing reads it is an error that names it: a knob
    read by nothing would let a run look configured when it is not.

    Args:
        cfg: A config instance.
        name: The knob.
        read: Whether this configuration reads it.
        when: What makes it read, for the message (e.g. ``"with trainable=lora"``).

    Raises:
        ValueError: ``cfg.name`` differs from its default and ``read`` is False.
    """
    default = default_value(type(cfg), name)
    if not read and getattr(cfg, name) != default:
        raise ValueError(f"{name}={getattr(cfg, name)!r} is read only {when}; leave it at {default!r} or set that")


def seed_of(cfg: Any) -> int:
    """A section's seed: its own, or 0 when it is None (``turngym train`` gives every section the
    run's seed unless it set its own)."""
    return 0 if cfg.seed is None else int(cfg.seed)
