"""Plug-in ``expert_auc``: does the critic's advantage rank the oracle's move first? (a diagnostic)

The env labels each step that played its oracle's move from the state it left (env kwarg
``expert_labels``; envs without an oracle label nothing, and nothing is logged). Each iteration logs
``critic/auc_expert``: how often A(s, a) of a turn that played the oracle's move is above A of one that
did not (before the critic trains on them), and ``critic/expert_rate``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from turngym.trainers.archer.plugins import Plugin, register_plugin


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """ROC AUC: P(score of a positive > score of a negative), ties 1/2; labels other than 0 and 1 (e.g.
    NaN) are ignored. NaN without a positive or a negative."""
    pos, neg = scores[labels == 1], scores[labels == 0]
    if pos.numel() == 0 or neg.numel() == 0:
        return float("nan")
    diff = pos[:, None] - neg[None, :]
    return float(((diff > 0).float() + 0.5 * (diff == 0).float()).mean())


@register_plugin
class ExpertAUC(Plugin):
    name = "expert_auc"

    def env_kwargs(self, kwargs: dict) -> dict:
        return {"expert_labels": True, **kwargs}

    @torch.no_grad()
    def on_turns(self, trainer: Any, tree: Any, turns: Any, metrics: dict) -> None:
        labels = [tree.episodes[e].turns[k].info.get("expert_match") for e, k in turns.refs]
        if all(y is None for y in labels):
            return
        y = torch.tensor([float("nan") if v is None else float(v) for v in labels])
        metrics["critic/expert_rate"] = float(y.nan_to_num(0.0).sum() / (~y.isnan()).sum())
        value = auc(trainer.critic.advantage(turns.s, turns.sa), y)
        if not math.isnan(value):
            metrics["critic/auc_expert"] = value
