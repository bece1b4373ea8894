"""What every online trainer shares: collect with the current policy, score with the frozen
reference, and the token-level actor update. ArCHer and the critic-free family differ only in how
they turn rewards into per-utterance advantages; that math lives in their own files.
"""

from __future__ import annotations

import copy
import random
import time
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

import torch

from turngym.agents.base import SamplingParams
from turngym.trainers import functional as Fn
from turngym.trainers.config import knob
from turngym.trainers.distributed import DistContext
from turngym.trainers.rollout import EpisodeSpec, make_env_factory, rollout
from turngym.trainers.sequences import PackedBatch, score
from turngym.types import Trajectory


@dataclass
class OnlineConfig:
    """Knobs shared by ArCHer and the policy-gradient family."""

    iterations: int = knob(8, "collect -> update rounds")
    episodes_per_iter: int = knob(16, "episodes collected per iteration")
    group_size: int = knob(1, "episodes per task per iteration, played in a row from one reset seed")
    num_envs: int = knob(16, "episodes in flight during collection (the generation batch)")
    max_turns: int | None = knob(None, "override the env's turn limit")
    temperature: float = knob(1.0, "sampling temperature while collecting")
    top_p: float = knob(1.0, "nucleus mass while collecting")
    max_new_tokens: int = knob(48, "length cap for one utterance")
    gamma: float = knob(0.95, "discount between turns")
    reward: list = knob(["env"], "reward transforms, summed (see turngym.rewards)")
    actor_lr: float = knob(2e-5, "actor learning rate (AdamW)")
    actor_warmup_steps: int = knob(0, "optimizer steps over which the actor lr ramps linearly up to actor_lr "
                                      "(Adam's first steps move every weight by about lr, whatever its gradient)")
    clip_coef: float = knob(0.2, "PPO ratio clip; 0 disables clipping")
    kl_coef: float = knob(0.0, "weight of the KL(pi || reference) guard")
    ent_coef: float = knob(0.0, "weight of the entropy bonus")
    max_grad_norm: float = knob(1.0, "gradient clipping")
    minibatch_size: int = knob(4, "sequences (episodes) per actor optimizer step")
    actor_epochs: int = knob(1, "passes over each new batch")
    normalize_advantages: bool = knob(False, "standardise advantages over the batch")
    trainable: str = knob("all", "all | lora | top:K (only the top K transformer blocks)")
    lora_r: int = knob(16, "LoRA rank when trainable=lora")
    lora_alpha: int = knob(32, "LoRA alpha when trainable=lora")
    autocast: str = knob("bf16", "bf16 | none: mixed precision for the training forwards (weights stay fp32)")
    env_workers: str = knob("local", "where envs run: local | thread | subprocess | ray")
    async_staleness: int = knob(-1, "-1: collect, then update; k >= 0: keep collecting on a background thread "
                                    "during updates, training on episodes at most k policy versions old")
    seed: int = knob(0, "seeds task order, sampling and minibatches")
    checkpoint_every: int = knob(1, "iterations between checkpoints (0 = only at the end)")

    def __post_init__(self) -> None:
        if self.iterations < 0 or self.episodes_per_iter < 1:
            raise ValueError("iterations must be >= 0 and episodes_per_iter >= 1")
        if self.group_size < 1 or self.episodes_per_iter % self.group_size:
            raise ValueError(f"episodes_per_iter ({self.episodes_per_iter}) must be a multiple of group_size ({self.group_size})")
        if not (self.trainable in ("all", "lora") or self.trainable.startswith("top:")):
            raise ValueError(f"trainable must be all, lora or top:K, got {self.trainable!r}")
        if self.autocast not in ("bf16", "none"):
            raise ValueError(f"autocast must be bf16 or none, got {self.autocast!r}")
        if not 0 <= self.gamma <= 1:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if self.actor_warmup_steps < 0:
            raise ValueError(f"actor_warmup_steps must be >= 0, got {self.actor_warmup_steps}")
        if self.env_workers not in ("local", "thread", "subprocess", "ray"):
            raise ValueError(f"env_workers must be local, thread, subprocess or ray, got {self.env_workers!r}")

    def sampling(self, iteration: int) -> SamplingParams:
        # the seed depends only on (seed, iteration): a resumed run samples exactly as the original
        return SamplingParams(self.temperature, self.top_p, self.max_new_tokens, seed=self.seed * 100_003 + iteration)


def prepare_trainable(model: torch.nn.Module, trainable: str, lora_r: int = 16, lora_alpha: int = 32) -> torch.nn.Module:
    """Set which parameters train: ``all``, ``lora`` (PEFT adapters on every linear layer) or
    ``top:K`` (the last K transformer blocks and the final norm).

    ``top:K`` makes backward stop at block N-K: on a CPU it is the cheapest way to adapt a model
    (about 7x cheaper than ``all`` for K=8 of SmolLM2's 30 blocks, measured on 2 cores).

    Returns:
        The model to train (a PEFT wrapper for ``lora``, else ``model`` itself).
    """
    if trainable == "lora":
        from peft import LoraConfig, get_peft_model

        lcfg = LoraConfig(r=lora_r, lora_alpha=lora_alpha, target_modules="all-linear", task_type="CAUSAL_LM")
        return get_peft_model(model, lcfg)
    for p in model.parameters():
        p.requires_grad_(trainable == "all")
    if trainable.startswith("top:"):
        k = int(trainable.split(":")[1])
        layers = _blocks(model)
        for block in layers[len(layers) - k :]:
            for p in block.parameters():
                p.requires_grad_(True)
        norm = getattr(model.base_model, "norm", None)
        if norm is not None:
            for p in norm.parameters():
                p.requires_grad_(True)
    elif trainable != "all":
        raise ValueError(f"trainable must be all, lora or top:K, got {trainable!r}")
    return model


def autocast(model: torch.nn.Module, mode: str):
    """Mixed-precision context for a training forward (``bf16``) or a no-op (``none``)."""
    device = next(model.parameters()).device.type
    return torch.autocast(device, dtype=torch.bfloat16, enabled=mode == "bf16")


def _blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    for m in model.modules():
        if isinstance(m, torch.nn.ModuleList) and len(m) > 1:
            return m
    raise ValueError("cannot find the model's transformer blocks for trainable=top:K")


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """The reference: a frozen copy of the starting policy (KL anchor and critic encoder)."""
    ref = copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def task_schedule(task_ids: list[str], n: int, seed: int, iteration: int, group_size: int = 1) -> list[EpisodeSpec]:
    """``n`` episodes for one iteration: tasks shuffled by (seed, iteration), each repeated
    ``group_size`` times with one reset seed so a group replays the same start."""
    rng = random.Random(seed * 1_000_003 + iteration)
    groups = max(1, n // group_size)
    picks = [task_ids[rng.randrange(len(task_ids))] for _ in range(groups)]
    specs = []
    for g, task in enumerate(picks):
        specs += [EpisodeSpec(task, seed * 1_000_003 + iteration * 1000 + g)] * group_size
    return specs


def collect(policy: Any, env_id: str, env_kwargs: dict, specs: list[EpisodeSpec], cfg: OnlineConfig, iteration: int,
            ctx: DistContext | None = None, group_size: int = 1) -> tuple[list[Trajectory], dict]:
    """Roll out the current policy on this rank's share of ``specs`` (all of them in one process).

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
                    num_envs=cfg.num_envs, workers=cfg.env_workers, progress=False)
    metrics = rollout_metrics(trajs, time.perf_counter() - t0)
    return trajs, ctx.all_reduce_metrics(metrics, weight=len(trajs), sum_keys=("rollout/env_steps", "rollout/tokens_per_s"))


def env_factory(env_id: str, env_kwargs: dict, cfg: OnlineConfig):
    """The picklable env factory the trainer plays (with the config's turn limit)."""
    kwargs = dict(env_kwargs)
    if cfg.max_turns is not None:
        kwargs["max_turns"] = cfg.max_turns
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


@torch.no_grad()
def reference_pass(ref: torch.nn.Module, batch: PackedBatch, hidden: bool, mode: str = "none") -> tuple[torch.Tensor, torch.Tensor | None]:
    """Reference log-probs ``(M,)`` of the policy tokens, and final hidden states ``(B, T, H)``
    (fp32) if asked."""
    with autocast(ref, mode):
        out = score(ref, batch, hidden=hidden)
    return out.logprobs.float(), None if out.hidden is None else out.hidden.float()


def actor_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: PackedBatch,
    token_adv: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    cfg: OnlineConfig,
    gen: torch.Generator,
    ctx: DistContext | None = None,
) -> dict[str, float]:
    """Token-level policy gradient: clipped surrogate with the given per-token advantages, plus
    the KL and entropy guards, over minibatches of sequences.

    Args:
        token_adv: ``(M,)`` advantage of each scored token (its utterance's, or token-level).
        ref_logprobs: ``(M,)`` reference log-probs (needed when ``kl_coef > 0``).
        ctx: Data-parallel context: gradients are averaged over ranks before clipping. Every rank
            must hold the same number of sequences (``DistContext.shard`` gives equal shares).

    Returns:
        Mean metrics over the minibatch steps.
    """
    model.train()
    ctx = ctx or DistContext()
    B = batch.input_ids.shape[0]
    params = [p for p in model.parameters() if p.requires_grad]
    sums: dict[str, float] = {}
    steps = 0
    for _ in range(cfg.actor_epochs):
        order = torch.randperm(B, generator=gen).tolist()
        i = 0
        # ranks step jointly: one with fewer sequences contributes a zero gradient to the average
        while (i < B) if not ctx.enabled else ctx.any_rank(i < B):
            optimizer.zero_grad(set_to_none=True)
            rows = sorted(order[i : i + cfg.minibatch_size])
            stats = _minibatch_backward(model, batch, rows, token_adv, ref_logprobs, cfg) if rows else None
            ctx.all_reduce_grads(params)
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            lr = Fn.warmup_lr(cfg.actor_lr, _optimizer_steps(optimizer, params), cfg.actor_warmup_steps)
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.step()
            i += cfg.minibatch_size
            if stats is not None:
                stats["actor/grad_norm"] = float(grad_norm)
                for k, v in stats.items():
                    sums[k] = sums.get(k, 0.0) + v
                steps += 1
    model.eval()
    return {k: v / max(steps, 1) for k, v in sums.items()}


def _optimizer_steps(optimizer: torch.optim.Optimizer, params: list) -> int:
    """Steps the optimizer has taken (its own counter, so a resumed run continues the warm-up)."""
    step = optimizer.state.get(params[0], {}).get("step", 0) if params else 0
    return int(step)


def _minibatch_backward(model: torch.nn.Module, batch: PackedBatch, rows: list[int], token_adv: torch.Tensor,
                        ref_logprobs: torch.Tensor | None, cfg: OnlineConfig) -> dict[str, float]:
    """Loss of one minibatch of sequences: clipped surrogate + KL guard - entropy bonus; runs
    ``backward`` and returns the minibatch's metrics."""
    sub, keep = batch.select_rows(rows)
    with autocast(model, cfg.autocast):
        out = score(model, sub, entropy=True)  # entropy is always logged
    adv = token_adv[keep].to(out.logprobs.device)
    old = sub.old_logprobs.to(adv.device)
    ones = torch.ones_like(adv)
    pg_loss, clip_frac = Fn.clipped_pg_loss(out.logprobs, old, adv, ones, cfg.clip_coef)
    loss = pg_loss
    kl = torch.zeros(())
    if ref_logprobs is not None:
        kl = Fn.masked_mean(Fn.kl_k3(out.logprobs, ref_logprobs[keep].to(adv.device)), ones)
        if cfg.kl_coef > 0:
            loss = loss + cfg.kl_coef * kl
    entropy = out.entropy.mean()
    if cfg.ent_coef > 0:
        loss = loss - cfg.ent_coef * entropy
    loss.backward()
    return {"actor/pg_loss": pg_loss.item(), "actor/kl": kl.item(), "actor/entropy": entropy.item(),
            "actor/clip_frac": float(clip_frac), "actor/logprob_drift": (out.logprobs.detach() - old).abs().mean().item()}


def advantage_stats(adv: torch.Tensor, prefix: str = "adv") -> dict[str, float]:
    if adv.numel() == 0:
        return {}
    return {f"{prefix}/mean": adv.mean().item(), f"{prefix}/std": adv.std(unbiased=False).item(),
            f"{prefix}/min": adv.min().item(), f"{prefix}/max": adv.max().item()}


def split_task_ids(env_id: str, env_kwargs: dict) -> list[str]:
    """The task ids of the split an env is made with (the tasks a trainer plays)."""
    probe = gym.make(env_id, **env_kwargs)
    try:
        return list(probe.unwrapped.task_ids)
    finally:
        probe.close()
