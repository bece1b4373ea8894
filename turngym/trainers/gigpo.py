"""GiGPO (Feng et al. 2025): GRPO's episode-level advantage plus a step-level one,
``A_t = A^E(episode) + omega * A^S(step)``, where the step groups are the steps taken from the same
anchor state (``turn.info["anchor_state_key"]``) within a group, compared by their discounted
returns ``G_t``; trained through PPO's clipped surrogate (``actor.ppo_loss``). The siblings of a
tree rollout form such step groups too.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Hashable, Sequence

import torch

from turngym.trainers import functional as Fn
from turngym.trainers.grpo import grpo_advantages
from turngym.trainers.pg import PGConfig, PGTrainer, episode_returns
from turngym.trainers.registry import Algorithm, register_algorithm
from turngym.types import Trajectory


def gigpo_step_advantages(
    step_returns: torch.Tensor,
    group_ids: Sequence[Hashable],
    state_keys: Sequence[Hashable],
    eps: float = 1e-6,
    scale_by_std: bool = True,
) -> torch.Tensor:
    """GiGPO's step-level advantage (Feng et al. 2025): steps taken from the same anchor state
    (same ``state_key``) within the same group form a step group; each step's discounted return
    is normalised within its step group: ``A^S = (G_t - mean) / (std + eps)``. A step whose
    anchor state was visited once gets 0 (no comparison is possible).

    Args:
        step_returns: ``(S,)`` discounted returns ``G_t`` of every step in the batch.
        group_ids, state_keys: length ``S``; which episode group and which state each step is from.

    Returns:
        ``(S,)`` step-level advantages.
    """
    buckets: dict[tuple, list[int]] = defaultdict(list)
    for i, key in enumerate(zip(group_ids, state_keys)):
        buckets[key].append(i)
    out = torch.zeros_like(step_returns)
    for idx in buckets.values():
        if len(idx) < 2:
            continue
        r = step_returns[idx]
        centred = r - r.mean()
        out[idx] = centred / (r.std(unbiased=False) + eps) if scale_by_std else centred
    return out


def gigpo_advantages(
    episode_returns: torch.Tensor,
    step_returns: torch.Tensor,
    step_episode: torch.Tensor,
    group_ids: Sequence[Hashable],
    state_keys: Sequence[Hashable],
    step_weight: float = 1.0,
    scale_by_std: bool = True,
) -> torch.Tensor:
    """GiGPO's per-step advantage ``A = A^E(episode) + omega * A^S(step)``.

    Args:
        episode_returns: ``(G, n)`` episode returns per group (as for GRPO).
        step_returns: ``(S,)`` discounted return of each step.
        step_episode: ``(S,)`` long, flat index ``g * n + i`` of each step's episode.
        group_ids, state_keys: per step, as in ``gigpo_step_advantages``.
        step_weight: ``omega``.

    Returns:
        ``(S,)``.
    """
    a_episode = grpo_advantages(episode_returns, scale_by_std=scale_by_std).reshape(-1)[step_episode]
    a_step = gigpo_step_advantages(step_returns, group_ids, state_keys, scale_by_std=scale_by_std)
    return a_episode + step_weight * a_step


class GiGPO:
    """Episode-level plus same-state step-level group advantages."""

    loss, min_group, knobs, keep_chosen_only = "ppo", 2, ("scale_by_std", "step_weight", "filter_equal_groups"), False

    def advantages(self, trajs: list[Trajectory], rewards: list[list[float]], cfg: PGConfig) -> list[list[float]]:
        n = cfg.group_size
        step_returns, step_episode, groups, keys = [], [], [], []
        for i, (t, r) in enumerate(zip(trajs, rewards)):
            g = Fn.discounted_returns(torch.tensor(r, dtype=torch.float32), cfg.gamma) if r else torch.zeros(0)
            for k, turn in enumerate(t.turns):
                step_returns.append(float(g[k]))
                step_episode.append(i)
                groups.append(i // n)
                # the state the action was taken from, recorded by the rollout; a turn without one
                # (an env with no state key) gets a key of its own, so it is compared with no other
                keys.append(turn.info.get("anchor_state_key") or f"{i}:{k}")
        a = gigpo_advantages(episode_returns(rewards).reshape(-1, n), torch.tensor(step_returns),
                             torch.tensor(step_episode, dtype=torch.long), groups, keys, cfg.step_weight, cfg.scale_by_std)
        out, j = [], 0
        for t in trajs:
            out.append([float(x) for x in a[j : j + len(t.turns)]])
            j += len(t.turns)
        return out


register_algorithm(Algorithm("gigpo", section="pg", config=PGConfig, trainer=PGTrainer, estimator=GiGPO(),
                             help="GRPO plus same-state step advantages"))
