"""Plug-in ``critic_probes``: what the critic knows, measured where it has not trained (a diagnostic).

Each iteration, before the critic trains on the new turns, their critic values are compared with
what the episodes actually earned:

- calibration: ``critic/q_mc_corr`` and ``critic/q_mc_mae`` (min(Q1, Q2)(s, a) against the
  discounted Monte Carlo return from that turn), ``critic/v_mc_corr`` (min(V1, V2)(s) likewise);
- ranking: ``critic/q_auc_success`` (does Q rank the turns of episodes that succeeded above those
  that failed?) and ``critic/adv_auc_success`` (the same for the actor's advantage Q - V);
- ``critic/adv_std``: how much the advantage the actor would get varies at all.

``critic_report`` computes the same on any episodes (e.g. a held-out evaluation's), from a trained
critic: ``scripts/critic_report.py``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from turngym.trainers.archer.expert_auc import auc
from turngym.trainers.archer.plugins import Plugin, register_plugin


def discounted_returns_after(refs: list[tuple[int, int]], rewards: list[list[float]], gamma: float) -> torch.Tensor:
    """``(N,)`` per flat turn ``(episode, turn)``: ``sum_k gamma^k r_{t+k}`` to the episode's end."""
    out = []
    for e, t in refs:
        out.append(sum(gamma**k * r for k, r in enumerate(rewards[e][t:])))
    return torch.tensor(out, dtype=torch.float32)


def pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    """The correlation of two ``(N,)`` tensors (NaN when either is constant)."""
    x, y = x - x.mean(), y - y.mean()
    denom = float(x.norm() * y.norm())
    return float((x * y).sum()) / denom if denom > 0 else float("nan")


@torch.no_grad()
def critic_report(critic: Any, s: Any, sa: Any, refs: list[tuple[int, int]], rewards: list[list[float]],
                  success: list[bool], gamma: float) -> dict[str, float]:
    """The critic's calibration and ranking on turns whose outcomes are known (see the module doc).

    Args:
        critic: An ``UtteranceCritic``.
        s, sa: Its inputs for the turns (``TurnEncoder.episodes``).
        refs: ``(episode, turn)`` of each row. rewards: per episode, per turn. success: per episode.
        gamma: The discount of the Monte Carlo returns (the critic's own).
    """
    state = critic.encode(s)
    q = torch.minimum(*critic.q_values(state, sa))
    v = torch.minimum(*critic.values(state))
    mc = discounted_returns_after(refs, rewards, gamma)
    won = torch.tensor([float(success[e]) for e, _ in refs])
    out = {"critic/q_mc_corr": pearson(q, mc), "critic/q_mc_mae": float((q - mc).abs().mean()),
           "critic/v_mc_corr": pearson(v, mc), "critic/adv_std": float((q - v).std()) if len(q) > 1 else 0.0,
           "critic/q_auc_success": auc(q, won), "critic/adv_auc_success": auc(q - v, won)}
    return {k: x for k, x in out.items() if not math.isnan(x)}


@register_plugin
class CriticProbes(Plugin):
    name = "critic_probes"

    def on_turns(self, trainer: Any, tree: Any, turns: Any, metrics: dict) -> None:
        metrics.update(critic_report(trainer.critic, turns.s, turns.sa, turns.refs, turns.rewards,
                                     [t.success for t in tree.episodes], trainer.cfg.gamma))
