"""Plug-in ``best_of_n``: the actor imitates the best of N of its own replies by the critic's Q
(Digi-Q's policy extraction, Bai et al. 2025; not in ArCHer's paper).

At buffer states (whole episodes, as the paper's actor draws them), ``n`` fresh replies are sampled
from the actor as it stands, each is scored by min(Q1, Q2)(s, a), and the actor's likelihood of the
highest-scored one is raised (weight 1), in place of the policy gradient. Why: a policy gradient
with the critic's advantage moves the actor by the advantage's small differences between the reply
it sampled and the state's value; re-ranking several replies lets the critic pick among concrete
alternatives, and the update is a plain likelihood step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from turngym.config import knob
from turngym.trainers.archer.plugins import Plugin, register_plugin
from turngym.types import TokenRecord, Trajectory, Turn


@dataclass
class BestOfNConfig:
    """The replies the critic chooses among."""

    n: int = knob(4, "fresh replies sampled per state, the highest min(Q1, Q2) imitated")
    margin: float = knob(0.0, "imitate the best only where its Q beats the replies' mean Q by more than this")

    def __post_init__(self) -> None:
        if self.n < 2 or self.margin < 0:
            raise ValueError(f"best_of_n: n must be >= 2 and margin >= 0, got {self.n}, {self.margin}")


def best_rows(q: torch.Tensor, margin: float = 0.0) -> list[int | None]:
    """Per state (a row of ``q``, ``(S, n)``), the index of the reply to imitate: the highest Q, or None
    where it beats the state's mean Q by no more than ``margin`` (nothing to choose between)."""
    best = q.argmax(dim=1)
    gap = q.max(dim=1).values - q.mean(dim=1)
    return [int(b) if float(g) > margin else None for b, g in zip(best, gap)]


@register_plugin
class BestOfN(Plugin):
    name, config = "best_of_n", BestOfNConfig

    @torch.no_grad()
    def actor_rows(self, trainer: Any, metrics: dict) -> tuple[list[Trajectory], list[float]] | None:
        episodes = trainer.buffer.sample_episodes(trainer.cfg.actor_states)
        prompts = [trainer.buffer.prompt(i) for g in episodes for i in g]
        groups, start = [], 0
        for g in episodes:
            groups.append(list(range(start, start + len(g))))
            start += len(g)
        samples = [trainer.sample_replies(prompts, offset=100 + k, groups=groups) for k in range(self.cfg.n)]
        q = torch.stack([torch.minimum(*trainer.critic.q_values(*trainer.encoder.replies(
            prompts, [g.action_ids for g in gens], groups))) for gens in samples], dim=1)  # (states, n)
        rows = []
        for i, pick in enumerate(best_rows(q, self.cfg.margin)):
            reply = samples[pick][i] if pick is not None else None
            if reply is None or not reply.action_ids:
                continue
            rec = TokenRecord()
            rec.add_prompt(prompts[i])
            span = rec.add_action(reply.action_ids, reply.logprobs)
            rows.append(Trajectory("best_of_n", turns=[Turn("", span=span)], record=rec))
        metrics.update({"best_of_n/states": float(len(prompts)), "best_of_n/imitated": float(len(rows)),
                        "best_of_n/q_gap": float((q.max(dim=1).values - q.mean(dim=1)).mean())})
        return rows, [1.0] * len(rows)
