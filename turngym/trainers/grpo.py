"""GRPO (Shao et al. 2024): within a group of episodes from one reset, returns are centred and (with
``scale_by_std``) scaled by the group's std, ``A_i = (R_i - mean R) / std R``, on every turn; trained
through PPO's clipped surrogate (``actor.ppo_loss``). Groups with equal returns are dropped.
"""

from __future__ import annotations

import torch

from turngym.trainers.pg import PGConfig, PGTrainer, episode_returns, per_turn
from turngym.trainers.registry import Algorithm, register_algorithm
from turngym.types import Trajectory


def grpo_advantages(returns: torch.Tensor, eps: float = 1e-6, scale_by_std: bool = True) -> torch.Tensor:
    """GRPO (Shao et al. 2024), per group: ``A_i = (R_i - mean(R)) / (std(R) + eps)``.

    Args:
        returns: ``(G, n)``. ``std`` is the population std (``unbiased=False``).
        scale_by_std: ``False`` gives the mean-centred variant (Dr. GRPO).
    """
    centred = returns - returns.mean(dim=-1, keepdim=True)
    if not scale_by_std:
        return centred
    return centred / (returns.std(dim=-1, unbiased=False, keepdim=True) + eps)


class GRPO:
    """Group-normalised returns."""

    loss, min_group, knobs, keep_chosen_only = "ppo", 2, ("scale_by_std", "filter_equal_groups"), False

    def advantages(self, trajs: list[Trajectory], rewards: list[list[float]], cfg: PGConfig) -> list[list[float]]:
        grouped = episode_returns(rewards).reshape(-1, cfg.group_size)
        return per_turn(grpo_advantages(grouped, scale_by_std=cfg.scale_by_std).reshape(-1), trajs)


register_algorithm(Algorithm("grpo", section="pg", config=PGConfig, trainer=PGTrainer, estimator=GRPO(),
                             help="group-normalised returns"))
