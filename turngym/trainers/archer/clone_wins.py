"""Plug-in ``clone_wins``: the actor also clones each training task's best success the search found,
at weight 1 on its valid turns, kept across iterations: branch BC's update inside ArCHer (not in
the paper), so that what the critic adds is measured on top of that floor. ``greedy``: the screen's
own greedy wins are remembered too (branch BC's ``clone_greedy``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from turngym.config import knob
from turngym.rewards.format import action_status
from turngym.trainers.archer.plugins import Plugin, register_plugin
from turngym.trainers.branch_bc import better
from turngym.types import Trajectory


@dataclass
class CloneWinsConfig:
    """Which successes are cloned."""

    greedy: bool = knob(False, "also remember the screen's own greedy wins (else only what the search found)")


@register_plugin
class CloneWins(Plugin):
    name, config, needs = "clone_wins", CloneWinsConfig, ("tree",)

    def setup(self, trainer: Any) -> None:
        self.best: dict[str, Trajectory] = {}

    def on_turns(self, trainer: Any, tree: Any, turns: Any, metrics: dict) -> None:
        for ep, parent in zip(tree.episodes, tree.parent):
            if (parent >= 0 or self.cfg.greedy) and ep.success and better(self.best.get(ep.task_id), ep):
                self.best[ep.task_id] = ep

    def actor_rows(self, trainer: Any, metrics: dict) -> tuple[list[Trajectory], list[float]] | None:
        if not self.best:
            return None
        clones = [self.best[k] for k in sorted(self.best)]
        metrics["clone/episodes"] = float(len(clones))
        return clones, [float(action_status(t) == "valid") for ep in clones for t in ep.turns]

    def state_dict(self) -> dict:
        return {"best": {k: t.to_dict() for k, t in self.best.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.best = {k: Trajectory.from_dict(d) for k, d in state.get("best", {}).items()}
