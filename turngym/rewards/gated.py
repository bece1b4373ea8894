"""G-RA: gated reward accumulation.

Immediate step rewards enter the return only when the trajectory's high-level reward meets a
threshold; otherwise only the high-level reward counts (Sun et al. 2025, "Stabilizing Long-term
Multi-turn Reinforcement Learning with Gated Rewards", arXiv:2508.10548). Per turn t of a
trajectory with high-level rewards h_t and step rewards s_t:

    H     = sum_t h_t                      (the high-level reward, e.g. the outcome)
    open  = H >= tau                       (mode "gated"); always True (mode "direct")
    r_t   = h_t + open * s_t

"direct" is plain accumulation (the ablation's ungated arm); both modes log what they did:

- ``traj.metadata``: ``reward/gate_open`` (bool), ``reward/high`` (H), ``reward/step`` (sum s_t,
  kept or not);
- ``self.stats`` (via ``turngym.rewards.reward_stats``), with ``{prefix}`` = ``reward/gra``:
  ``{prefix}_open_frac``, ``{prefix}_high_mean``, ``{prefix}_step_kept_mean``,
  ``{prefix}_step_dropped_mean`` and ``{prefix}_step_on_failed_mean`` (step reward that reached the
  return of trajectories below tau: positive only when ungated, the drift signal).
"""

from __future__ import annotations

from typing import Sequence

from turngym.rewards.base import PerTurn, Spec, make_reward
from turngym.types import Trajectory

MODES = ("gated", "direct")


def gate(high: list[float], step: list[float], tau: float, direct: bool = False) -> tuple[list[float], bool]:
    """Gated accumulation of one trajectory's rewards.

    Args:
        high: Per-turn high-level rewards h_t.
        step: Per-turn step rewards s_t (same length).
        tau: The threshold on ``sum(high)``.
        direct: Accumulate the step rewards whatever the high-level reward (no gate).

    Returns:
        The per-turn rewards ``h_t + open * s_t`` and whether the gate was open.

    Raises:
        ValueError: ``high`` and ``step`` differ in length.
    """
    if len(high) != len(step):
        raise ValueError(f"high-level and step rewards differ in length: {len(high)} vs {len(step)}")
    is_open = direct or sum(high) >= tau
    return [h + (s if is_open else 0.0) for h, s in zip(high, step)], is_open


class GatedReward:
    """G-RA over two transforms: ``high`` (the high-level reward) gates ``step``.

    Args:
        step: Spec (or transform) of the immediate step rewards, e.g. ``["shaped"]`` or ``"spa"``.
        high: Spec (or transform) of the high-level reward; its per-turn sum is compared to tau.
        tau: The gate's threshold (``sum(high) >= tau`` opens it).
        mode: ``gated`` (G-RA) or ``direct`` (ungated accumulation, for ablations).
        prefix: Metric-key prefix for ``stats`` (change it when one config gates twice).

    Raises:
        ValueError: an unknown mode.
    """

    def __init__(self, step: Spec = "env", high: Spec = "outcome", tau: float = 1.0, mode: str = "gated",
                 prefix: str = "reward/gra") -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.step, self.high = make_reward(step), make_reward(high)
        self.tau, self.mode, self.prefix = float(tau), mode, prefix
        self.stats: dict[str, float] = {}

    def children(self) -> list:
        return [self.high, self.step]

    def __call__(self, trajectories: Sequence[Trajectory]) -> PerTurn:
        highs, steps = self.high(trajectories), self.step(trajectories)
        out, n_open, kept, dropped, on_failed = [], 0, 0.0, 0.0, 0.0
        for traj, h, s in zip(trajectories, highs, steps):
            rewards, is_open = gate(h, s, self.tau, direct=self.mode == "direct")
            out.append(rewards)
            step_sum, high_sum = sum(s), sum(h)
            traj.metadata.update({"reward/gate_open": is_open, "reward/high": high_sum, "reward/step": step_sum})
            n_open += is_open
            kept += step_sum if is_open else 0.0
            dropped += 0.0 if is_open else step_sum
            on_failed += step_sum if is_open and high_sum < self.tau else 0.0
        n = max(1, len(out))
        p = self.prefix
        self.stats = {f"{p}_open_frac": n_open / n, f"{p}_high_mean": sum(map(sum, highs)) / n,
                      f"{p}_step_kept_mean": kept / n, f"{p}_step_dropped_mean": dropped / n,
                      f"{p}_step_on_failed_mean": on_failed / n}
        return out
