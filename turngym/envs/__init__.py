"""Environments: the ``TextEnv`` contract, the registry, and one subpackage per family.

Importing a family subpackage registers its env ids; the entry points are strings, so
heavy dependencies (textworld, docker, ...) load only when an env is made.
"""

import importlib
import importlib.util

from turngym.envs.base import StepOutcome, TextEnv
from turngym.envs.registry import describe, list_envs, make, register
from turngym.envs.spaces import MessageSpace, UtteranceSpace

BUILTIN_FAMILIES = ("textworld", "sql", "search", "games", "swe", "alfworld")

for _family in BUILTIN_FAMILIES:
    if importlib.util.find_spec(f"turngym.envs.{_family}") is not None:
        importlib.import_module(f"turngym.envs.{_family}")

import turngym.envs.wrappers  # noqa: E402,F401  (registers the *-shaped-v0 variants)

__all__ = ["TextEnv", "StepOutcome", "MessageSpace", "UtteranceSpace", "register", "make", "describe", "list_envs"]
