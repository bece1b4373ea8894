"""Online filtered behaviour cloning: ``A = 1`` on the valid turns of each group's ``bc_top_k`` best
successful episodes (highest return, then fewest turns), else 0, trained by the NLL loss
(``actor.nll_loss``: ``-mean(A log pi)``, no ratio). It is the floor every RL method must beat.

A turn the env rejected (or could not parse) is not cloned: it changed nothing in the game, and
cloning it would teach the mistake. With ``expert_replay`` the SFT stage's demonstrations join
every update with ``A = 1`` (an anchor against drift, as in PPO-ptx).
"""

from __future__ import annotations

import torch

from turngym.rewards.format import action_status
from turngym.trainers.pg import PGConfig, PGTrainer, episode_returns
from turngym.trainers.registry import Algorithm, register_algorithm
from turngym.types import Trajectory


def best_of_group_advantages(returns: torch.Tensor, success: torch.Tensor, lengths: torch.Tensor | None = None,
                             k: int = 1) -> torch.Tensor:
    """Online filtered behaviour cloning: ``A = 1`` for the ``k`` best episodes of each group that
    succeeded, ``0`` for every other episode.

    Episodes rank by return (highest first), then by length (shortest first: of two successes with
    the same return, the shorter one wandered less and is the better demonstration), then by
    position. A group contributes fewer than ``k`` when fewer of its episodes succeeded.

    Args:
        returns, success: ``(G, n)``; ``success`` is 1 for a solved episode.
        lengths: ``(G, n)`` turns per episode (None: ties go to the first).
        k: Episodes to clone per group.

    Returns:
        ``(G, n)``.
    """
    g, n = returns.shape
    order = torch.arange(n).expand(g, n)
    if lengths is not None:  # stable sorts, least important key first
        order = lengths.gather(-1, order).argsort(dim=-1, stable=True)
    order = order.gather(-1, (-returns.gather(-1, order)).argsort(dim=-1, stable=True))
    ranked_success = success.gather(-1, order) > 0
    # the rank among successes of each ranked slot: clone the first k successes
    take = ranked_success & (ranked_success.long().cumsum(-1) <= k)
    return torch.zeros_like(returns).scatter_(-1, order, take.to(returns.dtype))


class FilteredBC:
    """Clone the best successes of each group."""

    loss, min_group, knobs, keep_chosen_only = "nll", 2, ("bc_top_k",), True

    def advantages(self, trajs: list[Trajectory], rewards: list[list[float]], cfg: PGConfig) -> list[list[float]]:
        n = cfg.group_size
        grouped = episode_returns(rewards).reshape(-1, n)
        success = torch.tensor([float(t.success) for t in trajs]).reshape(-1, n)
        lengths = torch.tensor([len(t.turns) for t in trajs]).reshape(-1, n)
        ep = best_of_group_advantages(grouped, success, lengths, cfg.bc_top_k).reshape(-1)
        return [[float(ep[i]) * (action_status(x) == "valid") for x in t.turns] for i, t in enumerate(trajs)]


register_algorithm(Algorithm("filtered_bc", section="pg", config=PGConfig, trainer=PGTrainer, estimator=FilteredBC(),
                             help="online filtered BC: clone each group's best success"))
