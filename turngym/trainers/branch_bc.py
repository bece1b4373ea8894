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
4. **Clone.** ``actor_epochs`` passes of the likelihood update SFT uses (``likelihood.py``: ``-log pi``
   on the sampled tokens, plus ``kl_coef`` times a KL guard to the starting policy) over the valid
   turns of every remembered episode, plus the SFT stage's ``expert_replay`` demonstrations.

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
from typing import Any, Callable

import torch

from turngym.agents.base import SamplingParams
from turngym.clock import CLOCK, bar
from turngym.config import knob, refuse_unless, seed_of
from turngym.rewards.format import action_status
from turngym.rollout import Collector, EnvTarget, EpisodeSpec
from turngym.rollout.branching import BRANCH_BY, BRANCH_PICK
from turngym.rollout.schedule import run_seed, screen_order
from turngym.trainers import functional as Fn
from turngym.trainers.actor import actor_optimizer, autocast, frozen_copy, prepare_trainable, use_bf16
from turngym.trainers.distributed import DistContext, load_model_state_dict, model_state_dict
from turngym.trainers.likelihood import likelihood_step, optimizer_steps
from turngym.trainers.loop import IterativeTrainer
from turngym.trainers.trainer import resolve_rollout_engine
from turngym.trainers.stages import Section, register_section
from turngym.trainers.registry import Algorithm, register_algorithm
from turngym.trainers.sequences import frozen_prefix, pack_batch
from turngym.types import Trajectory


@dataclass
class BranchBCConfig:
    """Branch-search BC's knobs, and only its own: an unknown one is an error."""

    iterations: int = knob(8, "screen -> search -> clone rounds")
    episodes_per_iter: int = knob(16, "training tasks screened per iteration (one greedy episode each)")
    num_envs: int = knob(16, "episodes in flight while screening and searching")
    max_turns: int | None = knob(None, "override the env's turn limit")
    max_state_visits: int = knob(0, "end (truncate) an episode that reaches one env state this many times, e.g. 3 "
                                     "cuts a two-room loop short (0 = off)")
    max_new_tokens: int = knob(48, "length cap for one reply")
    env_workers: str = knob("local", "where envs run: local | thread | subprocess | ray")
    rollout_engine: str = knob("hf", "who plays the screens, the search and the evaluations: hf (the trained model "
                                     "itself) | vllm (a vLLM engine synced with the trained weights each iteration; "
                                     "trainable all or top:K) | auto (vllm on a GPU where it is installed, else hf)")
    vllm: dict = knob({}, "vLLM engine options when rollout_engine=vllm (as OnlineConfig.vllm)")
    branch_points: int = knob(2, "turns to branch at in each failed episode: the one that first returned to a "
                                 "visited state and the ones before it")
    branch_width: int = knob(3, "alternative replies tried at each branch point (the policy's runner-ups)")
    branch_depth: int = knob(2, "search levels: failed branches are branched again after their branch turn")
    branch_by: str = knob("state_key", "how a branch point sees a return to an earlier state: observation (what the "
                                       "agent was shown) | state_key (the env's privileged world-state key)")
    branch_pick: str = knob("latest", "which turns before that return to branch at: latest | uncertain (where the "
                                      "policy was least sure of its reply: its runner-ups there are near misses)")
    clone_greedy: bool = knob(False, "remember the screen's greedy successes too (else only what the search found)")
    memory: bool = knob(True, "keep each task's best success across iterations and clone all of them every "
                              "iteration (False: only this iteration's)")
    expert_replay: int = knob(0, "the oracle's episodes on N training tasks, chosen as the SFT stage chose its own, "
                                 "join every update; 0 = off")
    actor_lr: float = knob(2e-5, "learning rate of the clone update (AdamW)")
    actor_warmup_steps: int = knob(0, "optimizer steps over which the learning rate ramps linearly up to actor_lr")
    actor_epochs: int = knob(1, "passes over the remembered episodes per iteration")
    minibatch_size: int = knob(4, "episodes per optimizer step")
    micro_batch_size: int = knob(4, "episodes per forward/backward inside a step (gradient accumulation; 0 = all)")
    max_grad_norm: float = knob(1.0, "gradient clipping")
    kl_coef: float = knob(0.0, "weight of the KL(pi || starting policy) guard in the clone update")
    trainable: str = knob("all", "all | lora | top:K (only the top K transformer blocks)")
    lora_r: int = knob(16, "LoRA rank when trainable=lora")
    lora_alpha: int = knob(32, "LoRA alpha when trainable=lora")
    autocast: str = knob("auto", "auto | bf16 | none: mixed precision for the training forwards (see OnlineConfig)")
    seed: int | None = knob(None, "seeds the screen's task order and the minibatches (None: the run's seed, else 0)")
    checkpoint_every: int = knob(1, "iterations between checkpoints (0 = only at the end)")
    time_budget_s: float = knob(0.0, "stop after the iteration whose training seconds reach this; 0 = no limit")

    def __post_init__(self) -> None:
        if self.iterations < 0 or self.episodes_per_iter < 1 or self.num_envs < 1:
            raise ValueError("iterations must be >= 0, episodes_per_iter and num_envs >= 1")
        if self.branch_by not in BRANCH_BY:
            raise ValueError(f"branch_by must be one of {BRANCH_BY}, got {self.branch_by!r}")
        if self.branch_pick not in BRANCH_PICK:
            raise ValueError(f"branch_pick must be one of {BRANCH_PICK}, got {self.branch_pick!r}")
        if min(self.branch_points, self.branch_width, self.branch_depth) < 1:
            raise ValueError("branch_points, branch_width and branch_depth must be >= 1")
        if min(self.expert_replay, self.max_state_visits, self.actor_warmup_steps, self.micro_batch_size) < 0:
            raise ValueError("expert_replay, max_state_visits, actor_warmup_steps and micro_batch_size must be >= 0")
        if self.actor_epochs < 0 or self.minibatch_size < 1 or self.kl_coef < 0 or self.time_budget_s < 0:
            raise ValueError("actor_epochs, kl_coef and time_budget_s must be >= 0 and minibatch_size >= 1")
        if not (self.trainable in ("all", "lora") or self.trainable.startswith("top:")):
            raise ValueError(f"trainable must be all, lora or top:K, got {self.trainable!r}")
        if self.autocast not in ("auto", "bf16", "none"):
            raise ValueError(f"autocast must be auto, bf16 or none, got {self.autocast!r}")
        if self.env_workers not in ("local", "thread", "subprocess", "ray"):
            raise ValueError(f"env_workers must be local, thread, subprocess or ray, got {self.env_workers!r}")
        if self.rollout_engine not in ("hf", "vllm", "auto"):
            raise ValueError(f"rollout_engine must be hf, vllm or auto, got {self.rollout_engine!r}")
        if self.rollout_engine == "vllm" and self.trainable == "lora":
            raise ValueError("rollout_engine=vllm syncs full weights; with trainable=lora use rollout_engine=hf")
        for name in ("lora_r", "lora_alpha"):
            refuse_unless(self, name, self.trainable == "lora", "with trainable=lora")
        refuse_unless(self, "vllm", self.rollout_engine != "hf", "with rollout_engine=vllm or auto")


def better(a: Trajectory | None, b: Trajectory) -> bool:
    """Whether success ``b`` should replace ``a`` in the memory: higher return, then fewer turns."""
    if a is None:
        return True
    return (b.total_reward, -len(b.turns)) > (a.total_reward, -len(a.turns))


class BranchBCTrainer(IterativeTrainer):
    """Train ``policy`` (an ``HFPolicy``) on ``env_id`` by branch search and cloning (see the module doc).

    Args:
        policy, env_id, env_kwargs, out_dir: As for ``OnlineTrainer``.
        cfg: The knobs.
        ctx: Must be a single process (the search replays episodes with the policy itself).
        collector: Plays the screens and the search (default: its own, closed at the end).
        demos: The SFT stage's choice of demonstrations (``SFTConfig.demo_choice``) for ``expert_replay``.

    Raises:
        ValueError: under a multi-process context.
    """

    name = "branch_bc"

    def __init__(self, policy: Any, env_id: str, cfg: BranchBCConfig | None = None, *,
                 env_kwargs: dict | None = None, out_dir: str | Path = "runs/branch_bc", ctx: DistContext | None = None,
                 collector: Collector | None = None, demos: dict | None = None) -> None:
        cfg = cfg or BranchBCConfig()
        self._init_loop(policy, env_id, cfg, out_dir, ctx)
        self.seed, self.demos = seed_of(cfg), dict(demos or {})
        if self.ctx.enabled:
            raise ValueError("branch_bc runs in one process, not under torchrun")
        self.env_kwargs = dict(env_kwargs or {})
        self.env = EnvTarget(env_id, self.env_kwargs, cfg.max_turns, cfg.max_state_visits)
        self.collector, self._own_collector = collector, collector is None
        self.memory: dict[str, Trajectory] = {}  # task -> its best success found so far
        self.screened: dict[str, int] = {}  # task -> the iteration it was last screened in
        self.greedy_outcomes: dict[str, bool] = {}  # task -> whether its last screen succeeded
        self.experts: list[Trajectory] = []

    def setup(self) -> None:
        cfg = self.cfg
        torch.manual_seed(self.seed)
        self.ref = frozen_copy(self.policy.model) if cfg.kl_coef > 0 else None  # the KL guard's anchor
        self.policy.model = self.model = prepare_trainable(self.policy.model, cfg.trainable, cfg.lora_r, cfg.lora_alpha)
        if hasattr(self.policy, "generation_dtype"):  # sample in the update's precision
            bf16 = use_bf16(cfg.autocast, next(self.model.parameters()).device.type)
            self.policy.generation_dtype = torch.bfloat16 if bf16 else None
        self.actor_opt = actor_optimizer(self.model, cfg.actor_lr)
        self.gen = torch.Generator().manual_seed(self.seed)
        if self.collector is None:
            engine = resolve_rollout_engine(cfg).rollout_engine
            self.collector = Collector(self.policy, engine=engine, vllm=cfg.vllm, workers=cfg.env_workers)
        self.task_ids = list(self.env.info.task_ids)
        if cfg.expert_replay:
            d = self.demos
            self.experts = self.collector.demonstrations(self.env, cfg.expert_replay, d.get("seed", self.seed),
                                                        d.get("demo_seed", -1), pool=d.get("pool", 0))
        self._ready = True

    def pick_tasks(self) -> list[str]:
        """This iteration's screen: unsolved tasks first (no remembered success, and greedy play
        failed or never tried), then the ones screened longest ago; ties in a seeded order that
        changes every iteration."""
        solved = {t for t in self.task_ids if t in self.memory or self.greedy_outcomes.get(t, False)}
        return screen_order(self.task_ids, solved, self.screened, self.seed, self.iteration, self.cfg.episodes_per_iter)

    def step(self) -> dict[str, float]:
        """One iteration: screen, search, remember, clone. Returns its metrics."""
        cfg = self.cfg
        # 1. screen: one greedy episode per task (reset seeds fixed per task, so a replay is exact); a
        # failed one keeps its KV cache, from which the search scores its turns without prefilling them
        specs = [EpisodeSpec(t, run_seed(self.seed, self.task_ids.index(t)), greedy=True, keep_cache=True)
                 for t in self.pick_tasks()]
        greedy = SamplingParams(temperature=0.0, max_new_tokens=cfg.max_new_tokens, seed=run_seed(self.seed, self.iteration))
        with CLOCK.stage("screen"):
            roots, metrics = self.collector.collect(self.env, specs, greedy, num_envs=cfg.num_envs, version=self.iteration,
                                                    progress=self.progress and "screen")
        self.screened.update({s.task_id: self.iteration for s in specs})
        self.greedy_outcomes.update({r.task_id: bool(r.success) for r in roots})
        # 2. search from the failed ones
        t0 = time.perf_counter()
        with CLOCK.stage("search"):
            found = self.collector.branch_search(self.env, list(zip(specs, roots)), points=cfg.branch_points,
                                                 width=cfg.branch_width, depth=cfg.branch_depth,
                                                 max_new_tokens=cfg.max_new_tokens, num_envs=cfg.num_envs,
                                                 by=cfg.branch_by, pick=cfg.branch_pick, version=self.iteration,
                                                 progress=self.progress and "search")
        failed = {r.task_id for r in roots if not r.success}
        solved = {t.task_id for t in found if t.success}
        metrics.update({"search/seconds": time.perf_counter() - t0, "search/branches": float(len(found)),
                        "search/failed_tasks": float(len(failed)), "search/solved_tasks": float(len(solved)),
                        "search/solved_rate": len(solved) / max(1, len(failed))})
        metrics["rollout/env_steps"] += sum(len(t.turns) for t in found)  # replayed turns step the env too
        metrics["rollout/episodes"] = metrics.get("rollout/episodes", 0) + len(found)
        # 3. remember each task's best success
        if not cfg.memory:
            self.memory = {}
        for t in found + (roots if cfg.clone_greedy else []):
            if t.success and better(self.memory.get(t.task_id), t):
                self.memory[t.task_id] = t
        metrics["memory/tasks"] = float(len(self.memory))
        # 4. clone the remembered episodes and the demonstrations (weight 1 on valid turns)
        data = self.clone_data()
        if data:
            with CLOCK.stage("fit"):
                metrics.update(self.clone(data))
            metrics["actor/episodes"] = float(len(data))
        return self.finish_step(metrics)

    def clone_data(self) -> list[Trajectory]:
        """What a fit clones: the remembered episodes in task order (the minibatches must not depend
        on which branch the search happened to finish first), then the demonstrations."""
        return [self.memory[k] for k in sorted(self.memory)] + self.experts

    def clone(self, data: list[Trajectory], on_epoch: Callable[[int], None] | None = None) -> dict[str, float]:
        """``actor_epochs`` shuffled passes of the likelihood update over ``data``'s valid turns;
        ``on_epoch(epoch)`` after each (1-based), with the model in eval mode (an evaluation may run)."""
        cfg = self.cfg
        batch = pack_batch(data, self.policy.pad_id)
        valid = torch.tensor([float(action_status(data[ti].turns[k]) == "valid") for ti, k in batch.turn_refs])
        weights = Fn.broadcast_to_tokens(valid, batch.token_turn)
        rows, micro = batch.input_ids.shape[0], cfg.micro_batch_size or cfg.minibatch_size
        fit_bar = bar(cfg.actor_epochs * -(-rows // cfg.minibatch_size), "fit", "step", disable=not self.progress)
        if cfg.actor_epochs > 1:  # the frozen lower blocks' output, once for every epoch (trainable: top:K)
            batch = frozen_prefix(self.model, batch, micro, lambda: autocast(self.model, cfg.autocast),
                                  on_chunk=lambda done, n: fit_bar.set_postfix_str(f"frozen blocks {done}/{n} episodes"))
            fit_bar.set_postfix_str("")
        self.model.train()
        sums: dict[str, float] = {}
        steps = 0
        for epoch in range(cfg.actor_epochs):
            order = torch.randperm(rows, generator=self.gen).tolist()
            for i in range(0, rows, cfg.minibatch_size):
                step_rows = sorted(order[i : i + cfg.minibatch_size])
                chunks = []
                for j in range(0, len(step_rows), micro):
                    sub, keep = batch.select_rows(step_rows[j : j + micro])
                    chunks.append((sub, weights[keep]))
                lr = Fn.warmup_lr(cfg.actor_lr, optimizer_steps(self.actor_opt), cfg.actor_warmup_steps)
                stats = likelihood_step(self.model, self.actor_opt, chunks, lr=lr, max_grad_norm=cfg.max_grad_norm,
                                        autocast_mode=cfg.autocast, ref=self.ref, kl_coef=cfg.kl_coef, entropy=True)
                for k, v in stats.items():
                    sums[k] = sums.get(k, 0.0) + v
                steps += 1
                fit_bar.update(1)
            if on_epoch is not None:
                self.model.eval()
                on_epoch(epoch + 1)
                self.model.train()
        fit_bar.close()
        self.model.eval()
        # the NLL keeps the name the online trainers give their update's loss, so curves compare
        names = {"loss": "actor/pg_loss"}
        return {names.get(k, f"actor/{k}"): v / max(steps, 1) for k, v in sums.items()}

    # ----- lifetime and checkpoints --------------------------------------------------------------
    def close(self) -> None:
        if self.collector is not None and self._own_collector:
            self.collector.close()

    def _state(self) -> dict:
        return {"model": model_state_dict(self.model), "actor_opt": self.actor_opt.state_dict(),
                "gen": self.gen.get_state(), "greedy_outcomes": dict(self.greedy_outcomes),
                "memory": {k: t.to_dict() for k, t in self.memory.items()}, "screened": dict(self.screened)}

    def _load_state(self, st: dict) -> None:
        load_model_state_dict(self.model, st["model"])
        self.actor_opt.load_state_dict(st["actor_opt"])
        self.gen.set_state(st["gen"])
        self.greedy_outcomes = dict(st.get("greedy_outcomes", {}))
        self.memory = {k: Trajectory.from_dict(d) for k, d in st.get("memory", {}).items()}
        self.screened = dict(st.get("screened", {}))


register_algorithm(Algorithm("branch_bc", section="branch", config=BranchBCConfig, trainer=BranchBCTrainer,
                             help="branch search from greedy failures, clone what wins (the default)"))


def _quickstart() -> BranchBCConfig:
    # the quickstart's round (configs/quickstart.yaml says why each number): screen 64 games, runner-ups at
    # 2 points, 3 wide, 2 deep; clones fitted like the demonstrations (lr 3e-4, 8 passes); the reply cap from the env
    return BranchBCConfig(iterations=1, episodes_per_iter=64, num_envs=64, max_state_visits=3, max_new_tokens=0,
                          trainable="top:8", actor_lr=3e-4, actor_epochs=8, minibatch_size=4, micro_batch_size=4,
                          branch_points=2, branch_width=3, branch_depth=2, expert_replay=8)


register_section(Section("branch", BranchBCConfig, _quickstart, "branch-search BC (algo=branch_bc)"))
