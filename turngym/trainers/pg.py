"""The critic-free family on identical rollouts: its config, its iteration, and the part each
algorithm plugs in.

Every iteration plays G groups of ``group_size`` episodes; the episodes of a group share a task
and a reset seed (deterministic resets), so they differ only by the policy's samples. What differs
between the algorithms is an ``Estimator``, one file each, holding its advantage math and naming
its loss:

    reinforce.py    A = R - mean_batch(R)                                          PPO surrogate
    rloo.py         A = R_i - mean_{j != i} R_j within a group                     PPO surrogate
    grpo.py         A = (R_i - mean_group R) / std_group R                         PPO surrogate
    gigpo.py        A_t = A^E(episode, as GRPO) + omega * A^S(step, same state)    PPO surrogate
    filtered_bc.py  A = 1 on the valid turns of each group's best successes        NLL (cloning)

``R`` is the episode's undiscounted sum of per-turn rewards (after the reward transforms). Groups
whose episodes all earned the same return carry no contrast; the estimators that compare within
a group drop them before the update (``filter_equal_groups``). The update is the shared token-level
step (``actor.actor_update``) with the estimator's loss on the log-probs recorded at sampling time.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Protocol

import torch

from turngym.config import knob, refuse_unless
from turngym.rewards import reward_stats
from turngym.trainers import functional as Fn
from turngym.trainers.actor import actor_update, advantage_stats, reference_pass
from turngym.trainers.distributed import DistContext
from turngym.trainers.stages import Section, register_section
from turngym.trainers.registry import algorithm_names, get_algorithm
from turngym.trainers.sequences import pack_batch
from turngym.trainers.trainer import OnlineConfig, OnlineTrainer
from turngym.types import Trajectory

# knobs only some estimators read (``Estimator.knobs``); set for another one, they are an error.
# (``expert_replay`` goes with the NLL loss, whichever algorithm: see ``PGConfig``.)
FAMILY_KNOBS = ("scale_by_std", "step_weight", "filter_equal_groups", "bc_top_k")


class Estimator(Protocol):
    """What one critic-free algorithm contributes.

    Attributes:
        loss: The update's loss unless ``pg_loss`` says otherwise: ``ppo`` (clipped surrogate on
            the sampling log-probs) or ``nll`` (``-A log pi``, cloning).
        min_group: The smallest ``group_size`` it can compare within.
        knobs: The ``FAMILY_KNOBS`` it reads.
        keep_chosen_only: Train only on episodes with a nonzero advantage (cloning the chosen ones).
    """

    loss: str
    min_group: int
    knobs: tuple[str, ...]
    keep_chosen_only: bool

    def advantages(self, trajs: list[Trajectory], rewards: list[list[float]], cfg: PGConfig) -> list[list[float]]:
        """Per-turn advantages of every trajectory (trajectories come in consecutive groups)."""
        ...


@dataclass
class PGConfig(OnlineConfig):
    """Knobs of the critic-free family (plus the shared ``OnlineConfig`` ones)."""

    algo: str = knob("grpo", "the algorithm: reinforce | rloo | grpo | gigpo | filtered_bc")
    group_size: int = knob(4, "episodes per group (same task, same reset seed)")
    scale_by_std: bool = knob(True, "divide group-centred returns by the group std (GRPO, GiGPO)")
    step_weight: float = knob(1.0, "GiGPO: omega, the weight of the step-level advantage")
    filter_equal_groups: bool = knob(True, "drop groups whose episodes all earned the same return (RLOO, GRPO, GiGPO)")
    bc_top_k: int = knob(1, "filtered BC: successful episodes cloned per group (best return, then fewest turns)")
    expert_replay: int = knob(0, "filtered BC: the oracle's episodes on the first N training tasks (the SFT stage's "
                                 "data) join every update with A = 1, an anchor against drift as in PPO-ptx; 0 = off")

    def __post_init__(self) -> None:
        super().__post_init__()
        names = algorithm_names("pg")
        if self.algo not in names:
            raise ValueError(f"algo must be one of {names}, got {self.algo!r}")
        est = self.estimator
        if self.group_size < est.min_group:
            raise ValueError(f"{self.algo} needs group_size >= {est.min_group}")
        if self.bc_top_k < 1:
            raise ValueError(f"bc_top_k must be >= 1, got {self.bc_top_k}")
        if self.expert_replay < 0:
            raise ValueError(f"expert_replay must be >= 0, got {self.expert_replay}")
        unused = [k for k, v in self.unused_knobs().items() if v != getattr(self, k)]
        if unused:
            raise ValueError(f"{self.algo} does not use {unused}; leave them at their defaults")
        if self.expert_replay and self.loss != "nll":
            raise ValueError("expert_replay needs the NLL loss (algo=filtered_bc or pg_loss=nll): "
                             "expert tokens have no sampling log-probs for a PPO ratio")
        # knobs only some algorithms or losses read: set elsewhere, they would change nothing
        refuse_unless(self, "gamma", self.algo == "gigpo", "by gigpo (its step returns are discounted)")
        for name in ("clip_coef", "old_logprobs"):
            refuse_unless(self, name, self.loss == "ppo", "with the PPO loss (pg_loss=ppo, or auto for rloo, grpo, "
                                                         "gigpo, reinforce)")

    @property
    def estimator(self) -> Estimator:
        return get_algorithm(self.algo).estimator

    @property
    def loss(self) -> str:
        """``pg_loss`` with ``auto`` decided by the algorithm."""
        return self.estimator.loss if self.pg_loss == "auto" else self.pg_loss

    def unused_knobs(self) -> dict[str, Any]:
        """The family knobs this algorithm does not read, with their defaults."""
        defaults = {f.name: f.default for f in fields(PGConfig)}
        return {k: defaults[k] for k in FAMILY_KNOBS if k not in self.estimator.knobs}

    @classmethod
    def fields_for(cls, algo: str, fields_: dict) -> dict:
        """A pg section's fields switched to ``algo``: knobs the new algorithm does not read go back
        to their defaults (``--algo rloo`` over the quickstart's filtered-BC section drops its
        ``expert_replay``)."""
        switched = {**fields_, "algo": algo}
        est = get_algorithm(algo).estimator
        defaults = {f.name: f.default for f in fields(cls)}
        out = {k: defaults[k] if k in FAMILY_KNOBS and k not in est.knobs else v for k, v in switched.items()}
        if (out.get("pg_loss", "auto") if out.get("pg_loss", "auto") != "auto" else est.loss) != "nll":
            out["expert_replay"] = 0  # demonstrations are part of an NLL update
        return out


def episode_returns(rewards: list[list[float]]) -> torch.Tensor:
    """``(N,)`` undiscounted return of each episode."""
    return torch.tensor([sum(r) for r in rewards], dtype=torch.float32)


def per_turn(episode_adv: torch.Tensor, trajs: list[Trajectory]) -> list[list[float]]:
    """An episode-level advantage ``(N,)`` given to every turn of its episode."""
    return [[float(episode_adv[i])] * len(t.turns) for i, t in enumerate(trajs)]


def turn_advantages(trajs: list[Trajectory], rewards: list[list[float]], cfg: PGConfig) -> list[list[float]]:
    """Per-turn advantages for every trajectory, by ``cfg.algo``'s estimator."""
    return cfg.estimator.advantages(trajs, rewards, cfg)


class PGTrainer(OnlineTrainer):
    """Train ``policy`` on ``env_id`` with a critic-free algorithm (``cfg.algo``).

    With a multi-process ``ctx`` each rank plays whole groups, so group advantages need no
    communication; ``normalize_advantages`` then standardises over this rank's share.
    """

    def __init__(self, policy: Any, env_id: str, cfg: PGConfig | None = None, *,
                 env_kwargs: dict | None = None, out_dir: str | Path = "runs/pg", ctx: DistContext | None = None,
                 collector: Any = None, demos: dict | None = None) -> None:
        super().__init__(policy, env_id, cfg or PGConfig(), env_kwargs=env_kwargs, out_dir=out_dir, ctx=ctx,
                         collector=collector, demos=demos)
        self.name = self.cfg.algo
        self.experts: list[Trajectory] = []

    def _setup_extra(self) -> None:
        if self.cfg.expert_replay:
            d = self.demos
            experts = self.collector.demonstrations(self.env, self.cfg.expert_replay, d.get("seed", self.seed),
                                                   d.get("demo_seed", -1), pool=d.get("pool", 0))
            # each rank replays its share: gradients are averaged over ranks, so a full copy on every
            # rank would weigh the demonstrations world_size times against the clones
            self.experts = experts[self.ctx.rank :: self.ctx.world_size]

    def step(self) -> dict[str, float]:
        """One iteration: collect groups, advantages, keep the contrasting ones, update the actor."""
        cfg = self.cfg
        specs = self.schedule(cfg.episodes_per_iter, cfg.group_size)
        trajs, metrics = self.collect(specs, cfg.group_size)
        rewards = self.reward_fn(trajs)
        metrics.update(reward_stats(self.reward_fn))  # G-RA gate rates, SPA fit error, shaping...
        adv_turns = turn_advantages(trajs, rewards, cfg)
        trajs, adv_turns = self._contrast_only(trajs, rewards, adv_turns, metrics)
        if self.experts:  # the clones plus the demonstrations, as one NLL batch (every iteration)
            trajs, adv_turns = trajs + self.experts, adv_turns + [[1.0] * len(t.turns) for t in self.experts]
            metrics["pg/expert_episodes"] = float(len(self.experts))
        if not trajs:  # no group held a contrast: nothing to learn from this iteration
            return self.finish_step(metrics)
        batch = pack_batch(trajs, self.policy.pad_id)
        adv = torch.tensor([adv_turns[ti][k] for ti, k in batch.turn_refs], dtype=torch.float32)
        if cfg.normalize_advantages and adv.numel() > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-6)
        ref_logprobs = reference_pass(self.ref, batch, False, cfg.autocast)[0] if self.ref is not None else None
        metrics.update(advantage_stats(adv))
        # all-equal groups carry no signal: skip the update (jointly across ranks), keep the data count
        if self.ctx.any_rank(bool(adv.abs().sum() > 0)):
            token_adv = Fn.broadcast_to_tokens(adv, batch.token_turn)
            with self.weights_lock():
                metrics.update(actor_update(self.model, self.actor_opt, batch, token_adv, ref_logprobs, cfg, self.gen,
                                            self.ctx, loss=cfg.loss))
        return self.finish_step(metrics)

    def _contrast_only(self, trajs: list[Trajectory], rewards: list[list[float]], adv_turns: list[list[float]],
                       metrics: dict) -> tuple[list[Trajectory], list[list[float]]]:
        """The episodes worth an update: groups with different returns (for the estimators that
        compare within a group), not groups whose greedy episode succeeded (``greedy_in_group``),
        and for a cloning estimator only the chosen episodes."""
        cfg, n, est = self.cfg, self.cfg.group_size, self.cfg.estimator
        keep = [True] * len(trajs)
        if cfg.greedy_in_group and n > 1:  # greedy decoding already solves these tasks: nothing to fix
            greedy_won = [trajs[i - i % n].success for i in range(len(trajs))]
            keep = [not w for w in greedy_won]
            metrics["pg/greedy_success"] = sum(greedy_won[::n]) / max(1, len(trajs) // n)
        if "filter_equal_groups" in est.knobs and cfg.filter_equal_groups and n > 1:
            groups = Fn.equal_group_mask(episode_returns(rewards).reshape(-1, n))
            keep = [k and bool(groups[i // n]) for i, k in enumerate(keep)]
            metrics["pg/groups_kept"] = float(groups.float().mean())
        if est.keep_chosen_only:
            keep = [k and any(a != 0 for a in adv) for k, adv in zip(keep, adv_turns)]
        if self.ctx.enabled:  # ranks step jointly: keep every row, with no advantage on the dropped ones
            adv_turns = [adv if k else [0.0] * len(adv) for k, adv in zip(keep, adv_turns)]
            keep = [True] * len(trajs)
        kept = [i for i, k in enumerate(keep) if k]
        metrics["pg/episodes_trained"] = float(len(kept))
        return [trajs[i] for i in kept], [adv_turns[i] for i in kept]


def _quickstart() -> PGConfig:
    # online filtered BC for 7 minutes on the games greedy decoding fails, with a format penalty
    return PGConfig(algo="filtered_bc", iterations=100, time_budget_s=420, group_size=8, episodes_per_iter=64,
                    num_envs=64, minibatch_size=8, micro_batch_size=4, top_p=1.0, max_state_visits=3,
                    max_new_tokens=0, trainable="top:8", actor_lr=1e-4, actor_epochs=2, actor_warmup_steps=2,
                    task_sampling="greedy_failed", expert_replay=8,
                    reward=["env", {"name": "format", "unparseable": -0.1, "invalid": -0.1}])


register_section(Section("pg", PGConfig, _quickstart, "critic-free trainers (algo=reinforce|rloo|grpo|gigpo|filtered_bc)"))
