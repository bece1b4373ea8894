"""RLOO (Ahmadian et al. 2024): within a group of episodes from one reset, each episode's baseline
is the mean return of the others, ``A_i = R_i - mean_{j != i} R_j``, on every turn; trained through
PPO's clipped surrogate (``actor.ppo_loss``). Groups with equal returns are dropped (no contrast).
"""

from __future__ import annotations

import torch

from turngym.trainers.pg import PGConfig, PGTrainer, episode_returns, per_turn
from turngym.trainers.registry import Algorithm, register_algorithm
from turngym.types import Trajectory


def rloo_advantages(returns: torch.Tensor) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024), per group: ``A_i = R_i - mean_{j != i} R_j``.

    Args:
        returns: ``(G, n)``: G groups of n episodes of the same task (n >= 2).
    """
    n = returns.shape[-1]
    if n < 2:
        raise ValueError("RLOO needs at least 2 episodes per group")
    others = (returns.sum(dim=-1, keepdim=True) - returns) / (n - 1)
    return returns - others


class RLOO:
    """The leave-one-out baseline within each group."""

    loss, min_group, knobs, keep_chosen_only = "ppo", 2, ("filter_equal_groups",), False

    def advantages(self, trajs: list[Trajectory], rewards: list[list[float]], cfg: PGConfig) -> list[list[float]]:
        grouped = episode_returns(rewards).reshape(-1, cfg.group_size)
        return per_turn(rloo_advantages(grouped).reshape(-1), trajs)


register_algorithm(Algorithm("rloo", section="pg", config=PGConfig, trainer=PGTrainer, estimator=RLOO(),
                             help="leave-one-out baseline in a group"))
