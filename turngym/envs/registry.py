"""Register and make turngym environments through Gymnasium's registry.

``turngym.register("turngym/Name-v0", entry_point="pkg.mod:Class", max_turns=30)`` puts the env
in Gymnasium's registry (so ``gymnasium.make`` finds it) and records a one-line description for
``turngym envs``. Entry points are strings, so registering imports nothing heavy.

Every env made from the registry runs behind a step deadline (``turngym.envs.deadline.StepDeadline``,
the innermost wrapper): a step past it is truncated with the reason and the env is rebuilt from
the same entry point and kwargs. A new env gets it by registering; nothing to write.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

_DESCRIPTIONS: dict[str, str] = {}


class DeadlineEntry:
    """An entry point that builds the env from ``target`` and wraps it in ``StepDeadline``, which
    rebuilds it from the same kwargs when a step misses its deadline (picklable)."""

    def __init__(self, target: str | Any) -> None:
        self.target = target

    def creator(self) -> Any:
        return self.target if callable(self.target) else load_env_creator(self.target)

    def __call__(self, **kwargs: Any) -> gym.Env:
        from turngym.envs.deadline import StepDeadline

        creator = self.creator()
        return StepDeadline(creator(**kwargs), factory=lambda: creator(**kwargs))

    def __repr__(self) -> str:
        return f"DeadlineEntry({self.target!r})"


def raw_entry_point(spec: gym.envs.registration.EnvSpec) -> Any:
    """The creator a spec's entry point stands for, without the step deadline around it."""
    ep = spec.entry_point
    if isinstance(ep, DeadlineEntry):
        return ep.creator()
    return ep if callable(ep) else load_env_creator(ep)


def register(
    id: str,
    entry_point: str | Any,
    *,
    kwargs: dict[str, Any] | None = None,
    max_turns: int | None = None,
    description: str = "",
    nondeterministic: bool = False,
) -> None:
    """Register an environment.

    Args:
        id: Versioned id, ``"namespace/Name-vN"``; bump N when behaviour changes.
        entry_point: ``"package.module:ClassName"`` or the class itself.
        kwargs: Constructor defaults; ``make(id, **overrides)`` overrides them.
        max_turns: Episodes are truncated after this many agent turns.
        description: One line for ``turngym envs`` (defaults to the class docstring's first line).
        nondeterministic: The env cannot replay exactly under a seed (e.g. an LLM answers in it).

    The env is made behind a step deadline (see the module docstring): the env's
    ``step_deadline_s`` attribute, or ``DEFAULT_STEP_DEADLINE_S``.
    """
    gym.register(
        id=id,
        entry_point=entry_point if isinstance(entry_point, DeadlineEntry) else DeadlineEntry(entry_point),
        max_episode_steps=max_turns,
        kwargs=dict(kwargs or {}),
        nondeterministic=nondeterministic,
    )
    _DESCRIPTIONS[id] = description


def make(id: str, *, max_turns: int | None = None, **kwargs: Any) -> gym.Env:
    """Create a registered env; ``kwargs`` override the registered constructor defaults.

    Args:
        id: A registered id such as ``"turngym/TextWorld-easy-v0"``.
        max_turns: Override the registered turn limit.

    Raises:
        gymnasium.error.NameNotFound / VersionNotFound: no such id (the message lists near matches).
    """
    if max_turns is not None:
        kwargs["max_episode_steps"] = max_turns
    return gym.make(id, **kwargs)


def describe(id: str) -> str:
    """The one-line description of a registered env."""
    if _DESCRIPTIONS.get(id):
        return _DESCRIPTIONS[id]
    ep = gym.spec(id).entry_point
    ep = ep.target if isinstance(ep, DeadlineEntry) else ep
    if isinstance(ep, str):
        mod, _, name = ep.partition(":")
        try:
            ep = getattr(importlib.import_module(mod), name)
        except Exception as e:  # a missing optional extra should not break the listing
            return f"(cannot import {mod}: {type(e).__name__})"
    doc = (getattr(ep, "__doc__", None) or "").strip()
    return doc.splitlines()[0] if doc else ""


def list_envs(namespace: str | None = None) -> dict[str, str]:
    """Ids registered through turngym (optionally one namespace), each with its description."""
    ids = sorted(i for i in _DESCRIPTIONS if namespace is None or i.startswith(namespace + "/"))
    return {i: describe(i) for i in ids}


def resolve_env_id(spec: str) -> str:
    """The env id of ``spec``, importing the module that registers it first.

    ``"pkg.module:ns/Name-v0"`` imports ``pkg.module`` (searching the current folder too, as
    ``python -m`` would) and returns ``"ns/Name-v0"``; a plain id is returned as it is. Either way
    the id must then be registered.

    Raises:
        ValueError: The module cannot be imported, or the id is not registered; the message says
            how to fix it.
    """
    module, sep, env_id = spec.rpartition(":")
    if sep:
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.append(os.getcwd())  # after the installed packages: a local file never shadows one
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ValueError(f"cannot import {module!r} for env {env_id!r} ({type(e).__name__}: {e}); run from the "
                             f"folder that holds {module.split('.')[0]!r}, or put it on PYTHONPATH") from e
    try:
        gym.spec(env_id)
    except gym.error.Error as e:
        if sep:
            hint = f"; {module} did not register it"
        elif not env_id.startswith("turngym/"):
            hint = f"; if your module registers it, name the module too: --env your_package.your_module:{env_id}"
        else:
            hint = ""
        raise ValueError(f"unknown env id {env_id!r} ({e}); `turngym envs` lists the registered ones{hint}") from e
    return env_id
