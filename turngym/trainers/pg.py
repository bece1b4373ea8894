"""Critic-free policy gradient on identical rollouts: REINFORCE, RLOO, GRPO and GiGPO.

Every iteration plays G groups of ``group_size`` episodes; the episodes of a group share a task
and a reset seed (deterministic resets), so they differ only by the policy's samples. Advantages:

    reinforce:  A = R - mean_batch(R)                       (same for every turn of an episode)
    rloo:       A = R_i - mean_{j != i} R_j   within a group
    grpo:       A = (R_i - mean_group R) / std_group R
    gigpo:      A_t = A^E(episode, as GRPO) + omega * A^S(step), where A^S normalises the
                discounted step return G_t among steps taken from the same state_key in the group
    filtered_bc: A = 1 on the valid turns of the ``bc_top_k`` best successful episodes of each group
                (highest return, then fewest turns), else 0: online filtered behaviour cloning, the
                floor every RL method must beat. A turn the env rejected (or could not parse) is not
                cloned: it changed nothing in the game, and cloning it would teach the mistake

Groups whose episodes all earned the same return carry no contrast; ``filter_equal_groups``
drops them before the update (they cost a forward and backward and teach nothing).

``R`` is the episode's undiscounted sum of per-turn rewards (after the reward transforms). The
actor update is the shared PPO-clipped token-level step (``online.actor_update``) on the recorded
sampling log-probs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from turngym.config import knob
from turngym.rewards import reward_stats
from turngym.rewards.format import action_status
from turngym.trainers import functional as Fn
from turngym.trainers.actor import actor_update, advantage_stats, loss_kind, reference_pass
from turngym.trainers.distributed import DistContext
from turngym.trainers.sequences import pack_batch
from turngym.trainers.sft import expert_data
from turngym.trainers.trainer import OnlineConfig, OnlineTrainer
from turngym.types import Trajectory

ALGOS = ("reinforce", "rloo", "grpo", "gigpo", "filtered_bc")


@dataclass
class PGConfig(OnlineConfig):
    """Knobs of the critic-free family (plus the shared ``OnlineConfig`` ones)."""

    algo: str = knob("grpo", "reinforce | rloo | grpo | gigpo | filtered_bc")
    group_size: int = knob(4, "episodes per group (same task, same reset seed)")
    scale_by_std: bool = knob(True, "divide group-centred returns by the group std (GRPO, GiGPO)")
    step_weight: float = knob(1.0, "GiGPO: omega, the weight of the step-level advantage")
    filter_equal_groups: bool = knob(True, "drop groups whose episodes all earned the same return")
    bc_top_k: int = knob(1, "filtered BC: successful episodes cloned per group (best return, then fewest turns)")
    expert_replay: int = knob(0, "filtered BC: the oracle's episodes on the first N training tasks (the SFT stage's "
                                 "data) join every update with A = 1, an anchor against drift as in PPO-ptx; 0 = off")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.algo not in ALGOS:
            raise ValueError(f"algo must be one of {ALGOS}, got {self.algo!r}")
        if self.algo in ("rloo", "grpo", "gigpo", "filtered_bc") and self.group_size < 2:
            raise ValueError(f"{self.algo} needs group_size >= 2")
        if self.bc_top_k < 1:
            raise ValueError(f"bc_top_k must be >= 1, got {self.bc_top_k}")
        if self.expert_replay < 0:
            raise ValueError(f"expert_replay must be >= 0, got {self.expert_replay}")
        if self.expert_replay and loss_kind(self) != "nll":
            raise ValueError("expert_replay needs the NLL loss (algo=filtered_bc or pg_loss=nll): "
                             "expert tokens have no sampling log-probs for a PPO ratio")


def turn_advantages(trajs: list[Trajectory], rewards: list[list[float]], cfg: PGConfig) -> list[list[float]]:
    """Per-turn advantages for every trajectory (trajectories come in consecutive groups)."""
    returns = torch.tensor([sum(r) for r in rewards], dtype=torch.float32)
    n = cfg.group_size
    if cfg.algo == "reinforce":
        ep = Fn.reinforce_advantages(returns)
        return [[float(ep[i])] * len(t.turns) for i, t in enumerate(trajs)]
    grouped = returns.reshape(-1, n)
    if cfg.algo == "rloo":
        ep = Fn.rloo_advantages(grouped).reshape(-1)
        return [[float(ep[i])] * len(t.turns) for i, t in enumerate(trajs)]
    if cfg.algo == "grpo":
        ep = Fn.grpo_advantages(grouped, scale_by_std=cfg.scale_by_std).reshape(-1)
        return [[float(ep[i])] * len(t.turns) for i, t in enumerate(trajs)]
    if cfg.algo == "filtered_bc":
        success = torch.tensor([float(t.success) for t in trajs]).reshape(-1, n)
        lengths = torch.tensor([len(t.turns) for t in trajs]).reshape(-1, n)
        ep = Fn.best_of_group_advantages(grouped, success, lengths, cfg.bc_top_k).reshape(-1)
        return [[float(ep[i]) * (action_status(x) == "valid") for x in t.turns] for i, t in enumerate(trajs)]
    # gigpo: flatten steps, with discounted step returns and anchor states
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
    a = Fn.gigpo_advantages(grouped, torch.tensor(step_returns), torch.tensor(step_episode, dtype=torch.long),
                            groups, keys, cfg.step_weight, cfg.scale_by_std)
    out, j = [], 0
    for t in trajs:
        out.append([float(x) for x in a[j : j + len(t.turns)]])
        j += len(t.turns)
    return out


class PGTrainer(OnlineTrainer):
    """Train ``policy`` on ``env_id`` with REINFORCE / RLOO / GRPO / GiGPO (``cfg.algo``).

    With a multi-process ``ctx`` each rank plays whole groups, so group advantages need no
    communication; ``normalize_advantages`` then standardises over this rank's share.
    """

    def __init__(self, policy: Any, env_id: str, cfg: PGConfig | None = None, *,
                 env_kwargs: dict | None = None, out_dir: str | Path = "runs/pg", ctx: DistContext | None = None,
                 rollouts: Any = None, pools: Any = None) -> None:
        super().__init__(policy, env_id, cfg or PGConfig(), env_kwargs=env_kwargs, out_dir=out_dir, ctx=ctx,
                         rollouts=rollouts, pools=pools)
        self.name = self.cfg.algo
        self.experts: list[Trajectory] = []

    def _setup_extra(self) -> None:
        if self.cfg.expert_replay:
            experts = expert_data(self.policy, self.env_id, self.cfg.expert_replay, self.env_kwargs, self.cfg.seed,
                                   self.cfg.demo_seed)
            # each rank replays its share: gradients are averaged over ranks, so a full copy on every
            # rank would weigh the demonstrations world_size times against the clones
            self.experts = experts[self.ctx.rank :: self.ctx.world_size]

    def step(self) -> dict[str, float]:
        cfg = self.cfg
        specs = self.schedule(cfg.episodes_per_iter, cfg.group_size)
        trajs, metrics = self.collect(specs, cfg.group_size)
        rewards = self.reward_fn(trajs)
        metrics.update(reward_stats(self.reward_fn))  # G-RA gate rates, SPA fit error, shaping...
        per_turn = turn_advantages(trajs, rewards, cfg)
        trajs, per_turn = self._contrast_only(trajs, rewards, per_turn, metrics)
        if self.experts:  # the clones plus the demonstrations, as one NLL batch (every iteration)
            trajs, per_turn = trajs + self.experts, per_turn + [[1.0] * len(t.turns) for t in self.experts]
            metrics["pg/expert_episodes"] = float(len(self.experts))
        if not trajs:  # no group held a contrast: nothing to learn from this iteration
            return self.finish_step(metrics)
        batch = pack_batch(trajs, self.policy.pad_id)
        adv = torch.tensor([per_turn[ti][k] for ti, k in batch.turn_refs], dtype=torch.float32)
        if cfg.normalize_advantages and adv.numel() > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-6)
        ref_logprobs = reference_pass(self.ref, batch, False, cfg.autocast)[0] if self.ref is not None else None
        metrics.update(advantage_stats(adv))
        # all-equal groups carry no signal: skip the update (jointly across ranks), keep the data count
        if self.ctx.any_rank(bool(adv.abs().sum() > 0)):
            token_adv = Fn.broadcast_to_tokens(adv, batch.token_turn)
            with self.weights_lock():
                metrics.update(actor_update(self.model, self.actor_opt, batch, token_adv, ref_logprobs, cfg, self.gen, self.ctx))
        return self.finish_step(metrics)

    def _contrast_only(self, trajs: list[Trajectory], rewards: list[list[float]], per_turn: list[list[float]],
                       metrics: dict) -> tuple[list[Trajectory], list[list[float]]]:
        """The episodes worth an update: groups with different returns (``filter_equal_groups``;
        filtered BC clones a group's best success even when all of them succeeded), not groups whose
        greedy episode succeeded (``greedy_in_group``), and for filtered BC only the chosen episodes."""
        cfg, n = self.cfg, self.cfg.group_size
        keep = [True] * len(trajs)
        if cfg.greedy_in_group and n > 1:  # greedy decoding already solves these tasks: nothing to fix
            greedy_won = [trajs[i - i % n].success for i in range(len(trajs))]
            keep = [not w for w in greedy_won]
            metrics["pg/greedy_success"] = sum(greedy_won[::n]) / max(1, len(trajs) // n)
        if cfg.filter_equal_groups and n > 1 and cfg.algo not in ("reinforce", "filtered_bc"):
            returns = torch.tensor([sum(r) for r in rewards], dtype=torch.float32).reshape(-1, n)
            groups = Fn.equal_group_mask(returns)
            keep = [k and bool(groups[i // n]) for i, k in enumerate(keep)]
            metrics["pg/groups_kept"] = float(groups.float().mean())
        if cfg.algo == "filtered_bc":
            keep = [k and any(a != 0 for a in adv) for k, adv in zip(keep, per_turn)]
        if self.ctx.enabled:  # ranks step jointly: keep every row, with no advantage on the dropped ones
            per_turn = [adv if k else [0.0] * len(adv) for k, adv in zip(keep, per_turn)]
            keep = [True] * len(trajs)
        kept = [i for i, k in enumerate(keep) if k]
        metrics["pg/episodes_trained"] = float(len(kept))
        return [trajs[i] for i in kept], [per_turn[i] for i in kept]
