"""``OnlineTrainer``: the loop every online trainer shares (ArCHer and the critic-free family).

A subclass supplies ``step()`` (one collect -> update iteration, returning its metrics) and, if it
holds more state than the actor, ``_setup_extra``, ``_extra_state`` and ``_load_extra_state``.
The base owns setup (reference copy, trainable parameters, optimizer, reward transforms, task
list), the iteration loop with logging and checkpoints, and exact resume.

Data parallelism: with a multi-process ``DistContext`` (``torchrun`` / ``accelerate launch``) each
rank plays its shard of every iteration's episodes and gradients are averaged before each
optimizer step (``online.actor_update``); rank 0 alone logs and writes checkpoints, and every rank
resumes from them. With the default single-process context every call is a no-op.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from turngym.rewards import load_reward_state_dict, make_reward, reward_state_dict
from turngym.trainers.checkpoint import load_checkpoint, save_checkpoint
from turngym.trainers.distributed import DistContext
from turngym.trainers.logger import MetricsLogger, plot_learning_curve
from turngym.trainers.online import OnlineConfig, collect, frozen_copy, prepare_trainable, split_task_ids
from turngym.types import Trajectory


class OnlineTrainer:
    """Train ``policy`` (an ``HFPolicy``) on ``env_id``.

    Args:
        policy: Exposes ``model``, ``pad_id``, ``act`` and ``invalidate_caches``.
        env_id: A registered env; its ``task_ids`` (from ``env_kwargs``' split) are the training tasks.
        cfg: The trainer's config (an ``OnlineConfig`` subclass).
        env_kwargs: Env constructor overrides (e.g. ``{"split": "train", "tool_format": "xml"}``).
        out_dir: Checkpoints (``checkpoint/``), ``metrics.jsonl``, TensorBoard, the learning curve.
        ctx: The data-parallel context (default: single process).
    """

    name = "online"

    def __init__(self, policy: Any, env_id: str, cfg: OnlineConfig, *, env_kwargs: dict | None = None,
                 out_dir: str | Path = "runs/online", ctx: DistContext | None = None) -> None:
        self.policy, self.env_id, self.cfg = policy, env_id, cfg
        self.env_kwargs = dict(env_kwargs or {})
        self.out_dir = Path(out_dir)
        self.ckpt_dir = self.out_dir / "checkpoint"
        self.ctx = ctx or DistContext()
        self.iteration = 0
        self.env_steps = 0
        self._ready = False

    # ----- setup ---------------------------------------------------------------------------
    def needs_reference(self) -> bool:
        """Whether a frozen copy of the starting policy is kept (KL anchor, critic features)."""
        return self.cfg.kl_coef > 0

    def setup(self) -> None:
        cfg = self.cfg
        torch.manual_seed(cfg.seed)
        self.ref = frozen_copy(self.policy.model) if self.needs_reference() else None
        self.policy.model = prepare_trainable(self.policy.model, cfg.trainable, cfg.lora_r, cfg.lora_alpha)
        self.model = self.policy.model
        self.ctx.broadcast_params(self.model)  # e.g. LoRA adapters start random on each rank
        self.actor_opt = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=cfg.actor_lr)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.reward_fn = make_reward(cfg.reward)
        self.task_ids = split_task_ids(self.env_id, self.env_kwargs)
        self._setup_extra()
        self._ready = True

    def _setup_extra(self) -> None:
        """Subclass state beyond the actor (critic, buffers)."""

    # ----- one iteration ---------------------------------------------------------------------
    def step(self) -> dict[str, float]:
        raise NotImplementedError

    def collect(self, specs: list, group_size: int = 1) -> tuple[list[Trajectory], dict]:
        """Play this rank's share of ``specs`` with the current policy."""
        return collect(self.policy, self.env_id, self.env_kwargs, specs, self.cfg, self.iteration,
                       ctx=self.ctx, group_size=group_size)

    def finish_step(self, metrics: dict[str, float]) -> dict[str, float]:
        """Advance the counters after an iteration and add them to its metrics."""
        self.iteration += 1
        self.env_steps += int(metrics["rollout/env_steps"])  # already summed over ranks
        metrics["env_steps"] = self.env_steps
        return metrics

    # ----- the loop -------------------------------------------------------------------------
    def train(self, resume: bool = True, logger: MetricsLogger | None = None, progress: bool = True) -> list[dict]:
        """Run until ``cfg.iterations``, logging every iteration and checkpointing every
        ``cfg.checkpoint_every``; resumes from ``out_dir/checkpoint`` when present.

        Returns:
            The logged metric rows of this run.
        """
        if not self._ready:
            self.setup()
        resumed = resume and self.ckpt_dir.exists() and self.load(self.ckpt_dir)
        main = self.ctx.is_main
        own_logger = logger is None and main
        if own_logger:
            logger = MetricsLogger(self.out_dir, config=asdict(self.cfg), resume=bool(resumed))
        cfg = self.cfg
        bar = tqdm(total=cfg.iterations, initial=self.iteration, desc=self.name, disable=not (progress and main))
        rows = []
        while self.iteration < cfg.iterations:
            metrics = self.step()
            if logger is not None and main:
                logger.log(metrics, step=self.iteration)
            rows.append(metrics)
            bar.update(1)
            bar.set_postfix(success=f"{metrics['rollout/success']:.2f}", steps=metrics["env_steps"])
            every = cfg.checkpoint_every
            if (every and self.iteration % every == 0) or self.iteration == cfg.iterations:
                self.save(self.ckpt_dir)
        bar.close()
        if main and logger is not None:
            plot_learning_curve(logger.rows(), self.out_dir / "learning_curve.png", title=f"{self.name} on {self.env_id}")
        if own_logger:
            logger.close()
        return rows

    # ----- checkpoints ----------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write the checkpoint (rank 0; the others wait for it)."""
        path = Path(path)
        if self.ctx.is_main:
            save_checkpoint(path, {
                "model": self.model.state_dict(), "actor_opt": self.actor_opt.state_dict(),
                "gen": self.gen.get_state(), "iteration": self.iteration, "env_steps": self.env_steps,
                "config": asdict(self.cfg), "reward": reward_state_dict(self.reward_fn),  # e.g. SPA's estimator
                **self._extra_state(),
            })
        self.ctx.barrier()
        return path

    def load(self, path: str | Path) -> bool:
        if not self._ready:
            self.setup()
        st = load_checkpoint(path)
        self.model.load_state_dict(st["model"])
        self.actor_opt.load_state_dict(st["actor_opt"])
        self.gen.set_state(st["gen"])
        load_reward_state_dict(self.reward_fn, st.get("reward", {}))
        self.iteration, self.env_steps = st["iteration"], st["env_steps"]
        self._load_extra_state(st)
        self.policy.invalidate_caches()
        return True

    def _extra_state(self) -> dict:
        return {}

    def _load_extra_state(self, st: dict) -> None:
        pass
