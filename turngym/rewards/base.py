"""Reward transforms: trajectories in, one reward per turn out.

A transform sees a whole batch of trajectories (group-aware transforms need that) and returns,
for each trajectory, one float per turn. Transforms compose by summing (``Sum``); transforms that
reshape others (gating, progress attribution) wrap them.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

from turngym.types import Trajectory

PerTurn = list[list[float]]


class RewardTransform(Protocol):
    """``transform(trajectories) -> per-turn rewards`` (same shape as the turns)."""

    def __call__(self, trajectories: Sequence[Trajectory]) -> PerTurn: ...


class EnvReward:
    """The env's own per-step rewards, as recorded in each turn."""

    def __call__(self, trajectories: Sequence[Trajectory]) -> PerTurn:
        return [[float(t.reward) for t in traj.turns] for traj in trajectories]


class OutcomeReward:
    """The episode outcome (success / score), paid at the last turn; 0 elsewhere."""

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale

    def __call__(self, trajectories: Sequence[Trajectory]) -> PerTurn:
        out = []
        for traj in trajectories:
            r = [0.0] * len(traj.turns)
            if r:
                r[-1] = self.scale * float(traj.outcome)
            out.append(r)
        return out


class Sum:
    """Per-turn sum of several transforms."""

    def __init__(self, *parts: RewardTransform) -> None:
        self.parts = parts

    def __call__(self, trajectories: Sequence[Trajectory]) -> PerTurn:
        outs = [p(trajectories) for p in self.parts]
        return [[sum(o[i][k] for o in outs) for k in range(len(traj.turns))] for i, traj in enumerate(trajectories)]


_REWARDS: dict[str, Callable[[], RewardTransform]] = {"env": EnvReward, "outcome": OutcomeReward}


def register_reward(name: str, factory: Callable[[], RewardTransform]) -> None:
    """Make ``make_reward(name)`` build ``factory()``."""
    _REWARDS[name] = factory


def make_reward(spec: str | Sequence[str]) -> RewardTransform:
    """``"env"``, ``"outcome"``, or a list of names (summed).

    Raises:
        ValueError: an unknown name.
    """
    names = [spec] if isinstance(spec, str) else list(spec)
    for n in names:
        if n not in _REWARDS:
            raise ValueError(f"unknown reward {n!r}; choose from {sorted(_REWARDS)}")
    parts = [_REWARDS[n]() for n in names]
    return parts[0] if len(parts) == 1 else Sum(*parts)
