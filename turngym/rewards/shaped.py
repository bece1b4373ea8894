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

The same logic (``turngym.envs.shaping.Shaper``) runs in two places: ``ShapedStepReward`` computes it
from recorded turns (a reward transform the trainers take through their config), and
``turngym.envs.wrappers.ShapedReward`` adds it to the env's own reward at step time (for envs made by id).
"""

from __future__ import annotations

from typing import Sequence

from turngym.envs.shaping import SHAPINGS, Shaper, observation_text  # noqa: F401  (re-exported)
from turngym.rewards.base import PerTurn
from turngym.types import Trajectory


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
