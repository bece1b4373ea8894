"""``OnlineTrainer``: the loop every online trainer shares (ArCHer and the critic-free family), with
its ``OnlineConfig`` and the collection helpers (task schedule, rollout metrics).

A subclass supplies ``step()`` (one collect -> update iteration, returning its metrics) and, if it
holds more state than the actor, ``_setup_extra``, ``_extra_state`` and ``_load_extra_state``.
The base owns setup (reference copy, trainable parameters, optimizer, reward transforms, task
list), the iteration loop with logging and checkpoints, and exact resume.

Data parallelism: with a multi-process ``DistContext`` (``torchrun`` / ``accelerate launch``) each
rank plays its shard of every iteration's episodes and gradients are averaged before each
optimizer step (``online.actor_update``); rank 0 alone logs and writes checkpoints, and every rank
resumes from them. With the default single-process context every call is a no-op.

Async collection (``cfg.async_staleness >= 0``): an ``AsyncCollector`` keeps playing the same task
schedule on a background thread while the trainer scores and updates; each iteration trains on
episodes at most ``async_staleness`` policy versions old (the PPO ratio uses the log-probs recorded
at sampling time, so stale samples are importance-corrected and clipped). Weight changes happen
under ``weights_lock`` so generation never sees a half-updated model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import gymnasium as gym
import torch

from turngym.agents.base import SamplingParams
from turngym.config import knob
from turngym.envs.wrappers import make_revisit_limited
from turngym.rewards import bind_policy, load_reward_state_dict, make_reward, reward_state_dict, wants_policy
from turngym.rollout import AsyncCollector, EnvPools, EpisodeSpec, make_env_factory, rollout
from turngym.trainers import functional as Fn
from turngym.trainers.actor import frozen_copy, prepare_trainable, shard_model, use_bf16
from turngym.trainers.checkpoint import has_checkpoint, load_checkpoint, save_checkpoint
from turngym.trainers.distributed import (
    DistContext,
    full_params,
    load_model_state_dict,
    load_optimizer_state_dict,
    model_state_dict,
    optimizer_state_dict,
)
from turngym.trainers.logger import MetricsLogger, advance_bar, plot_learning_curve, progress_bar
from turngym.types import Trajectory

# task_sampling=greedy_failed: a task greedy decoding solved keeps a small chance of a group, so
# a fix that breaks it is still seen (and its successes still anchor the policy)
SOLVED_TASK_WEIGHT = 0.1


@dataclass
class OnlineConfig:
    """Knobs shared by ArCHer and the policy-gradient family."""

    iterations: int = knob(8, "collect -> update rounds")
    episodes_per_iter: int = knob(16, "episodes collected per iteration")
    group_size: int = knob(1, "episodes per task per iteration, played in a row from one reset seed")
    num_envs: int = knob(16, "episodes in flight during collection (the generation batch)")
    max_turns: int | None = knob(None, "override the env's turn limit")
    max_state_visits: int = knob(0, "end (truncate) a training episode that reaches one env state this many "
                                     "times, e.g. 3 cuts a two-room loop short (0 = off)")
    temperature: float = knob(1.0, "sampling temperature while collecting")
    top_p: float = knob(1.0, "nucleus mass while collecting")
    max_new_tokens: int = knob(48, "length cap for one utterance")
    gamma: float = knob(0.95, "discount between turns")
    reward: list = knob(["env"], "reward transforms, summed (see turngym.rewards)")
    actor_lr: float = knob(2e-5, "actor learning rate (AdamW)")
    actor_warmup_steps: int = knob(0, "optimizer steps over which the actor lr ramps linearly up to actor_lr "
                                      "(Adam's first steps move every weight by about lr, whatever its gradient)")
    clip_coef: float = knob(0.2, "PPO ratio clip; 0 disables clipping")
    pg_loss: str = knob("auto", "ppo: the clipped surrogate | nll: -A log pi (SFT on the chosen tokens) | auto: nll "
                                "for filtered_bc, ppo otherwise")
    kl_coef: float = knob(0.0, "weight of the KL(pi || reference) guard")
    ent_coef: float = knob(0.0, "weight of the entropy bonus")
    max_grad_norm: float = knob(1.0, "gradient clipping")
    minibatch_size: int = knob(4, "sequences (episodes) per actor optimizer step")
    micro_batch_size: int = knob(4, "sequences per forward/backward inside a step (gradient accumulation; 0 = all)")
    old_logprobs: str = knob("auto", "PPO ratio's old log-probs: sampled (recorded at sampling) | rescored (the "
                                     "update's precision path) | auto (rescored when the update runs in bf16)")
    actor_epochs: int = knob(1, "passes over each new batch")
    normalize_advantages: bool = knob(False, "standardise advantages over the batch")
    trainable: str = knob("all", "all | lora | top:K (only the top K transformer blocks)")
    lora_r: int = knob(16, "LoRA rank when trainable=lora")
    lora_alpha: int = knob(32, "LoRA alpha when trainable=lora")
    autocast: str = knob("auto", "auto | bf16 | none: mixed precision for the training forwards (weights stay fp32); "
                                 "auto = bf16 where the hardware has it (CUDA, AVX512-BF16/AMX CPUs)")
    sharding: str = knob("none", "none | fsdp: under torchrun, shard the actor's parameters, gradients and optimizer "
                                 "state over the ranks with FSDP2 (trainable all or top:K; see docs/scaling.md)")
    env_workers: str = knob("local", "where envs run: local | thread | subprocess | ray")
    rollout_engine: str = knob("hf", "who generates the episodes: hf (the trained model itself) | vllm (a vLLM "
                                     "engine synced with the trained weights before each collection; one process, "
                                     "trainable all or top:K; see turngym/trainers/rollout_engine.py) | auto (vllm "
                                     "where it is installed and the run allows it, else hf)")
    vllm: dict = knob({}, "vLLM engine options when rollout_engine=vllm (vllm.LLM keyword arguments, plus "
                            "kv_cache_gib; default max_model_len 4096, kv_cache_gib 4)")
    async_staleness: int = knob(-1, "-1: collect, then update; k >= 0: keep collecting on a background thread "
                                    "during updates, training on episodes at most k policy versions old")
    greedy_in_group: bool = knob(False, "play the first episode of every group greedily (temperature 0): the group then "
                                        "shows what sampling finds beyond greedy decoding's own play, and the critic-free "
                                        "trainers drop groups whose greedy episode already succeeded (held-out "
                                        "evaluation is greedy: those tasks need no change)")
    task_sampling: str = knob("uniform", "uniform: tasks drawn at random | contrast: tasks drawn with weight p(1 - p), "
                                         "p = the task's smoothed success rate in its last group, so groups that are "
                                         "likely to hold both outcomes are played more | greedy_failed: every "
                                         "screen_every iterations each training task is played once greedily, and "
                                         "groups go to the tasks greedy decoding fails (weight 1; solved ones 0.1) "
                                         "(synchronous collection, one process)")
    screen_every: int = knob(4, "task_sampling=greedy_failed: iterations between greedy screens of every training task")
    seed: int = knob(0, "seeds task order, sampling and minibatches")
    demo_seed: int = knob(-1, "expert_replay's demonstrations: the SFT stage's choice of training tasks (sft.demo_seed)")
    checkpoint_every: int = knob(1, "iterations between checkpoints (0 = only at the end)")
    time_budget_s: float = knob(0.0, "stop after the iteration whose training seconds (collect + update, "
                                     "not on_iteration's work) reach this; 0 = no limit")

    def __post_init__(self) -> None:
        if self.iterations < 0 or self.episodes_per_iter < 1:
            raise ValueError("iterations must be >= 0 and episodes_per_iter >= 1")
        if self.group_size < 1 or self.episodes_per_iter % self.group_size:
            raise ValueError(f"episodes_per_iter ({self.episodes_per_iter}) must be a multiple of group_size ({self.group_size})")
        if not (self.trainable in ("all", "lora") or self.trainable.startswith("top:")):
            raise ValueError(f"trainable must be all, lora or top:K, got {self.trainable!r}")
        if self.autocast not in ("auto", "bf16", "none"):
            raise ValueError(f"autocast must be auto, bf16 or none, got {self.autocast!r}")
        if not 0 <= self.gamma <= 1:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if self.old_logprobs not in ("auto", "sampled", "rescored"):
            raise ValueError(f"old_logprobs must be auto, sampled or rescored, got {self.old_logprobs!r}")
        if self.micro_batch_size < 0 or self.max_state_visits < 0:
            raise ValueError("micro_batch_size and max_state_visits must be >= 0")
        if self.actor_warmup_steps < 0:
            raise ValueError(f"actor_warmup_steps must be >= 0, got {self.actor_warmup_steps}")
        if self.time_budget_s < 0:
            raise ValueError(f"time_budget_s must be >= 0, got {self.time_budget_s}")
        if self.sharding not in ("none", "fsdp"):
            raise ValueError(f"sharding must be none or fsdp, got {self.sharding!r}")
        if self.sharding == "fsdp" and self.trainable == "lora":
            raise ValueError("sharding=fsdp supports trainable=all and top:K, not lora")
        if self.rollout_engine not in ("hf", "vllm", "auto"):
            raise ValueError(f"rollout_engine must be hf, vllm or auto, got {self.rollout_engine!r}")
        if self.rollout_engine == "vllm" and self.trainable == "lora":
            raise ValueError("rollout_engine=vllm syncs full weights; with trainable=lora use rollout_engine=hf")
        if self.rollout_engine == "vllm" and (self.sharding != "none" or self.async_staleness >= 0):
            raise ValueError("rollout_engine=vllm runs in one process with synchronous collection "
                             "(sharding=none, async_staleness=-1)")
        if self.pg_loss not in ("auto", "ppo", "nll"):
            raise ValueError(f"pg_loss must be auto, ppo or nll, got {self.pg_loss!r}")
        if self.greedy_in_group and self.async_staleness >= 0:
            raise ValueError("greedy_in_group keeps groups together: use async_staleness=-1")
        if self.task_sampling not in ("uniform", "contrast", "greedy_failed"):
            raise ValueError(f"task_sampling must be uniform, contrast or greedy_failed, got {self.task_sampling!r}")
        if self.task_sampling != "uniform" and self.async_staleness >= 0:
            raise ValueError(f"task_sampling={self.task_sampling} weights each iteration's tasks: use async_staleness=-1")
        if self.screen_every < 1:
            raise ValueError(f"screen_every must be >= 1, got {self.screen_every}")
        if self.env_workers not in ("local", "thread", "subprocess", "ray"):
            raise ValueError(f"env_workers must be local, thread, subprocess or ray, got {self.env_workers!r}")

    def sampling(self, iteration: int) -> SamplingParams:
        # the seed depends only on (seed, iteration): a resumed run samples exactly as the original
        return SamplingParams(self.temperature, self.top_p, self.max_new_tokens, seed=self.seed * 100_003 + iteration)


def resolve_rollout_engine(cfg: OnlineConfig, distributed: bool = False) -> OnlineConfig:
    """``cfg`` with ``rollout_engine: auto`` decided: ``vllm`` where vLLM is installed with a device
    it can use and the run allows it (one process, synchronous collection, full weights), else
    ``hf``. Where vLLM pays: on this 2-core CPU it generated 1.56x faster than HF on the quickstart's
    evaluation shape, but the whole default quickstart took as long with either (docs/experiments.md)."""
    if cfg.rollout_engine != "auto":
        return cfg
    from turngym.agents.vllm import vllm_available

    allowed = not distributed and cfg.trainable != "lora" and cfg.sharding == "none" and cfg.async_staleness < 0
    return dataclasses.replace(cfg, rollout_engine="vllm" if allowed and vllm_available() else "hf")


def screen_order(task_ids: list[str], solved: set[str], screened: dict[str, int], seed: int, iteration: int,
                 n: int) -> list[str]:
    """The ``n`` training tasks a greedy screen plays next: unsolved first, then the ones screened
    longest ago (never screened: -1), ties in a seeded order that changes every iteration."""
    order = list(task_ids)
    random.Random(seed * 1_000_003 + iteration).shuffle(order)
    rank = {t: i for i, t in enumerate(order)}
    return sorted(task_ids, key=lambda t: (t in solved, screened.get(t, -1), rank[t]))[:n]


def task_schedule(task_ids: list[str], n: int, seed: int, iteration: int, group_size: int = 1,
                  weights: list[float] | None = None, greedy_first: bool = False) -> list[EpisodeSpec]:
    """``n`` episodes for one iteration: tasks drawn by (seed, iteration), each repeated
    ``group_size`` times with one reset seed so a group replays the same start; with
    ``greedy_first`` the first episode of each group is played greedily.

    With ``weights`` (one per task, > 0), tasks are drawn in proportion to them and without
    replacement while there are tasks left (Efraimidis-Spirakis keys ``u ** (1 / w)``)."""
    rng = random.Random(seed * 1_000_003 + iteration)
    groups = max(1, n // group_size)
    if weights is None:
        picks = [task_ids[rng.randrange(len(task_ids))] for _ in range(groups)]
    else:
        keys = sorted(range(len(task_ids)), key=lambda i: -(rng.random() ** (1.0 / weights[i])))
        picks = [task_ids[keys[g % len(keys)]] for g in range(groups)]
    specs = []
    for g, task in enumerate(picks):
        reset_seed = seed * 1_000_003 + iteration * 1000 + g
        specs += [EpisodeSpec(task, reset_seed, greedy=greedy_first and k == 0) for k in range(group_size)]
    return specs


def collect(policy: Any, env_id: str, env_kwargs: dict, specs: list[EpisodeSpec], cfg: OnlineConfig, iteration: int,
            ctx: DistContext | None = None, group_size: int = 1,
            pools: EnvPools | None = None) -> tuple[list[Trajectory], dict]:
    """Roll out the current policy on this rank's share of ``specs`` (all of them in one process);
    ``pools`` keeps the envs open for the next collection.

    Returns:
        This rank's trajectories, and rollout metrics over every rank's episodes.
    """
    ctx = ctx or DistContext()
    specs = ctx.shard(specs, group_size)
    policy.invalidate_caches()  # the weights changed since the last collection
    sampling = cfg.sampling(iteration)
    sampling.seed = ctx.rank_seed(sampling.seed)  # ranks playing the same task must not sample alike
    t0 = time.perf_counter()
    trajs = rollout(policy, env_factory(env_id, env_kwargs, cfg), specs, sampling=sampling,
                    num_envs=cfg.num_envs, workers=cfg.env_workers, progress=False, pools=pools)
    metrics = rollout_metrics(trajs, time.perf_counter() - t0)
    return trajs, ctx.all_reduce_metrics(metrics, weight=len(trajs), sum_keys=("rollout/env_steps", "rollout/tokens_per_s"))


def env_factory(env_id: str, env_kwargs: dict, cfg: OnlineConfig):
    """The picklable env factory the trainer plays (with the config's turn limit)."""
    kwargs = dict(env_kwargs)
    if cfg.max_turns is not None:
        kwargs["max_turns"] = cfg.max_turns
    if cfg.max_state_visits:
        return functools.partial(make_revisit_limited, env_id, cfg.max_state_visits, **kwargs)
    return make_env_factory(env_id, **kwargs)


def rollout_metrics(trajs: list[Trajectory], dt: float) -> dict[str, float]:
    """Success, return, length, invalid-action rate and speed of a batch of episodes."""
    turns = sum(len(t.turns) for t in trajs)
    tokens = sum(len(x.action_ids) for t in trajs for x in t.turns)
    invalid = sum(1 for t in trajs for x in t.turns if not x.info.get("action_valid", False))
    return {
        "rollout/success": sum(t.success for t in trajs) / len(trajs),
        "rollout/return": sum(t.total_reward for t in trajs) / len(trajs),
        "rollout/turns": turns / len(trajs),
        "rollout/invalid_rate": invalid / max(turns, 1),
        "rollout/env_steps": turns,
        "rollout/tokens_per_s": tokens / dt if dt > 0 else 0.0,
        "rollout/seconds": dt,
    }


def split_task_ids(env_id: str, env_kwargs: dict) -> list[str]:
    """The task ids of the split an env is made with (the tasks a trainer plays)."""
    probe = gym.make(env_id, **env_kwargs)
    try:
        return list(probe.unwrapped.task_ids)
    finally:
        probe.close()

class OnlineTrainer:
    """Train ``policy`` (an ``HFPolicy``) on ``env_id``.

    Args:
        policy: Exposes ``model``, ``pad_id``, ``act`` and ``invalidate_caches``.
        env_id: A registered env; its ``task_ids`` (from ``env_kwargs``' split) are the training tasks.
        cfg: The trainer's config (an ``OnlineConfig`` subclass).
        env_kwargs: Env constructor overrides (e.g. ``{"split": "train", "tool_format": "xml"}``).
        out_dir: Checkpoints (``checkpoint/``), ``metrics.jsonl``, TensorBoard, the learning curve.
        ctx: The data-parallel context (default: single process).
        rollouts: A vLLM engine to sample with (default: built at setup when ``rollout_engine`` says so).
        pools: Env handles kept open across collections; shared with the caller's evaluations
            (default: the trainer's own, closed by ``close``).
    """

    name = "online"

    def __init__(self, policy: Any, env_id: str, cfg: OnlineConfig, *, env_kwargs: dict | None = None,
                 out_dir: str | Path = "runs/online", ctx: DistContext | None = None,
                 rollouts: Any = None, pools: EnvPools | None = None) -> None:
        self.ctx = ctx or DistContext()
        cfg = resolve_rollout_engine(cfg, self.ctx.enabled)  # auto -> vllm or hf, once
        self.policy, self.env_id, self.cfg = policy, env_id, cfg
        self.rollouts = rollouts  # the vLLM engine (rollout_engine=vllm); built at setup when not given
        self.env_kwargs = dict(env_kwargs or {})
        self.out_dir = Path(out_dir)
        self.ckpt_dir = self.out_dir / "checkpoint"
        if cfg.rollout_engine == "vllm" and self.ctx.enabled:
            raise ValueError("rollout_engine=vllm runs in one process, not under torchrun")
        self._own_rollouts = False
        self.pools, self._own_pools = (pools, False) if pools is not None else (EnvPools(), True)
        self._collector: AsyncCollector | None = None
        self.iteration = 0
        self.env_steps = 0
        self.train_seconds = 0.0  # wall-clock spent in iterations and checkpoints, not in on_iteration
        self.task_outcomes: dict[str, tuple[int, int]] = {}  # task -> (successes, episodes) of its last group
        self.greedy_outcomes: dict[str, bool] = {}  # task -> whether its last greedy screen succeeded
        self._screen_metrics: dict[str, float] = {}  # merged into the iteration's metrics by finish_step
        self._ready = False

    # ----- setup ---------------------------------------------------------------------------
    def needs_reference(self) -> bool:
        """Whether a frozen copy of the starting policy is kept (KL anchor, critic features, and
        reward transforms that read the policy's features, such as SPA's progress estimator)."""
        return self.cfg.kl_coef > 0 or wants_policy(self.reward_fn)

    def setup(self) -> None:
        cfg = self.cfg
        torch.manual_seed(cfg.seed)
        self.reward_fn = make_reward(cfg.reward)
        self.ref = frozen_copy(self.policy.model) if self.needs_reference() else None
        self.policy.model = prepare_trainable(self.policy.model, cfg.trainable, cfg.lora_r, cfg.lora_alpha)
        self.model = self.policy.model
        if hasattr(self.policy, "generation_dtype"):  # sample in the update's precision (see old_logprobs)
            bf16 = use_bf16(cfg.autocast, next(self.model.parameters()).device.type)
            self.policy.generation_dtype = torch.bfloat16 if bf16 else None
        self.ctx.broadcast_params(self.model)  # e.g. LoRA adapters start random on each rank
        if cfg.sharding == "fsdp":  # before the optimizer, which must hold the shards
            self.model = self.policy.model = shard_model(self.model, self.ctx)
        self.actor_opt = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=cfg.actor_lr)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        if self.ref is not None:
            bind_policy(self.reward_fn, self.ref)  # e.g. SPA reads the SFT'd policy's hidden states
        self.task_ids = split_task_ids(self.env_id, self.env_kwargs)
        if cfg.rollout_engine == "vllm" and self.rollouts is None:
            from turngym.trainers.rollout_engine import VLLMRollouts

            self.rollouts, self._own_rollouts = VLLMRollouts(self.policy, cfg.vllm), True
        self._setup_extra()
        self._ready = True

    def _setup_extra(self) -> None:
        """Subclass state beyond the actor (critic, buffers)."""

    # ----- one iteration ---------------------------------------------------------------------
    def step(self) -> dict[str, float]:
        raise NotImplementedError

    def schedule(self, n: int, group_size: int = 1) -> list[EpisodeSpec]:
        """This iteration's episodes (``task_schedule``), weighted by ``cfg.task_sampling``."""
        cfg = self.cfg
        weights = None
        if cfg.task_sampling == "contrast":
            weights = [Fn.contrast_weight(*self.task_outcomes.get(t, (0, 0))) for t in self.task_ids]
        if cfg.task_sampling == "greedy_failed":
            if self.iteration % cfg.screen_every == 0 or not self.greedy_outcomes:
                self.screen()
            weights = [SOLVED_TASK_WEIGHT if self.greedy_outcomes.get(t) else 1.0 for t in self.task_ids]
        return task_schedule(self.task_ids, n, cfg.seed, self.iteration, group_size, weights,
                             greedy_first=cfg.greedy_in_group and group_size > 1)

    def screen(self) -> None:
        """Play every training task once greedily (held-out evaluation is greedy) and remember
        which ones fail: ``task_sampling: greedy_failed`` spends its groups there. Its env steps
        count; its episodes train nothing."""
        if self.ctx.enabled:
            raise ValueError("task_sampling=greedy_failed screens in one process; not under torchrun")
        t0 = time.perf_counter()
        specs = [EpisodeSpec(t, self.cfg.seed * 1_000_003 + i, greedy=True) for i, t in enumerate(self.task_ids)]
        trajs, metrics = self._collect(specs, 1)
        self.greedy_outcomes = {t.task_id: bool(t.success) for t in trajs}
        self.env_steps += int(metrics["rollout/env_steps"])
        self._screen_metrics = {"screen/greedy_success": sum(self.greedy_outcomes.values()) / max(1, len(trajs)),
                                "screen/seconds": time.perf_counter() - t0}

    def record_outcomes(self, trajs: list[Trajectory]) -> None:
        """Remember each task's outcomes in this iteration (``task_sampling: contrast``)."""
        seen: dict[str, list[int]] = {}
        for t in trajs:
            s = seen.setdefault(t.task_id, [0, 0])
            s[0] += int(t.success)
            s[1] += 1
        self.task_outcomes.update({k: (v[0], v[1]) for k, v in seen.items()})

    def collect(self, specs: list, group_size: int = 1) -> tuple[list[Trajectory], dict]:
        """Play this rank's share of ``specs`` with the current policy; in async mode, take
        ``len(specs)`` episodes from the background collector instead (the same task schedule)."""
        trajs, metrics = self._collect(specs, group_size)
        self.record_outcomes(trajs)
        return trajs, metrics

    def _collect(self, specs: list, group_size: int = 1) -> tuple[list[Trajectory], dict]:
        if self.rollouts is not None:  # vLLM samples, from the weights of this iteration
            synced = self.rollouts.sync(self.model, version=self.iteration)
            trajs, metrics = collect(self.rollouts.policy, self.env_id, self.env_kwargs, specs, self.cfg, self.iteration,
                                     ctx=self.ctx, group_size=group_size, pools=self.pools)
            metrics["rollout/sync_seconds"] = self.rollouts.sync_seconds[-1] if synced else 0.0
            return trajs, metrics
        if self.cfg.async_staleness < 0:
            with full_params(self.model):  # a sharded model generates from full weights, without collectives
                return collect(self.policy, self.env_id, self.env_kwargs, specs, self.cfg, self.iteration,
                               ctx=self.ctx, group_size=group_size, pools=self.pools)
        if self._collector is None:
            self._start_collector(len(specs), group_size)
        t0 = time.perf_counter()
        trajs = self._collector.get(len(specs))
        metrics = rollout_metrics(trajs, time.perf_counter() - t0)  # seconds: time the trainer waited
        lag = [self.iteration - t.metadata.get("policy_version", self.iteration) for t in trajs]
        stats = self._collector.stats
        metrics.update({"async/staleness_mean": sum(lag) / len(lag), "async/staleness_max": float(max(lag)),
                        "async/dropped_stale": float(stats.get("dropped_stale", 0))})
        return trajs, metrics

    def _start_collector(self, n: int, group_size: int) -> None:
        if group_size > 1:
            raise ValueError("async collection streams episodes one at a time and cannot keep groups together; "
                             "use group_size=1 (ArCHer, reinforce) or async_staleness=-1")
        if self.ctx.enabled:
            raise ValueError("async collection runs in one process; use async_staleness=-1 with torchrun")
        cfg = self.cfg
        # the same tasks, in the same order, as synchronous collection would play from here on
        stream = (spec for it in itertools.count(self.iteration)
                  for spec in task_schedule(self.task_ids, n, cfg.seed, it))
        sampling = cfg.sampling(self.iteration)
        sampling.seed = None  # one stream of samples across iterations (async runs are not bit-reproducible)
        self._collector = AsyncCollector(
            self.policy, env_factory(self.env_id, self.env_kwargs, cfg), stream, batch_size=n,
            max_staleness=cfg.async_staleness, sampling=sampling, num_envs=cfg.num_envs,
            workers=cfg.env_workers, version=self.iteration,
        ).start()

    def weights_lock(self):
        """Hold while changing the weights: background generation pauses (a no-op when synchronous)."""
        return self._collector.weights_lock() if self._collector is not None else contextlib.nullcontext()

    def finish_step(self, metrics: dict[str, float]) -> dict[str, float]:
        """Advance the counters after an iteration and add them to its metrics."""
        metrics.update(self._screen_metrics)
        self._screen_metrics = {}
        self.iteration += 1
        self.env_steps += int(metrics["rollout/env_steps"])  # already summed over ranks
        metrics["env_steps"] = self.env_steps
        if self._collector is not None:
            self._collector.set_version(self.iteration)  # the policy is now one version newer
        return metrics

    def done(self) -> bool:
        """Whether training is over: ``cfg.iterations`` reached or ``cfg.time_budget_s`` spent."""
        budget = self.cfg.time_budget_s
        return self.iteration >= self.cfg.iterations or bool(budget and self.train_seconds >= budget)

    def close(self) -> None:
        """Stop the background collector, if any, and the envs and vLLM engine this trainer started."""
        if self._own_pools:
            self.pools.close()
        if self._collector is not None:
            self._collector.close()
            self._collector = None
        if self._own_rollouts and self.rollouts is not None:
            self.rollouts.close()
            self.rollouts, self._own_rollouts = None, False

    # ----- the loop -------------------------------------------------------------------------
    def train(self, resume: bool = True, logger: MetricsLogger | None = None, progress: bool = True,
              on_iteration: Callable[[OnlineTrainer, dict], None] | None = None) -> list[dict]:
        """Run until ``cfg.iterations`` (or ``cfg.time_budget_s``), logging every iteration and
        checkpointing every ``cfg.checkpoint_every``; resumes from ``out_dir/checkpoint`` when present.

        Args:
            resume: Continue from ``out_dir/checkpoint`` when there is one.
            logger: Where metric rows go (default: a ``MetricsLogger`` in ``out_dir``).
            progress: Show a progress bar.
            on_iteration: Called as ``on_iteration(trainer, metrics)`` after each iteration, before its
                checkpoint (a kill inside it replays the iteration), with background collection paused;
                its time is not counted in ``train_seconds`` (e.g. a held-out evaluation).

        Returns:
            The logged metric rows of this run.
        """
        if not self._ready:
            self.setup()
        resumed = resume and has_checkpoint(self.ckpt_dir) and self.load(self.ckpt_dir)
        main = self.ctx.is_main
        own_logger = logger is None and main
        if own_logger:
            logger = MetricsLogger(self.out_dir, config=asdict(self.cfg), resume=bool(resumed))
        if logger is not None and main:
            logger.truncate(self.iteration)  # rows past the checkpoint are replayed, not repeated
        cfg = self.cfg
        bar = progress_bar(self.name, steps=cfg.iterations, budget_s=cfg.time_budget_s, done_steps=self.iteration,
                           done_s=self.train_seconds, disable=not (progress and main))
        rows = []
        try:
            while not self.done():
                t0 = time.perf_counter()
                metrics = self.step()
                self.train_seconds += time.perf_counter() - t0
                metrics["train_seconds"] = self.train_seconds
                if logger is not None and main:
                    logger.log(metrics, step=self.iteration)
                rows.append(metrics)
                advance_bar(bar, self.train_seconds)
                bar.set_postfix(it=self.iteration, success=f"{metrics['rollout/success']:.2f}", steps=metrics["env_steps"])
                if on_iteration is not None:
                    with self.weights_lock():
                        on_iteration(self, metrics)
                every = cfg.checkpoint_every
                if (every and self.iteration % every == 0) or self.done():
                    t0 = time.perf_counter()
                    with self.weights_lock():  # a consistent snapshot while generation goes on
                        self.save(self.ckpt_dir)
                    self.train_seconds += time.perf_counter() - t0
        finally:
            self.close()
            self.policy.invalidate_caches()  # the last update changed the weights: no stale generating copy
        bar.close()
        if main and logger is not None:
            plot_learning_curve(logger.rows(), self.out_dir / "learning_curve.png", title=f"{self.name} on {self.env_id}")
        if own_logger:
            logger.close()
        return rows

    # ----- checkpoints ----------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write the checkpoint (rank 0; the others wait for it, or first help gather a sharded model)."""
        path = Path(path)
        model, actor_opt = model_state_dict(self.model), optimizer_state_dict(self.model, self.actor_opt)
        if self.ctx.is_main:
            save_checkpoint(path, {
                "model": model, "actor_opt": actor_opt,
                "gen": self.gen.get_state(), "iteration": self.iteration, "env_steps": self.env_steps,
                "train_seconds": self.train_seconds, "task_outcomes": dict(self.task_outcomes),
                "greedy_outcomes": dict(self.greedy_outcomes),
                "config": asdict(self.cfg), "reward": reward_state_dict(self.reward_fn),  # e.g. SPA's estimator
                **self._extra_state(),
            })
        self.ctx.barrier()
        return path

    def load(self, path: str | Path) -> bool:
        if not self._ready:
            self.setup()
        st = load_checkpoint(path)
        load_model_state_dict(self.model, st["model"])
        load_optimizer_state_dict(self.model, self.actor_opt, st["actor_opt"])
        self.gen.set_state(st["gen"])
        load_reward_state_dict(self.reward_fn, st.get("reward", {}))
        self.iteration, self.env_steps = st["iteration"], st["env_steps"]
        self.train_seconds = float(st.get("train_seconds", 0.0))
        self.task_outcomes = {k: tuple(v) for k, v in st.get("task_outcomes", {}).items()}
        self.greedy_outcomes = dict(st.get("greedy_outcomes", {}))
        self._load_extra_state(st)
        self.policy.invalidate_caches()
        return True

    def _extra_state(self) -> dict:
        return {}

    def _load_extra_state(self, st: dict) -> None:
        pass
