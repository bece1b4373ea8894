"""``OnlineTrainer``: the loop every online trainer shares (ArCHer and the critic-free family), with
its ``OnlineConfig``. Episodes come from a ``turngym.rollout.Collector`` (task schedule, greedy
screens, env pools, the generation engine, async collection); this module only learns from them.

A subclass supplies ``step()`` (one collect -> update iteration, returning its metrics) and, if it
holds more state than the actor, ``_setup_extra``, ``_extra_state`` and ``_load_extra_state``.
The base owns setup (reference copy, trainable parameters, optimizer, reward transforms, task
list), the iteration loop with logging and checkpoints, and exact resume.

Data parallelism: with a multi-process ``DistContext`` (``torchrun`` / ``accelerate launch``) each
rank plays its shard of every iteration's episodes and gradients are averaged before each
optimizer step (``online.actor_update``); rank 0 alone logs and writes checkpoints, and every rank
resumes from them. With the default single-process context every call is a no-op.

Async collection (``cfg.async_staleness >= 0``): the Collector keeps playing the same task
schedule on a background thread while the trainer scores and updates; each iteration trains on
episodes at most ``async_staleness`` policy versions old (the PPO ratio uses the log-probs recorded
at sampling time, so stale samples are importance-corrected and clipped). Weight changes happen
under ``weights_lock`` so generation never sees a half-updated model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from turngym.agents.base import SamplingParams
from turngym.config import knob, refuse_unless, seed_of
from turngym.rewards import bind_policy, load_reward_state_dict, make_reward, reward_state_dict, wants_policy
from turngym.rollout import Collector, EnvTarget, EpisodeSpec, TaskSchedule
from turngym.rollout.engine import resolve_engine
from turngym.trainers.actor import actor_optimizer, frozen_copy, prepare_trainable, shard_model, use_bf16
from turngym.trainers.distributed import (
    DistContext,
    full_params,
    load_model_state_dict,
    load_optimizer_state_dict,
    model_state_dict,
    optimizer_state_dict,
)
from turngym.trainers.loop import IterativeTrainer
from turngym.types import Trajectory


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
    pg_loss: str = knob("auto", "ppo: the clipped surrogate | nll: -A log pi (SFT on the chosen tokens) | auto: the "
                                "algorithm's own (nll for filtered_bc, ppo otherwise)")
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
                                     "trainable all or top:K; see turngym/rollout/engine.py) | auto (vllm "
                                     "on a GPU where it is installed and the run allows it, else hf)")
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
    screen_every: int = knob(3, "task_sampling=greedy_failed: iterations between greedy screens of every training task")
    seed: int | None = knob(None, "seeds task order, sampling and minibatches (None: the run's seed, else 0)")
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
        for name in ("lora_r", "lora_alpha"):
            refuse_unless(self, name, self.trainable == "lora", "with trainable=lora")
        refuse_unless(self, "vllm", self.rollout_engine != "hf", "with rollout_engine=vllm or auto")
        refuse_unless(self, "screen_every", self.task_sampling == "greedy_failed", "with task_sampling=greedy_failed")

    def sampling(self, iteration: int) -> SamplingParams:
        # the seed depends only on (seed, iteration): a resumed run samples exactly as the original
        return SamplingParams(self.temperature, self.top_p, self.max_new_tokens, seed=seed_of(self) * 100_003 + iteration)


def resolve_rollout_engine(cfg: Any, distributed: bool = False) -> Any:
    """``cfg`` (an ``OnlineConfig``, or any config with ``rollout_engine`` and ``trainable``) with
    ``rollout_engine: auto`` decided (``rollout.engine.resolve_engine``): vLLM only where this run
    allows it (one process, synchronous collection, full weights)."""
    allowed = (not distributed and cfg.trainable != "lora" and getattr(cfg, "sharding", "none") == "none"
               and getattr(cfg, "async_staleness", -1) < 0)
    return dataclasses.replace(cfg, rollout_engine=resolve_engine(cfg.rollout_engine, allowed))


class OnlineTrainer(IterativeTrainer):
    """Train ``policy`` (an ``HFPolicy``) on ``env_id`` from the episodes it plays each iteration.

    Args:
        policy: Exposes ``model``, ``pad_id``, ``act`` and ``invalidate_caches``.
        env_id: A registered env; its ``task_ids`` (from ``env_kwargs``' split) are the training tasks.
        cfg: The trainer's config (an ``OnlineConfig`` subclass).
        env_kwargs: Env constructor overrides (e.g. ``{"split": "train", "tool_format": "xml"}``).
        out_dir: Checkpoints (``checkpoint/``), ``metrics.jsonl``, TensorBoard, the learning curve.
        ctx: The data-parallel context (default: single process).
        collector: Plays the episodes (env pools, generation engine); shared with the caller's
            evaluations (default: the trainer's own, built at setup and closed by ``close``).
        demos: The SFT stage's choice of demonstrations (``SFTConfig.demo_choice``), for ``expert_replay``.
    """

    name = "online"

    def __init__(self, policy: Any, env_id: str, cfg: OnlineConfig, *, env_kwargs: dict | None = None,
                 out_dir: str | Path = "runs/online", ctx: DistContext | None = None,
                 collector: Collector | None = None, demos: dict | None = None) -> None:
        ctx = ctx or DistContext()
        cfg = resolve_rollout_engine(cfg, ctx.enabled)  # auto -> vllm or hf, once
        self._init_loop(policy, env_id, cfg, out_dir, ctx)
        self.env_kwargs, self.demos, self.seed = dict(env_kwargs or {}), dict(demos or {}), seed_of(cfg)
        self.env = EnvTarget(env_id, self.env_kwargs, cfg.max_turns, cfg.max_state_visits)  # what training plays
        if cfg.rollout_engine == "vllm" and self.ctx.enabled:
            raise ValueError("rollout_engine=vllm runs in one process, not under torchrun")
        self.collector, self._own_collector = collector, collector is None  # built at setup when not given
        self._screen_metrics: dict[str, float] = {}  # merged into the iteration's metrics by finish_step

    # ----- setup ---------------------------------------------------------------------------
    def needs_reference(self) -> bool:
        """Whether a frozen copy of the starting policy is kept (KL anchor, critic features, and
        reward transforms that read the policy's features, such as SPA's progress estimator)."""
        return self.cfg.kl_coef > 0 or wants_policy(self.reward_fn)

    def setup(self) -> None:
        cfg = self.cfg
        torch.manual_seed(self.seed)
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
        self.actor_opt = actor_optimizer(self.model, cfg.actor_lr)
        self.gen = torch.Generator().manual_seed(self.seed)
        if self.ref is not None:
            bind_policy(self.reward_fn, self.ref)  # e.g. SPA reads the SFT'd policy's hidden states
        if self.collector is None:
            self.collector = Collector(self.policy, engine=cfg.rollout_engine, vllm=cfg.vllm, workers=cfg.env_workers,
                                       ctx=self.ctx)
        self.tasks = TaskSchedule(list(self.env.info.task_ids), self.seed, cfg.task_sampling, cfg.screen_every,
                                  greedy_first=cfg.greedy_in_group)
        self.task_ids = self.tasks.task_ids
        self._setup_extra()
        self._ready = True

    def _setup_extra(self) -> None:
        """Subclass state beyond the actor (critic, buffers)."""

    # ----- one iteration ---------------------------------------------------------------------
    def step(self) -> dict[str, float]:
        raise NotImplementedError

    def schedule(self, n: int, group_size: int = 1) -> list[EpisodeSpec]:
        """This iteration's episodes, drawn by the task schedule (``cfg.task_sampling``); a
        ``greedy_failed`` schedule first screens every training task greedily when it is due."""
        if self.tasks.needs_screen(self.iteration):
            self.screen()
        return self.tasks.specs(n, self.iteration, group_size)

    def screen(self) -> None:
        """Play every training task once greedily (``Collector.screen``); its env steps count, its
        episodes train nothing."""
        with full_params(self.model):
            self._screen_metrics, steps = self.collector.screen(self.env, self.tasks, self.cfg.sampling(self.iteration),
                                                                num_envs=self.cfg.num_envs, version=self.iteration)
        self.env_steps += steps

    def collect(self, specs: list, group_size: int = 1) -> tuple[list[Trajectory], dict]:
        """Play this rank's share of ``specs`` with the current policy; in async mode, take
        ``len(specs)`` episodes from the Collector's background stream instead (the same task schedule)."""
        cfg = self.cfg
        if cfg.async_staleness < 0:
            with full_params(self.model):  # a sharded model generates from full weights, without collectives
                trajs, metrics = self.collector.collect(self.env, specs, cfg.sampling(self.iteration), num_envs=cfg.num_envs,
                                                        group_size=group_size, version=self.iteration)
        else:
            if group_size > 1:
                raise ValueError("async collection streams episodes one at a time and cannot keep groups together; "
                                 "use group_size=1 (ArCHer, reinforce) or async_staleness=-1")
            if not self.collector.streaming:
                self.collector.stream(self.env, self.tasks, len(specs), self.iteration, cfg.sampling(self.iteration),
                                      num_envs=cfg.num_envs, max_staleness=cfg.async_staleness)
            trajs, metrics = self.collector.take(len(specs), self.iteration)
        self.tasks.record(trajs)
        return trajs, metrics

    def weights_lock(self):
        """Hold while changing the weights: background generation pauses (a no-op when synchronous)."""
        return self.collector.weights_lock()

    def finish_step(self, metrics: dict[str, float]) -> dict[str, float]:
        """Advance the counters after an iteration and add them (and a screen's) to its metrics."""
        metrics.update(self._screen_metrics)
        self._screen_metrics = {}
        metrics = super().finish_step(metrics)
        self.collector.set_version(self.iteration)  # the policy is now one version newer
        return metrics

    def close(self) -> None:
        """Stop background collection; close the Collector (its envs and vLLM engine) if this trainer made it."""
        if self.collector is None:
            return
        if self._own_collector:
            self.collector.close()
        else:
            self.collector.stop_stream()

    # ----- checkpoints (the loop saves and loads; this is what the actor side holds) -----------
    def _state(self) -> dict:
        return {"model": model_state_dict(self.model), "actor_opt": optimizer_state_dict(self.model, self.actor_opt),
                "gen": self.gen.get_state(), **self.tasks.state_dict(),
                "reward": reward_state_dict(self.reward_fn),  # e.g. SPA's estimator
                **self._extra_state()}

    def _load_state(self, st: dict) -> None:
        load_model_state_dict(self.model, st["model"])
        load_optimizer_state_dict(self.model, self.actor_opt, st["actor_opt"])
        self.gen.set_state(st["gen"])
        load_reward_state_dict(self.reward_fn, st.get("reward", {}))
        self.tasks.load_state_dict(st)
        self._load_extra_state(st)

    def _extra_state(self) -> dict:
        return {}

    def _load_extra_state(self, st: dict) -> None:
        pass
