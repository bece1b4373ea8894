"""Plug-in ``expert_replay``: the SFT stage's demonstrations join every weighted-likelihood update of
the other plug-ins (weight 1 on every turn), an anchor against drift as in PPO-ptx (not in the paper).
It never makes an update alone: with the paper's policy gradient it has nothing to join."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from turngym.config import knob
from turngym.trainers.archer.plugins import Plugin, register_plugin
from turngym.types import Trajectory


@dataclass
class ExpertReplayConfig:
    """Which demonstrations are replayed."""

    episodes: int = knob(8, "the oracle's episodes on this many training tasks, chosen as the SFT stage chose its own")

    def __post_init__(self) -> None:
        if self.episodes < 1:
            raise ValueError(f"expert_replay.episodes must be >= 1, got {self.episodes}")


@register_plugin
class ExpertReplay(Plugin):
    name, config, joins_only = "expert_replay", ExpertReplayConfig, True

    def setup(self, trainer: Any) -> None:
        d = trainer.demos
        self.experts: list[Trajectory] = trainer.collector.demonstrations(
            trainer.env, self.cfg.episodes, d.get("seed", trainer.seed), d.get("demo_seed", -1), pool=d.get("pool", 0))

    def actor_rows(self, trainer: Any, metrics: dict) -> tuple[list[Trajectory], list[float]] | None:
        return self.experts, [1.0] * sum(len(t.turns) for t in self.experts)
