"""REINFORCE with a batch-mean baseline: every turn of an episode gets ``A = R - mean_batch(R)``,
trained through PPO's clipped surrogate (``actor.ppo_loss``). No groups are needed: it is the
critic-free family's simplest member (``pg.py`` holds the shared iteration).
"""

from __future__ import annotations

import torch

from turngym.trainers.pg import PGConfig, PGTrainer, episode_returns, per_turn
from turngym.trainers.registry import Algorithm, register_algorithm
from turngym.types import Trajectory


def reinforce_advantages(returns: torch.Tensor) -> torch.Tensor:
    """REINFORCE with a batch-mean baseline: ``A_i = R_i - mean(R)``, shape ``(N,)``."""
    return returns - returns.mean()


class Reinforce:
    """The batch-mean baseline, on whole episodes."""

    loss, min_group, knobs, keep_chosen_only = "ppo", 1, (), False

    def advantages(self, trajs: list[Trajectory], rewards: list[list[float]], cfg: PGConfig) -> list[list[float]]:
        return per_turn(reinforce_advantages(episode_returns(rewards)), trajs)


register_algorithm(Algorithm("reinforce", section="pg", config=PGConfig, trainer=PGTrainer, estimator=Reinforce(),
                             help="REINFORCE, batch-mean baseline"))
