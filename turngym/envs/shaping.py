"""The per-step shaping bonus of one episode, computed from what the env returns at each step.

It lives with the envs because the ``ShapedReward`` wrapper pays it at step time; the reward
transform ``turngym.rewards.ShapedStepReward`` replays it over recorded turns (see that module for
what each shaping pays and how it can be gamed).
"""

from __future__ import annotations

from typing import Iterable

from turngym.types import Message, action_valid

SHAPINGS = ("valid_call", "new_observation", "new_state")


def observation_text(messages: Iterable[Message]) -> str:
    """The observation as one comparable string (whitespace-normalised)."""
    return "\n".join(" ".join(m.content.split()) for m in messages)


class Shaper:
    """The per-step bonus of one episode (stateful: ``new_observation`` and ``new_state`` remember what they saw).

    Args:
        shaping: ``valid_call``, ``new_observation`` or ``new_state``.
        bonus: Paid per qualifying turn.

    Raises:
        ValueError: an unknown shaping.
    """

    def __init__(self, shaping: str = "valid_call", bonus: float = 0.1) -> None:
        if shaping not in SHAPINGS:
            raise ValueError(f"shaping must be one of {SHAPINGS}, got {shaping!r}")
        self.shaping, self.bonus = shaping, float(bonus)
        self._seen: set[str] = set()

    def reset(self, opening: Iterable[Message], state_key: str | None = None) -> None:
        """Start an episode from its opening messages and, for ``new_state``, its reset state."""
        self._seen = {state_key} if self.shaping == "new_state" else {observation_text(opening)}

    def step(self, observation: Iterable[Message], info: dict) -> float:
        """The bonus of one step, given its observation and the env's info."""
        if self.shaping == "valid_call":
            ok = bool(info.get("tool_calls")) and action_valid(info)
            return self.bonus if ok else 0.0
        key = info.get("state_key") if self.shaping == "new_state" else observation_text(observation)
        if key is None or key in self._seen:
            return 0.0
        self._seen.add(key)
        return self.bonus
