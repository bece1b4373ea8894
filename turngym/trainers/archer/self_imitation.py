"""Plug-in ``self_imitation``: the actor also clones its own turns that earned more than the critic
expected (self-imitation learning, Oh et al. 2018; not in ArCHer's paper).

Every own turn whose episode earned a return after it is remembered (``memory`` of them); each
update clones those whose weight ``weight x (R - V(s))+`` is at least ``min_weight``, with V the
current critic's (``baseline=zero``: V = 0, every remembered win at ``weight x R``, an ablation in
which the critic moves nothing). Wins the env confirmed: they train whatever the critic's gate says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from turngym.config import knob
from turngym.trainers.archer.awr import alone
from turngym.trainers.archer.encoder import select_rows, stack_rows
from turngym.trainers.archer.plugins import Plugin, register_plugin
from turngym.trainers.sequences import nest_turns
from turngym.types import Trajectory


def self_imitation_weights(returns: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """``scale * max(R - V(s), 0)``, ``(N,)``: 0 where the episode earned no more than V."""
    return scale * (returns - values).clamp(min=0.0)


@dataclass
class SelfImitationConfig:
    """Cloning the agent's own wins."""

    weight: float = knob(1.0, "each remembered win trains at this x (R - V(s))+")
    baseline: str = knob("critic", "critic: V(s) of the current critic | zero: V = 0 (an ablation)")
    memory: int = knob(2048, "wins remembered (oldest out first)")
    min_weight: float = knob(0.05, "a win whose weight is under this is not trained on")

    def __post_init__(self) -> None:
        if self.weight <= 0 or self.memory < 1 or self.min_weight < 0 or self.baseline not in ("critic", "zero"):
            raise ValueError("self_imitation: weight must be > 0, memory >= 1, min_weight >= 0, baseline critic or zero")


@register_plugin
class SelfImitation(Plugin):
    name, config = "self_imitation", SelfImitationConfig

    def setup(self, trainer: Any) -> None:
        self.wins: list[dict] = []

    def on_turns(self, trainer: Any, tree: Any, turns: Any, metrics: dict) -> None:
        for i in turns.own:
            if float(turns.returns[i]) > 0:
                e, k = turns.refs[i]
                self.wins.append({"turn": alone(tree.episodes[e], k), "s": select_rows(turns.s, torch.tensor([i])),
                                  "value": float(turns.returns[i])})
        del self.wins[: max(0, len(self.wins) - self.cfg.memory)]

    @torch.no_grad()
    def actor_rows(self, trainer: Any, metrics: dict) -> tuple[list[Trajectory], list[float]] | None:
        if not self.wins:
            return None
        returns = torch.tensor([e["value"] for e in self.wins])
        if self.cfg.baseline == "zero":
            v = torch.zeros_like(returns)
        else:
            v = trainer.critic.value(_cat_single([e["s"] for e in self.wins]))
        w = self_imitation_weights(returns, v, self.cfg.weight)
        keep = [i for i in range(len(self.wins)) if float(w[i]) >= self.cfg.min_weight]
        metrics.update({"sil/turns": float(len(keep)), "sil/memory": float(len(self.wins)),
                        "sil/weight": float(w[keep].mean()) if keep else 0.0})
        # an episode's kept turns in one row: each turn alone would re-read its whole prompt
        return nest_turns([self.wins[i]["turn"] for i in keep], [float(w[i]) for i in keep])

    def state_dict(self) -> dict:
        return {"wins": [{**e, "turn": e["turn"].to_dict()} for e in self.wins]}

    def load_state_dict(self, state: dict) -> None:
        self.wins = [{**e, "turn": Trajectory.from_dict(e["turn"])} for e in state.get("wins", [])]


def _cat_single(rows: list) -> Any:
    """One-row selections (``select_rows`` with one index) into one batch."""
    if isinstance(rows[0], tuple):
        return torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows])
    return torch.cat(rows)
