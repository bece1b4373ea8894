"""Format reward: a penalty (or bonus) per turn for how well-formed the action was.

Three cases, read from what the env recorded for the turn:

- unparseable: no tool call could be read from the utterance (``info["tool_calls"]`` is empty);
- invalid: calls were parsed but the env rejected the action (``info["action_valid"]`` is False:
  a tool error, a wrong argument, a command the game did not understand);
- valid: anything else.
"""

from __future__ import annotations

from typing import Sequence

from turngym.rewards.base import PerTurn
from turngym.types import Trajectory, Turn


def action_status(turn: Turn) -> str:
    """``"unparseable"``, ``"invalid"`` or ``"valid"`` for one recorded turn."""
    calls = turn.info.get("tool_calls", turn.tool_calls)
    if not calls:
        return "unparseable"
    return "valid" if turn.action_valid else "invalid"


class FormatReward:
    """Per-turn reward by action status.

    Args:
        unparseable: Reward of a turn with no readable tool call.
        invalid: Reward of a parsed action the env rejected.
        valid: Reward of a valid action (0 keeps this a pure penalty).
    """

    def __init__(self, unparseable: float = -0.1, invalid: float = -0.05, valid: float = 0.0) -> None:
        self.values = {"unparseable": float(unparseable), "invalid": float(invalid), "valid": float(valid)}
        self.stats: dict[str, float] = {}

    def __call__(self, trajectories: Sequence[Trajectory]) -> PerTurn:
        counts = dict.fromkeys(self.values, 0)
        out = []
        for traj in trajectories:
            row = []
            for turn in traj.turns:
                status = action_status(turn)
                counts[status] += 1
                row.append(self.values[status])
            out.append(row)
        total = max(1, sum(counts.values()))
        self.stats = {f"reward/format_{k}_frac": v / total for k, v in counts.items()}
        return out
