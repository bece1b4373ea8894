"""Branch-search BC: find successes where greedy play fails by branching from its own episodes,
keep each task's best one, and clone them all (expert iteration on tree rollouts).

One iteration:

1. **Screen.** Play ``episodes_per_iter`` training tasks once each, greedily (held-out evaluation
   is greedy), tasks with no success in the memory first.
2. **Search.** Branch every failed episode (``turngym.rollout.branching.branch_search``): replay it
   up to the turns just before it first returned to a state it had visited, take the policy's
   ``branch_width`` runner-up replies there (its next most likely tokens at the reply's least
   certain token), and play each on greedily; ``branch_depth`` levels.
3. **Remember.** The memory keeps, per task, the best successful episode found so far (highest
   return, then fewest turns): a branch, or with ``clone_greedy`` the greedy episode itself.
4. **Clone.** ``actor_epochs`` passes of the NLL loss (``-log pi`` on the sampled tokens) over the
   valid turns of every remembered episode, plus the SFT stage's ``expert_replay`` demonstrations.

Why: after SFT on a few demonstrations the policy's wrong turns are confident (top probability
above 0.99 at the failing move), so temperature sampling, the exploration of RLOO, GRPO, GiGPO
and filtered BC, almost never tries the move that works, and the groups hold no contrast
(docs/experiments.md, 2026-11-25). The runner-up reply at the decisive token usually is that
move. Successes are searched for with the policy's own replies and the env's reward only: no
oracle, no admissible-command list. The memory is self-imitation learning's (Oh et al., 2018):
what a search found once keeps being trained on, so a fix does not fade when later searches move on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

from turngym.config import knob
from turngym.rewards.format import action_status
from turngym.rollout import EpisodeSpec
from turngym.rollout.branching import BRANCH_BY, branch_search
from turngym.rollout.handles import describe_env, tool_stops
from turngym.trainers import functional as Fn
from turngym.trainers.actor import actor_update
from turngym.trainers.distributed import DistContext
from turngym.trainers.sequences import pack_batch
from turngym.trainers.sft import expert_data
from turngym.trainers.trainer import OnlineConfig, OnlineTrainer, env_factory, screen_order
from turngym.types import Trajectory


@dataclass
class BranchBCConfig(OnlineConfig):
    """Knobs of branch-search BC (plus the shared ``OnlineConfig`` ones; ``episodes_per_iter`` is the
    number of training tasks screened per iteration)."""

    branch_points: int = knob(2, "turns to branch at in each failed episode: the one that first returned to a "
                                 "visited state and the ones before it")
    branch_width: int = knob(3, "alternative replies tried at each branch point (the policy's runner-ups)")
    branch_depth: int = knob(2, "search levels: failed branches are branched again after their branch turn")
    branch_by: str = knob("state_key", "how a branch point sees a return to an earlier state: observation (what the "
                                       "agent was shown) | state_key (the env's privileged world-state key)")
    clone_greedy: bool = knob(False, "remember the screen's greedy successes too (else only what the search found)")
    memory: bool = knob(True, "keep each task's best success across iterations and clone all of them every "
                              "iteration (False: only this iteration's)")
    expert_replay: int = knob(0, "the oracle's episodes on the first N training tasks (the SFT stage's data) join "
                                 "every update; 0 = off")
    pg_loss: str = knob("nll", "nll: -log pi on the remembered episodes' tokens (the only loss this trainer uses)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pg_loss != "nll":
            raise ValueError("branch_bc clones its episodes with the NLL loss: pg_loss must be nll")
        if self.branch_by not in BRANCH_BY:
            raise ValueError(f"branch_by must be one of {BRANCH_BY}, got {self.branch_by!r}")
        if min(self.branch_points, self.branch_width, self.branch_depth) < 1:
            raise ValueError("branch_points, branch_width and branch_depth must be >= 1")
        if self.expert_replay < 0:
            raise ValueError(f"expert_replay must be >= 0, got {self.expert_replay}")
        if self.group_size != 1:
            raise ValueError("branch_bc screens each task once (group_size=1); the search makes its groups")
        if self.async_staleness >= 0 or self.rollout_engine == "vllm" or self.sharding != "none":
            raise ValueError("branch_bc replays and branches episodes with the HF policy in one process "
                             "(async_staleness=-1, rollout_engine=hf, sharding=none)")


def better(a: Trajectory | None, b: Trajectory) -> bool:
    """Whether success ``b`` should replace ``a`` in the memory: higher return, then fewer turns."""
    if a is None:
        return True
    return (b.total_reward, -len(b.turns)) > (a.total_reward, -len(a.turns))


class BranchBCTrainer(OnlineTrainer):
    """Train ``policy`` (an ``HFPolicy``) on ``env_id`` by branch search and cloning (see the module doc)."""

    name = "branch_bc"

    def __init__(self, policy: Any, env_id: str, cfg: BranchBCConfig | None = None, *,
                 env_kwargs: dict | None = None, out_dir: str | Path = "runs/branch_bc", ctx: DistContext | None = None,
                 rollouts: Any = None, pools: Any = None) -> None:
        super().__init__(policy, env_id, cfg or BranchBCConfig(), env_kwargs=env_kwargs, out_dir=out_dir, ctx=ctx,
                         rollouts=rollouts, pools=pools)
        if self.ctx.enabled:
            raise ValueError("branch_bc runs in one process, not under torchrun")
        self.memory: dict[str, Trajectory] = {}
        self.screened: dict[str, int] = {}  # task -> the iteration it was last screened in
        self.experts: list[Trajectory] = []

    def _setup_extra(self) -> None:
        probe = gym.make(self.env_id, **self.env_kwargs)
        self.stops = tool_stops(describe_env(probe))
        probe.close()
        if self.cfg.expert_replay:
            self.experts = expert_data(self.policy, self.env_id, self.cfg.expert_replay, self.env_kwargs, self.cfg.seed,
                                   self.cfg.demo_seed)

    def pick_tasks(self) -> list[str]:
        """This iteration's screen: unsolved tasks first (no remembered success, and greedy play
        failed or never tried), then the ones screened longest ago; ties in a seeded order that
        changes every iteration."""
        solved = {t for t in self.task_ids if t in self.memory or self.greedy_outcomes.get(t, False)}
        return screen_order(self.task_ids, solved, self.screened, self.cfg.seed, self.iteration, self.cfg.episodes_per_iter)

    def step(self) -> dict[str, float]:
        cfg = self.cfg
        # 1. screen: one greedy episode per task (reset seeds fixed per task, so a replay is exact)
        specs = [EpisodeSpec(t, cfg.seed * 1_000_003 + self.task_ids.index(t), greedy=True) for t in self.pick_tasks()]
        roots, metrics = self.collect(specs)
        self.screened.update({s.task_id: self.iteration for s in specs})
        self.greedy_outcomes.update({r.task_id: bool(r.success) for r in roots})
        # 2. search from the failed ones
        t0 = time.perf_counter()
        found = branch_search(self.policy, env_factory(self.env_id, self.env_kwargs, cfg), list(zip(specs, roots)),
                              stops=self.stops, points=cfg.branch_points, width=cfg.branch_width,
                              depth=cfg.branch_depth, max_new_tokens=cfg.max_new_tokens, num_envs=cfg.num_envs,
                              workers=cfg.env_workers, pools=self.pools, by=cfg.branch_by)
        failed = {r.task_id for r in roots if not r.success}
        solved = {t.task_id for t in found if t.success}
        metrics.update({"search/seconds": time.perf_counter() - t0, "search/branches": float(len(found)),
                        "search/failed_tasks": float(len(failed)), "search/solved_tasks": float(len(solved)),
                        "search/solved_rate": len(solved) / max(1, len(failed))})
        metrics["rollout/env_steps"] += sum(len(t.turns) for t in found)  # replayed turns step the env too
        # 3. remember each task's best success
        if not cfg.memory:
            self.memory = {}
        for t in found + (roots if cfg.clone_greedy else []):
            if t.success and better(self.memory.get(t.task_id), t):
                self.memory[t.task_id] = t
        metrics["memory/tasks"] = float(len(self.memory))
        # 4. clone the remembered episodes and the demonstrations (A = 1 on valid turns)
        data = list(self.memory.values()) + self.experts
        if data:
            batch = pack_batch(data, self.policy.pad_id)
            adv = torch.tensor([float(action_status(data[ti].turns[k]) == "valid") for ti, k in batch.turn_refs])
            token_adv = Fn.broadcast_to_tokens(adv, batch.token_turn)
            metrics.update(actor_update(self.model, self.actor_opt, batch, token_adv, None, cfg, self.gen, self.ctx))
            metrics["actor/episodes"] = float(len(data))
        return self.finish_step(metrics)

    def _extra_state(self) -> dict:
        return {"memory": {k: t.to_dict() for k, t in self.memory.items()}, "screened": dict(self.screened)}

    def _load_extra_state(self, st: dict) -> None:
        self.memory = {k: Trajectory.from_dict(d) for k, d in st.get("memory", {}).items()}
        self.screened = dict(st.get("screened", {}))

