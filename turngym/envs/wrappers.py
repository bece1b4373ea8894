"""Wrappers shared by every env family: step deadlines, reward shaping and reference tool calls.

Behaviour shared by many envs is a wrapper, not a flag on every env (STYLE 12):

- ``StepDeadline`` runs each step on a thread of its own and waits at most the step's deadline.
  A late step is truncated (``info["truncated_reason"]``) and the env is rebuilt; the registry
  puts it around every registered env.

- ``ShapedReward`` adds the gameable step reward of ``turngym.envs.shaping`` to the env's reward
  (``valid_call``: a bonus for every accepted action; ``new_observation``: a bonus for every
  observation not seen before in the episode; ``new_state``: a bonus for every env state not visited
  before in the episode). ``info["shaped_bonus"]`` holds the bonus and
  ``info["env_reward"]`` the env's own reward.
- ``ReferenceCalls`` puts the env's oracle move, parsed into calls, in ``info["reference_calls"]``
  of each step, where ``turngym.rewards.ToolUseReward`` reads it.

Shaped variants of the TextWorld and SQL envs are registered when this module is imported, as
``turngym/TextWorld-easy-shaped-v0``, ``turngym/SQL-synthetic-shaped-v1``, ... (``shaping`` and
``bonus`` are make-time kwargs). Without importing it first, name the module in the id, as
Gymnasium allows: ``turngym.make("turngym.envs.wrappers:turngym/TextWorld-easy-shaped-v0")``.
``register_shaped(base_id)`` makes a shaped variant of any other registered env.
"""

from __future__ import annotations

import re
from typing import Any

import gymnasium as gym

from turngym.envs.deadline import StepDeadline
from turngym.envs.registry import describe, make, raw_entry_point, register
from turngym.envs.shaping import Shaper

_VERSIONED = re.compile(r"^(?P<name>.+)-v(?P<version>\d+)$")
SHAPED_FAMILIES = ("turngym/TextWorld-", "turngym/SQL-")
class ShapedReward(gym.Wrapper):
    """Adds a gameable shaping bonus to every step's reward (see the module docstring).

    Args:
        env: The env to wrap.
        shaping: ``valid_call`` | ``new_observation`` | ``new_state``.
        bonus: Paid per qualifying step.

    Raises:
        ValueError: an unknown shaping.
    """

    def __init__(self, env: gym.Env, shaping: str = "valid_call", bonus: float = 0.1) -> None:
        super().__init__(env)
        self.shaper = Shaper(shaping, bonus)

    def reset(self, **kwargs: Any):
        obs, info = self.env.reset(**kwargs)
        self.shaper.reset(obs, info.get("state_key"))
        return obs, info

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        bonus = self.shaper.step(obs, info)
        info = {**info, "shaped_bonus": bonus, "env_reward": float(reward)}
        return obs, float(reward) + bonus, terminated, truncated, info


class ReferenceCalls(gym.Wrapper):
    """Records the oracle's move before each step as ``info["reference_calls"]`` (a list of
    ``{"name", "arguments"}``; empty when the env has no oracle move there)."""

    def step(self, action: Any):
        base = self.env.unwrapped
        ref: list[dict] = []
        oracle = base.oracle_action() if hasattr(base, "oracle_action") else None
        if oracle is not None:
            parsed = base.format.parse(oracle, base.tools)
            ref = [{"name": c.name, "arguments": dict(c.arguments)} for c in parsed.calls]
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, {**info, "reference_calls": ref}


def make_shaped(base_id: str, shaping: str = "valid_call", bonus: float = 0.1, **kwargs: Any) -> gym.Env:
    """Entry point of shaped variants: the base env's class with its registered kwargs (plus
    ``kwargs``), wrapped in ``ShapedReward``. The variant's own registration applies the turn limit."""
    spec = gym.spec(base_id)
    return ShapedReward(raw_entry_point(spec)(**{**spec.kwargs, **kwargs}), shaping=shaping, bonus=bonus)


def shaped_id(base_id: str) -> str:
    """``turngym/TextWorld-easy-v0`` -> ``turngym/TextWorld-easy-shaped-v0``.

    Raises:
        ValueError: an id without a ``-vN`` version suffix.
    """
    m = _VERSIONED.match(base_id)
    if not m:
        raise ValueError(f"env id {base_id!r} has no -vN version suffix")
    return f"{m['name']}-shaped-v{m['version']}"


def register_shaped(base_id: str, new_id: str | None = None, shaping: str = "valid_call", bonus: float = 0.1) -> str:
    """Register a shaped variant of a registered env; returns its id.

    Args:
        base_id: A registered env id.
        new_id: The variant's id (default ``shaped_id(base_id)``).
        shaping: Default shaping of the variant (``make(id, shaping=...)`` overrides it).
        bonus: Default bonus of the variant.
    """
    spec = gym.spec(base_id)
    new_id = new_id or shaped_id(base_id)
    register(new_id, entry_point=make_shaped, kwargs={"base_id": base_id, "shaping": shaping, "bonus": bonus},
             max_turns=spec.max_episode_steps, nondeterministic=spec.nondeterministic,
             description=f"{describe(base_id)} [+ gameable '{shaping}' step bonus]")
    return new_id


def _register_builtin_variants() -> None:
    for env_id in list(gym.registry):
        if env_id.startswith(SHAPED_FAMILIES) and "-shaped-" not in env_id and _VERSIONED.match(env_id):
            register_shaped(env_id)


_register_builtin_variants()

__all__ = ["StepDeadline", "ShapedReward", "ReferenceCalls", "make_shaped", "register_shaped", "shaped_id"]


class RevisitLimit(gym.Wrapper):
    """Truncates an episode when it returns to one env state (``info["state_key"]``) for the
    ``max_visits``-th time, the start counting as a visit: with 3, a policy pacing between two rooms
    is stopped on its second return instead of burning the turn limit. A step that leaves the state
    unchanged (a refused command) is not a return. ``info["truncated_reason"]`` says why.
    A training-time option: episodes end sooner and the loop gets the failure's return at once."""

    def __init__(self, env: gym.Env, max_visits: int = 3) -> None:
        super().__init__(env)
        if max_visits < 2:
            raise ValueError(f"max_visits must be >= 2, got {max_visits}")
        self.max_visits = max_visits
        self.visits: dict = {}
        self.last: Any = None

    def reset(self, **kwargs: Any):
        obs, info = self.env.reset(**kwargs)
        self.visits, self.last = {}, None
        self._count(info.get("state_key"))
        return obs, info

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self._count(info.get("state_key")) >= self.max_visits and not (terminated or truncated):
            truncated = True
            info = {**info, "truncated_reason": f"state visited {self.max_visits} times"}
        return obs, reward, terminated, truncated, info

    def _count(self, key: Any) -> int:
        if key is None or key == self.last:
            return 0
        self.last = key
        self.visits[key] = self.visits.get(key, 0) + 1
        return self.visits[key]


def make_revisit_limited(env_id: str, max_visits: int, **kwargs: Any) -> gym.Env:
    """``turngym.make(env_id, **kwargs)`` wrapped in ``RevisitLimit`` (a picklable factory target)."""
    return RevisitLimit(make(env_id, **kwargs), max_visits)
