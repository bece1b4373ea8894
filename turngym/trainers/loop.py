"""``IterativeTrainer``: the loop every iterative recipe shares, and nothing else.

It calls ``step()`` (one iteration, returning its metric row) until ``cfg.iterations`` or
``cfg.time_budget_s``, logs each row, checkpoints every ``cfg.checkpoint_every`` iterations and
resumes exactly from the last checkpoint. A recipe supplies ``setup``, ``step``, ``_state`` and
``_load_state`` (what its checkpoint holds beyond the counters), and ``close``. The online trainers
(``trainer.OnlineTrainer``: ArCHer and the critic-free family) and branch BC build on it.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from turngym.trainers.checkpoint import has_checkpoint, load_checkpoint, save_checkpoint
from turngym.trainers.distributed import DistContext
from turngym.trainers.logger import MetricsLogger, advance_bar, plot_learning_curve, progress_bar


class IterativeTrainer:
    """The iteration loop, logging, checkpoints and exact resume.

    Subclasses set ``self.cfg`` (with ``iterations``, ``time_budget_s``, ``checkpoint_every``),
    ``self.policy``, ``self.env_id``, ``self.ctx`` and ``self.out_dir`` (through ``_init_loop``).
    """

    name = "trainer"

    def _init_loop(self, policy: Any, env_id: str, cfg: Any, out_dir: str | Path, ctx: DistContext | None) -> None:
        self.policy, self.env_id, self.cfg = policy, env_id, cfg
        self.ctx = ctx or DistContext()
        self.out_dir = Path(out_dir)
        self.ckpt_dir = self.out_dir / "checkpoint"
        self.iteration = 0
        self.env_steps = 0
        self.env_episodes = 0  # episodes played in the env (a search's branches each count): the sample budget
        self.train_seconds = 0.0  # wall-clock spent in iterations and checkpoints, not in on_iteration
        self._ready = False
        self.progress = False  # whether step() shows bars for its phases (train() sets it)

    # ----- what a recipe supplies ------------------------------------------------------------
    def setup(self) -> None:
        raise NotImplementedError

    def step(self) -> dict[str, float]:
        raise NotImplementedError

    def _state(self) -> dict:
        """The recipe's checkpoint content beyond the counters (every rank calls it)."""
        return {}

    def _load_state(self, st: dict) -> None:
        pass

    def weights_lock(self) -> Any:
        """Hold while changing the weights (a recipe with background generation pauses it)."""
        return contextlib.nullcontext()

    def close(self) -> None:
        pass

    # ----- the loop -----------------------------------------------------------------------------
    def finish_step(self, metrics: dict[str, float]) -> dict[str, float]:
        """Advance the counters after an iteration and add them to its metrics."""
        self.iteration += 1
        self.env_steps += int(metrics["rollout/env_steps"])  # already summed over ranks
        self.env_episodes += int(metrics.get("rollout/episodes", 0))
        metrics["env_steps"], metrics["env_episodes"] = self.env_steps, self.env_episodes
        return metrics

    def done(self) -> bool:
        """Whether training is over: ``cfg.iterations`` reached or ``cfg.time_budget_s`` spent."""
        budget = self.cfg.time_budget_s
        return self.iteration >= self.cfg.iterations or bool(budget and self.train_seconds >= budget)

    def train(self, resume: bool = True, logger: MetricsLogger | None = None, progress: bool = True,
              on_iteration: Callable[[IterativeTrainer, dict], None] | None = None) -> list[dict]:
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
        self.progress = progress and main
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

    # ----- checkpoints --------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write the checkpoint (rank 0; the others wait for it, or first help gather a sharded model)."""
        path = Path(path)
        state = self._state()  # every rank: gathering a sharded model is collective
        if self.ctx.is_main:
            save_checkpoint(path, {**state, "iteration": self.iteration, "env_steps": self.env_steps,
                                   "env_episodes": self.env_episodes,
                                   "train_seconds": self.train_seconds, "config": asdict(self.cfg)})
        self.ctx.barrier()
        return path

    def load(self, path: str | Path) -> bool:
        """Restore the counters and the recipe's state from a checkpoint."""
        if not self._ready:
            self.setup()
        st = load_checkpoint(path)
        self._load_state(st)
        self.iteration, self.env_steps = st["iteration"], st["env_steps"]
        self.env_episodes = int(st.get("env_episodes", 0))
        self.train_seconds = float(st.get("train_seconds", 0.0))
        self.policy.invalidate_caches()
        return True
