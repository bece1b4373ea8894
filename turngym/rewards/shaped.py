"""Per-step shaping bonuses: two deliberately gameable ones (for reward-hacking experiments) and an
exploration bonus.

The first two are easy to farm without solving the task:

- ``valid_call``: ``bonus`` for every turn whose action the env accepted (parsed tool calls, no
  error). Sending ``look`` or bumping into a wall forever earns it.
- ``new_observation``: ``bonus`` for every turn whose observation text was not seen before in the
  episode (the opening messages count as seen). Any command that prints something new earns it.
- ``new_state``: ``bonus`` for every turn that reaches an env state (``info["state_key"]``) not
  visited before in the episode: episodic count-based exploration. Unlike ``new_observation``, an
  error message or a refused move never earns it (the state does not change), so it pays for
  finding new rooms rather than for new ways to fail; pacing between two rooms earns nothing.

Where an episode ends on success, all three pay more for *not* finishing, so accumulating them
directly into the return can pull the policy away from the outcome; gating them (G-RA,
``turngym.rewards.gated``) is the fix under test.

The same logic runs in two places: ``ShapedStepReward`` computes it from recorded turns (a reward
transform the trainers take through their config), and ``turngym.envs.wrappers.ShapedReward`` adds
it to the env's own reward at step time (for envs made by id).
"""

from __future__ import annotations

from typing import Iterable, Sequence

from turngym.rewards.base import PerTurn
from turngym.types import Message, Trajectory

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
            ok = bool(info.get("tool_calls")) and bool(info.get("action_valid", False))
            return self.bonus if ok else 0.0
        key = info.get("state_key") if self.shaping == "new_state" else observation_text(observation)
        if key is None or key in self._seen:
            return 0.0
        self._seen.add(key)
        return self.bonus


def shaped_bonuses(traj: Trajectory, shaping: str = "valid_call", bonus: float = 0.1) -> list[float]:
    """The shaping bonus of every turn of a recorded trajectory."""
    shaper = Shaper(shaping, bonus)
    shaper.reset(traj.initial_observation, traj.metadata.get("initial_state_key"))
    return [shaper.step(t.observation, t.info) for t in traj.turns]


class ShapedStepReward:
    """The gameable step reward as a transform (see the module docstring).

    Args:
        shaping: ``valid_call`` | ``new_observation`` | ``new_state``.
        bonus: Paid per qualifying turn.
    """

    def __init__(self, shaping: str = "valid_call", bonus: float = 0.1) -> None:
        Shaper(shaping, bonus)  # validates the arguments now, not at the first batch
        self.shaping, self.bonus = shaping, float(bonus)
        self.stats: dict[str, float] = {}

    def __call__(self, trajectories: Sequence[Trajectory]) -> PerTurn:
        out = [shaped_bonuses(t, self.shaping, self.bonus) for t in trajectories]
        n = max(1, len(out))
        fail = [sum(r) for r, t in zip(out, trajectories) if not t.success]
        self.stats = {
            "reward/shaped_mean": sum(sum(r) for r in out) / n,
            "reward/shaped_on_failed_mean": sum(fail) / len(fail) if fail else 0.0,
        }
        return out
