"""SFT warm start on expert trajectories (TextWorld walkthroughs, gold queries, ...).

Experts are the envs' own oracles played through the normal rollout (``Collector.demonstrations``),
so the demonstrations are ordinary Trajectories whose actions are written in the env's tool format.
Their replies are recorded by the policy's chat renderer while they are played (``agents.scripted.Demonstrator``):
the exact, incremental token layout the policy later samples in during RL, in the same episode
record, with loss on the assistant tokens only.

Why our own loop and not TRL's ``SFTTrainer``: its assistant-only loss needs ``{% generation %}``
markers in the chat template, and it tokenizes each conversation in one go. Neither matches the
incremental layout (prompt(k+1) = prompt(k) + action(k) + env(k)) that RL trains on, and a warm
start on a different layout teaches token boundaries the policy never sees. The loop is twenty
lines; the loss is the mean negative log-likelihood of the expert's tokens.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from turngym.config import knob, seed_of
from turngym.rollout import Collector, EnvTarget
from turngym.trainers.actor import actor_optimizer, autocast, prepare_trainable
from turngym.trainers.checkpoint import has_checkpoint, load_checkpoint, save_checkpoint
from turngym.trainers.likelihood import likelihood_step
from turngym.trainers.logger import advance_bar, progress_bar
from turngym.trainers.stages import Section, register_section
from turngym.trainers.sequences import frozen_prefix, join_prefixes, pack_batch
from turngym.types import Trajectory


@dataclass
class SFTConfig:
    """Supervised warm start on the env's expert trajectories."""

    enabled: bool = knob(True, "run the SFT stage")
    episodes: int = knob(32, "expert episodes (cycling over the training tasks)")
    epochs: int = knob(2, "passes over the expert data")
    lr: float = knob(5e-5, "learning rate (AdamW)")
    batch_size: int = knob(4, "episodes per optimizer step")
    max_grad_norm: float = knob(1.0, "gradient clipping")
    trainable: str = knob("all", "all | top:K | lora (adapters are merged back after SFT)")
    autocast: str = knob("auto", "auto | bf16 | none: mixed precision for the forwards (see OnlineConfig)")
    seed: int | None = knob(None, "seeds the expert episodes, their draw and the data order (None: the run's seed, else 0)")
    demos: str = knob("first", "which training tasks the demonstrations come from: first (the first `episodes`) | "
                               "drawn (`episodes` drawn with the seed: each protocol seed sees its own)")
    demo_pool: int = knob(0, "demonstrations come from the first N training tasks only (0 = all), so a training "
                             "split grown for RL (train_env_kwargs) keeps the walkthroughs it had at N tasks")
    time_budget_s: float = knob(0.0, "stop after the optimizer step whose training seconds (the update loop, "
                                     "without making the expert data or on_step's work) reach this; 0 = no limit")

    def __post_init__(self) -> None:
        if self.episodes < 1 or self.epochs < 0 or self.batch_size < 1:
            raise ValueError("episodes and batch_size must be >= 1 and epochs >= 0")
        if self.time_budget_s < 0:
            raise ValueError(f"time_budget_s must be >= 0, got {self.time_budget_s}")
        if self.demo_pool < 0:
            raise ValueError(f"demo_pool must be >= 0 (0 = every training task), got {self.demo_pool}")
        if self.demos not in ("first", "drawn"):
            raise ValueError(f"demos must be first or drawn, got {self.demos!r}")

    def demo_choice(self) -> dict:
        """Which demonstrations this stage plays (``Collector.demonstrations``' arguments): the RL
        stages that replay them (``expert_replay``) choose the same ones."""
        seed = seed_of(self)
        return {"seed": seed, "demo_seed": seed if self.demos == "drawn" else -1, "pool": self.demo_pool}


def sft(policy: Any, env_id: str, cfg: SFTConfig | None = None, *, env_kwargs: dict | None = None,
        logger: Any = None, progress: bool = True, on_step: Callable[[dict], None] | None = None,
        collector: Collector | None = None, checkpoint_dir: str | Path | None = None,
        checkpoint_every_s: float = 600.0) -> dict[str, float]:
    """Warm-start ``policy.model`` in place on ``env_id``'s expert trajectories.

    Args:
        policy: An ``HFPolicy`` (``model``, ``chat``, ``pad_id``).
        env_id: The env whose oracle plays the expert episodes.
        cfg: The knobs; ``cfg.time_budget_s`` stops training early.
        env_kwargs: Env constructor overrides (the training split).
        logger: Gets ``sft/loss`` per optimizer step.
        progress: Show a progress bar.
        on_step: Called as ``on_step(metrics)`` after each optimizer step (``sft/step``,
            ``sft/loss``, ``sft/train_seconds``), in eval mode; its time is not training time.
        collector: Plays the demonstrations (default: one of its own, closed after).
        checkpoint_dir: Where a long fit (e.g. SFT continued for hours) saves its weights, optimizer
            and place in the data every ``checkpoint_every_s`` training seconds; a fit that finds a
            checkpoint there goes on from it, so a killed run loses at most that much training.

    Returns:
        Final metrics: ``sft/loss`` (last epoch's mean NLL per token), ``sft/episodes``, ``sft/seconds``,
        ``sft/train_seconds`` (the update loop less ``on_step``'s time) and ``sft/steps``.
    """
    cfg = cfg or SFTConfig()
    t0 = time.perf_counter()
    data = _expert_data(policy, env_id, cfg, env_kwargs, collector)
    model = policy.model = prepare_trainable(policy.model, cfg.trainable)
    saver = _Saver(Path(checkpoint_dir), checkpoint_every_s) if checkpoint_dir is not None else None
    metrics = _fit(policy, data, cfg, logger, progress, on_step, saver)
    model.eval()
    if hasattr(model, "merge_and_unload"):  # LoRA: fold the adapters back into plain weights
        policy.model = model.merge_and_unload()
    for p in policy.model.parameters():
        p.requires_grad_(True)  # the next stage chooses its own trainable set
    policy.invalidate_caches()
    return {**metrics, "sft/episodes": len(data), "sft/seconds": time.perf_counter() - t0}


def _expert_data(policy: Any, env_id: str, cfg: SFTConfig, env_kwargs: dict | None,
                 collector: Collector | None) -> list[Trajectory]:
    """The oracle's episodes on the training tasks, recorded as the policy's tokens
    (``Collector.demonstrations``)."""
    torch.manual_seed(seed_of(cfg))  # e.g. LoRA's initialisation: a resumed pipeline must redo SFT identically
    env = EnvTarget(env_id, dict(env_kwargs or {}))
    d = cfg.demo_choice()
    if collector is not None:
        return collector.demonstrations(env, cfg.episodes, d["seed"], d["demo_seed"], pool=d["pool"])
    with Collector(policy) as own:
        return own.demonstrations(env, cfg.episodes, d["seed"], d["demo_seed"], pool=d["pool"])


def _fit(policy: Any, data: list[Trajectory], cfg: SFTConfig, logger: Any, progress: bool,
         on_step: Callable[[dict], None] | None, saver: _Saver | None = None) -> dict[str, float]:
    """The update loop: ``cfg.epochs`` shuffled passes of the likelihood update (``likelihood_step``:
    the mean NLL of the demonstrations' tokens), or until ``cfg.time_budget_s``. With a ``saver``,
    it starts from the saved place if there is one and saves as it goes."""
    model = policy.model
    opt = actor_optimizer(model, cfg.lr)
    rng = random.Random(seed_of(cfg))
    at = _Place()
    if saver is not None and saver.exists():
        at = saver.restore(model, opt, rng)
    steps_per_epoch = (len(data) + cfg.batch_size - 1) // cfg.batch_size
    bar = progress_bar("sft", steps=cfg.epochs * steps_per_epoch, budget_s=cfg.time_budget_s, disable=not progress)
    model.train()
    epoch_loss = at.total / at.count if at.count else float("nan")
    step, hook_s = at.step, 0.0  # hook_s: time in on_step, not training time
    t_train = time.perf_counter()  # the budget counts updates only: the expert data is made once
    parts = []  # per demonstration, the frozen lower blocks' output, once for every epoch (trainable: top:K)
    if cfg.epochs > 1:
        parts = [frozen_prefix(model, pack_batch([t], policy.pad_id), 1, lambda: autocast(model, cfg.autocast))
                 for t in data]
    trained_s = lambda: at.trained_s + time.perf_counter() - t_train - hook_s
    over = lambda: bool(cfg.time_budget_s) and trained_s() >= cfg.time_budget_s
    spent = bool(cfg.time_budget_s) and at.trained_s >= cfg.time_budget_s  # saved at its budget, then killed
    for epoch in range(at.epoch, at.epoch if spent else cfg.epochs):
        order = at.order
        if order is None:
            order = list(range(len(data)))
            rng.shuffle(order)
        total, count = at.total, at.count
        for i in range(at.start, len(order), cfg.batch_size):
            batch = pack_batch([data[j] for j in order[i : i + cfg.batch_size]], policy.pad_id)
            batch = join_prefixes(batch, [parts[j] for j in order[i : i + cfg.batch_size]] if parts else [])
            every_token = torch.ones(batch.num_tokens)  # a demonstration is cloned whole
            loss = likelihood_step(model, opt, [(batch, every_token)], lr=cfg.lr, max_grad_norm=cfg.max_grad_norm,
                                   autocast_mode=cfg.autocast)["loss"]
            total, count, step = total + loss, count + 1, step + 1
            advance_bar(bar, trained_s())
            bar.set_postfix(loss=f"{loss:.3f}")
            if logger is not None:
                logger.log({"sft/loss": loss}, step=epoch * steps_per_epoch + count)
            if on_step is not None:
                h0, train_s = time.perf_counter(), trained_s()
                _call_in_eval_mode(model, policy, on_step, {"sft/step": step, "sft/loss": loss,
                                                            "sft/train_seconds": train_s})
                hook_s += time.perf_counter() - h0
            if saver is not None and saver.due(trained_s()):
                saver.save(model, opt, rng, _Place(epoch, order, i + cfg.batch_size, step, trained_s(), total, count))
            if over():
                break
        at = _Place(trained_s=at.trained_s)  # the next epoch starts afresh (its order from the rng)
        epoch_loss = total / max(count, 1)
        if over():
            break
    bar.close()
    return {"sft/loss": epoch_loss, "sft/train_seconds": trained_s(), "sft/steps": step}


@dataclass
class _Place:
    """Where a fit is: the epoch, its data order and the next batch's index, with the counters."""

    epoch: int = 0
    order: list[int] | None = None  # None: draw the epoch's order from the rng
    start: int = 0
    step: int = 0
    trained_s: float = 0.0
    total: float = 0.0
    count: int = 0


class _Saver:
    """Saves a fit's weights, optimizer, data rng and ``_Place`` every ``every_s`` training seconds
    (``trainers.checkpoint``: atomic, so a kill at any instant leaves the old save or the new)."""

    def __init__(self, path: Path, every_s: float) -> None:
        self.path, self.every_s, self.last_s = path, every_s, 0.0

    def exists(self) -> bool:
        return has_checkpoint(self.path)

    def due(self, trained_s: float) -> bool:
        return trained_s - self.last_s >= self.every_s

    def save(self, model: Any, opt: Any, rng: random.Random, place: _Place) -> None:
        save_checkpoint(self.path, {"model": model.state_dict(), "opt": opt.state_dict(),
                                    "data_rng": rng.getstate(), "place": asdict(place)})
        self.last_s = place.trained_s

    def restore(self, model: Any, opt: Any, rng: random.Random) -> _Place:
        state = load_checkpoint(self.path)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        rng.setstate(state["data_rng"])
        place = _Place(**state["place"])
        if place.order is not None and place.start >= len(place.order):  # saved after an epoch's last batch
            place = _Place(place.epoch + 1, None, 0, place.step, place.trained_s)
        self.last_s = place.trained_s
        return place


def _call_in_eval_mode(model: Any, policy: Any, fn: Callable[[dict], None], metrics: dict) -> None:
    """Run a hook (e.g. a held-out evaluation) on the model in eval mode, then resume training."""
    model.eval()
    policy.invalidate_caches()
    try:
        fn(metrics)
    finally:
        policy.invalidate_caches()
        model.train()


def save_policy_model(policy: Any, path: str | Path) -> Path:
    """Save the policy's model and tokenizer in Hugging Face format (LoRA adapters merged)."""
    path = Path(path)
    model = policy.model
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    model.save_pretrained(path)
    policy.tokenizer.save_pretrained(path)
    return path


def _quickstart() -> SFTConfig:
    # 8 walkthroughs to their plateau (8 epochs); the top 8 of SmolLM2's 30 blocks train
    return SFTConfig(episodes=8, epochs=8, lr=3e-4, batch_size=4, trainable="top:8")


register_section(Section("sft", SFTConfig, _quickstart, "SFT warm start"))
