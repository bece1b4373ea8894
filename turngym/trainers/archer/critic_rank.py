"""Plug-in ``critic_rank``: the critic chooses which runner-ups the search plays (not in the paper).

At each branch point of the ``tree`` plug-in's search, ``pool`` runner-up replies are proposed and
the ``width`` with the highest min(Q1, Q2)(s, a) (plus ``prior`` x log pi(a | s), so the policy's own
preference counts too) are played, under the critic of the iterations before; the first iteration,
with no critic fitted yet, plays the policy's own order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from turngym.config import knob
from turngym.trainers.archer.plugins import Plugin, register_plugin
from turngym.types import Trajectory


@dataclass
class CriticRankConfig:
    """How the critic ranks a branch point's runner-ups."""

    pool: int = knob(8, "runner-ups proposed per branch point for the critic to choose from (more than tree.width)")
    prior: float = knob(0.0, "a reply's score is min(Q1, Q2)(s, a) + this x log pi(a | s); 0 = the critic alone")

    def __post_init__(self) -> None:
        if self.pool < 2 or self.prior < 0:
            raise ValueError(f"critic_rank: pool must be >= 2 and prior >= 0, got {self.pool}, {self.prior}")


def reply_scores(values: list[float], logprobs: list[list[float]], prior: float) -> list[float]:
    """Each reply's score: its value plus ``prior`` x its log-probability under the actor (the sum of
    its tokens' recorded log-probs)."""
    return [v + prior * sum(lp) for v, lp in zip(values, logprobs)] if prior else list(values)


@register_plugin
class CriticRank(Plugin):
    """Ranks the search's runner-ups by the critic (``search/ranked_*`` counts what it moved)."""

    name, config, needs = "critic_rank", CriticRankConfig, ("tree",)

    def setup(self, trainer: Any) -> None:
        tree = trainer.plugins.get("tree")
        if self.cfg.pool <= tree.cfg.width:
            raise ValueError(f"critic_rank.pool ({self.cfg.pool}) must be > tree.width ({tree.cfg.width})")
        tree.rank = self.ranker
        self.stats: dict[str, float] = {}

    def ranker(self, trainer: Any) -> dict | None:
        """The tree search's ``rank`` and ``pool`` arguments, once a critic has been fitted."""
        if not trainer.critic_steps:
            return None
        width = trainer.plugins.get("tree").cfg.width

        @torch.no_grad()
        def rank(points: list[tuple[Trajectory, int]], replies: list[list[Any]]) -> list[list[float]]:
            out = []
            for (traj, j), us in zip(points, replies):
                ids = [list(u.action_ids) for u in us if u.action_ids]
                q = iter(trainer.reply_values(traj.prompt_ids(j), ids) if ids else [])
                out.append([reply_scores([next(q)], [u.logprobs], self.cfg.prior)[0] if u.action_ids else -math.inf
                            for u in us])
            chosen = [i for xs in out for i in sorted(range(len(xs)), key=lambda i: -xs[i])[:width]]
            self.stats["search/ranked_points"] = self.stats.get("search/ranked_points", 0.0) + len(out)
            self.stats["search/ranked_off_policy"] = self.stats.get("search/ranked_off_policy", 0.0) + sum(
                i >= width for i in chosen)  # replies the policy's own first `width` would not have played
            return out

        return {"rank": rank, "pool": self.cfg.pool}

    def on_turns(self, trainer: Any, tree: Any, turns: Any, metrics: dict) -> None:
        metrics.update(self.stats)
        self.stats = {}
