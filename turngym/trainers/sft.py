"""SFT warm start on expert trajectories (TextWorld walkthroughs, gold queries, ...).

Experts are the envs' own oracles played through the normal rollout, so the demonstrations are
ordinary Trajectories whose actions are written in the env's tool format. They are tokenized by
replaying them through the policy's chat renderer (``turngym.agents.chat``): the exact,
incremental token layout the policy later samples in during RL, with loss on the assistant
tokens only.

Why our own loop and not TRL's ``SFTTrainer``: its assistant-only loss needs ``{% generation %}``
markers in the chat template, and it tokenizes each conversation in one go. Neither matches the
incremental layout (prompt(k+1) = prompt(k) + action(k) + env(k)) that RL trains on, and a warm
start on a different layout teaches token boundaries the policy never sees. The loop is twenty
lines; the loss is the mean negative log-likelihood of the expert's tokens.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import gymnasium as gym
import torch

from turngym.agents.base import Conversation
from turngym.agents.scripted import OracleAgent
from turngym.config import knob
from turngym.rollout import episode_specs, make_env_factory, rollout
from turngym.rollout.handles import describe_env
from turngym.trainers.actor import autocast, prepare_trainable
from turngym.trainers.logger import advance_bar, progress_bar
from turngym.trainers.sequences import pack_batch, score
from turngym.types import Message, Trajectory, Turn


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
    seed: int = knob(0, "seeds the expert episodes and the data order")
    demo_seed: int = knob(-1, "which training tasks the demonstrations come from: -1 = the first `episodes` tasks; "
                              "k >= 0 = `episodes` tasks drawn with seed k (protocol seeds see different demonstrations)")
    time_budget_s: float = knob(0.0, "stop after the optimizer step whose training seconds (the update loop, "
                                     "without making the expert data or on_step's work) reach this; 0 = no limit")

    def __post_init__(self) -> None:
        if self.episodes < 1 or self.epochs < 0 or self.batch_size < 1:
            raise ValueError("episodes and batch_size must be >= 1 and epochs >= 0")
        if self.time_budget_s < 0:
            raise ValueError(f"time_budget_s must be >= 0, got {self.time_budget_s}")


def demo_task_ids(task_ids: list[str], episodes: int, demo_seed: int = -1) -> list[str]:
    """The tasks demonstrations are played on: the first ``episodes`` (``demo_seed`` -1), or
    ``episodes`` drawn without replacement by ``demo_seed`` (cycling when there are fewer tasks)."""
    if demo_seed < 0:
        return list(task_ids)
    order = list(task_ids)
    random.Random(demo_seed).shuffle(order)
    return order[: max(1, min(episodes, len(order)))]


def expert_trajectories(env_id: str, episodes: int, env_kwargs: dict | None = None, seed: int = 0,
                        demo_seed: int = -1) -> list[Trajectory]:
    """Play the env's oracle on its (training) tasks (``demo_task_ids``); only successful episodes are kept."""
    kwargs = {**(env_kwargs or {}), "scripted_hints": True}
    probe = gym.make(env_id, **kwargs)
    task_ids = demo_task_ids(list(probe.unwrapped.task_ids), episodes, demo_seed)
    probe.close()
    trajs = rollout(OracleAgent(), make_env_factory(env_id, **kwargs), episode_specs(task_ids, episodes, seed), progress=False)
    return [t for t in trajs if t.success]


def tokenize_expert(policy: Any, traj: Trajectory, tools: list, tool_format: str) -> Trajectory:
    """Give an expert trajectory the token ids the policy would have: prompts through the policy's
    chat renderer, actions as the expert's text plus the template's end-of-turn token."""
    chat = policy.chat
    end = chat.encode(chat.turn_end)[:1]
    end = end if end and end[0] in chat.end_token_ids else sorted(chat.end_token_ids)[:1]
    conv = Conversation(list(traj.initial_observation), list(tools), tool_format)
    turns = []
    for turn in traj.turns:
        prompt = chat.prompt_ids(conv)
        action = chat.encode(turn.action_text) + end
        chat.record(conv, action)
        conv.messages.append(Message("assistant", turn.action_text))
        conv.messages.extend(turn.observation)
        turns.append(Turn(turn.action_text, list(turn.tool_calls), list(turn.observation), turn.reward, dict(turn.info),
                          prompt_ids=prompt, action_ids=action, action_logprobs=[0.0] * len(action)))
    return Trajectory(traj.task_id, turns, traj.outcome, traj.terminated, traj.truncated, dict(traj.metadata),
                      list(traj.initial_observation))


def sft(policy: Any, env_id: str, cfg: SFTConfig | None = None, *, env_kwargs: dict | None = None,
        logger: Any = None, progress: bool = True, on_step: Callable[[dict], None] | None = None) -> dict[str, float]:
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

    Returns:
        Final metrics: ``sft/loss`` (last epoch's mean NLL per token), ``sft/episodes``, ``sft/seconds``,
        ``sft/train_seconds`` (the update loop less ``on_step``'s time) and ``sft/steps``.
    """
    cfg = cfg or SFTConfig()
    t0 = time.perf_counter()
    data = _expert_data(policy, env_id, cfg, env_kwargs)
    model = policy.model = prepare_trainable(policy.model, cfg.trainable)
    metrics = _fit(policy, data, cfg, logger, progress, on_step)
    model.eval()
    if hasattr(model, "merge_and_unload"):  # LoRA: fold the adapters back into plain weights
        policy.model = model.merge_and_unload()
    for p in policy.model.parameters():
        p.requires_grad_(True)  # the next stage chooses its own trainable set
    policy.invalidate_caches()
    return {**metrics, "sft/episodes": len(data), "sft/seconds": time.perf_counter() - t0}


def _expert_data(policy: Any, env_id: str, cfg: SFTConfig, env_kwargs: dict | None) -> list[Trajectory]:
    torch.manual_seed(cfg.seed)  # e.g. LoRA's initialisation: a resumed pipeline must redo SFT identically
    return expert_data(policy, env_id, cfg.episodes, env_kwargs, cfg.seed, cfg.demo_seed)


def expert_data(policy: Any, env_id: str, episodes: int, env_kwargs: dict | None = None,
                seed: int = 0, demo_seed: int = -1) -> list[Trajectory]:
    """The oracle's successful episodes on ``episodes`` training tasks (``expert_trajectories``),
    tokenized for ``policy`` (``tokenize_expert``): the SFT stage's data.

    Raises:
        RuntimeError: the oracle solved none of them.
    """
    probe = gym.make(env_id, **(env_kwargs or {}))
    desc = describe_env(probe)
    probe.close()
    experts = expert_trajectories(env_id, episodes, env_kwargs, seed, demo_seed)
    if not experts:
        raise RuntimeError(f"the oracle of {env_id} solved no episode; nothing to imitate")
    return [tokenize_expert(policy, t, desc["tools"], desc["tool_format"]) for t in experts]


def _fit(policy: Any, data: list[Trajectory], cfg: SFTConfig, logger: Any, progress: bool,
         on_step: Callable[[dict], None] | None) -> dict[str, float]:
    """The update loop: ``cfg.epochs`` shuffled passes, or until ``cfg.time_budget_s``."""
    model = policy.model
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr)
    rng = random.Random(cfg.seed)
    steps_per_epoch = (len(data) + cfg.batch_size - 1) // cfg.batch_size
    bar = progress_bar("sft", steps=cfg.epochs * steps_per_epoch, budget_s=cfg.time_budget_s, disable=not progress)
    model.train()
    epoch_loss, step, hook_s = float("nan"), 0, 0.0  # hook_s: time in on_step, not training time
    t_train = time.perf_counter()  # the budget counts updates only: the expert data is made once
    trained_s = lambda: time.perf_counter() - t_train - hook_s
    over = lambda: bool(cfg.time_budget_s) and trained_s() >= cfg.time_budget_s
    for epoch in range(cfg.epochs):
        order = list(range(len(data)))
        rng.shuffle(order)
        total, count = 0.0, 0
        for i in range(0, len(order), cfg.batch_size):
            batch = pack_batch([data[j] for j in order[i : i + cfg.batch_size]], policy.pad_id)
            with autocast(model, cfg.autocast):
                loss = -score(model, batch).logprobs.mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            opt.step()
            total, count, step = total + loss.item(), count + 1, step + 1
            advance_bar(bar, trained_s())
            bar.set_postfix(loss=f"{loss.item():.3f}")
            if logger is not None:
                logger.log({"sft/loss": loss.item()}, step=epoch * steps_per_epoch + count)
            if on_step is not None:
                h0, train_s = time.perf_counter(), trained_s()
                _call_in_eval_mode(model, policy, on_step, {"sft/step": step, "sft/loss": loss.item(),
                                                            "sft/train_seconds": train_s})
                hook_s += time.perf_counter() - h0
            if over():
                break
        epoch_loss = total / max(count, 1)
        if over():
            break
    bar.close()
    return {"sft/loss": epoch_loss, "sft/train_seconds": trained_s(), "sft/steps": step}


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
