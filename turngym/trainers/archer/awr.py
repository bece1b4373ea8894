"""Plug-in ``awr``: the actor learns at a search tree's forks by advantage-weighted regression (not in
the paper, whose actor is a policy gradient on fresh replies).

At the states of the actor's memory (this and earlier iterations' sibling groups, from plug-in
``tree``), each valid sibling's likelihood is weighted by its share of
pi*(a | s) ~ pi(a | s) exp(A(s, a) / beta) (``sibling_awr_weights``), A from the current critic (or,
``values=returns``, what each sibling's episode earned: the tree alone, an ablation). Only states
where another valid sibling beats the policy's own reply by ``margin`` and the target moves at least
``min_shift`` of probability train, the ``groups`` that move most; siblings under ``min_weight`` of
their state are left out. Why a weighted likelihood: the runner-ups are forced, not sampled (after SFT
pi gives them ~0.003), and a ratio-based update on such tokens cannot move them. With plug-in
``sibling_auc``, the forks train only while its gate is open.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from turngym.config import knob
from turngym.rewards.format import action_status
from turngym.trainers.archer.encoder import cat_rows, select_rows
from turngym.trainers.archer.plugins import Plugin, register_plugin
from turngym.types import Trajectory


# ----- the math ----------------------------------------------------------------------------------
def sibling_awr_weights(logp: torch.Tensor, adv: torch.Tensor, groups: list[list[int]], beta: float) -> torch.Tensor:
    """AWR (Peng et al. 2019) formed exactly on the replies seen at each state:
    ``w_i = softmax_{i in group}(log pi(a_i | s) + A_i / beta)``; each group's weights sum to 1.

    Args:
        logp: ``(N,)`` log pi(a_i | s), as recorded when sampled or forced.
        adv: ``(N,)`` A(s, a_i) (within a group only differences matter: V(s) cancels).
        groups: Row indices of each state's replies.

    Returns:
        ``(N,)`` weights; rows in no group get 0.
    """
    w = torch.zeros_like(adv)
    for g in groups:
        idx = torch.tensor(g, dtype=torch.long)
        w[idx] = torch.softmax(logp[idx] + adv[idx] / beta, dim=0)
    return w


def sibling_margins(logp: torch.Tensor, adv: torch.Tensor, groups: list[list[int]],
                    valid: torch.Tensor | None = None) -> list[float]:
    """How far each state's best other (valid) sibling is ranked above the policy's own reply (the
    sibling it gave the highest likelihood): ``max_{i != own, valid} A_i - A_own`` (-inf when no other
    is valid). Among siblings that earned alike the critic's differences are noise: a small margin
    holds no evidence that another reply is better."""
    out = []
    for g in groups:
        own = max(g, key=lambda r: float(logp[r]))
        others = [float(adv[r]) for r in g if r != own and (valid is None or bool(valid[r]))]
        out.append(max(others) - float(adv[own]) if others else float("-inf"))
    return out


# ----- the plug-in -------------------------------------------------------------------------------
@dataclass
class AWRConfig:
    """The actor at a tree's forks."""

    beta: float = knob(0.1, "AWR temperature (in reward units: the outcome is 1)")
    margin: float = knob(0.15, "a state trains only where another valid sibling ranks above the policy's own reply "
                               "by at least this")
    min_shift: float = knob(0.05, "a state trains only when its target moves at least this much probability "
                                  "(total variation) away from the policy's own choice")
    memory: int = knob(2048, "sibling groups the actor replays from (oldest out first)")
    groups: int = knob(64, "the states whose target moves most train each update")
    min_weight: float = knob(0.05, "a sibling under this share of its state's target is not trained on")
    values: str = knob("critic", "what ranks the siblings: critic (Q - V) | returns (what each earned: the tree "
                                 "alone, an ablation)")

    def __post_init__(self) -> None:
        if self.beta <= 0 or self.margin < 0 or not 0 <= self.min_shift < 1 or not 0 <= self.min_weight < 1:
            raise ValueError("awr: beta must be > 0, margin >= 0, min_shift and min_weight in [0, 1)")
        if min(self.memory, self.groups) < 1 or self.values not in ("critic", "returns"):
            raise ValueError("awr: memory and groups must be >= 1, values critic or returns")


def alone(traj: Trajectory, k: int) -> Trajectory:
    """Turn ``k`` of ``traj`` as a one-turn episode whose record shares ``traj``'s prefix up to the
    turn's prompt, then holds its reply (what a memory keeps of a turn)."""
    turn = traj.turns[k]
    rec, span = traj.record.branch(turn.span[0], traj.action_ids(k), traj.action_logprobs(k))
    return Trajectory(traj.task_id, turns=[dataclasses.replace(turn, span=span)], record=rec)


@register_plugin
class AWR(Plugin):
    """Remembers every sibling group; trains at the states where the critic most wants another reply."""

    name, config, needs = "awr", AWRConfig, ("tree",)

    def setup(self, trainer: Any) -> None:
        self.memory: list[dict] = []

    def on_turns(self, trainer: Any, tree: Any, turns: Any, metrics: dict) -> None:
        for g in trainer.plugins.get("tree").siblings:
            index = torch.tensor(g, dtype=torch.long)
            members = [alone(tree.episodes[turns.refs[i][0]], turns.refs[i][1]) for i in g]
            self.memory.append({"turns": members, "s": select_rows(turns.s, index), "sa": select_rows(turns.sa, index),
                                "value": turns.returns[index],
                                "logp": torch.tensor([float(sum(t.action_logprobs(0))) for t in members])})
        del self.memory[: max(0, len(self.memory) - self.cfg.memory)]

    def targets(self, adv: torch.Tensor) -> tuple[torch.Tensor, list[list[int]], list[float], list[int], list[int]]:
        """``(w, targets, shift, useful, pick)`` at the remembered states: each row's weight, each state's
        valid rows, its total-variation shift away from pi, the states past ``min_shift`` and ``margin``,
        and the ``groups`` of them that shift most (in memory order)."""
        groups, start = [], 0
        for e in self.memory:
            groups.append(list(range(start, start + len(e["turns"]))))
            start += len(e["turns"])
        logp = torch.cat([e["logp"] for e in self.memory])
        valid = torch.tensor([action_status(t.turns[0]) == "valid" for e in self.memory for t in e["turns"]])
        margins = sibling_margins(logp, adv, groups, valid)  # a reply the env rejected is never a target
        targets = [[r for r in g if valid[r]] for g in groups]
        w = sibling_awr_weights(logp, adv, targets, self.cfg.beta)
        prior = sibling_awr_weights(logp, torch.zeros_like(adv), targets, self.cfg.beta)  # pi on the siblings
        shift = [0.5 * float((w[g] - prior[g]).abs().sum()) for g in targets]
        useful = [i for i, d in enumerate(shift) if d >= self.cfg.min_shift and margins[i] >= self.cfg.margin]
        pick = sorted(sorted(useful, key=lambda i: -shift[i])[: self.cfg.groups])
        return w, targets, shift, useful, pick

    @torch.no_grad()
    def actor_rows(self, trainer: Any, metrics: dict) -> tuple[list[Trajectory], list[float]] | None:
        gate = trainer.plugins.get("sibling_auc")
        if not self.memory or (gate is not None and not gate.gate_open):
            return None
        values = torch.cat([e["value"] for e in self.memory])
        adv = values if self.cfg.values == "returns" else trainer.critic.advantage(
            cat_rows([e["s"] for e in self.memory]), cat_rows([e["sa"] for e in self.memory]))
        w, targets, shift, useful, pick = self.targets(adv)
        turns = [t for e in self.memory for t in e["turns"]]
        kept = [r for i in pick for r in targets[i] if float(w[r]) >= self.cfg.min_weight]
        metrics.update({"awr/states": float(len(pick)), "awr/informative_states": float(len(useful)),
                        "awr/target_shift": sum(shift) / len(shift), "awr/memory": float(len(self.memory))})
        return [turns[r] for r in kept], [float(w[r]) for r in kept]

    def state_dict(self) -> dict:
        return {"memory": [{**e, "turns": [t.to_dict() for t in e["turns"]]} for e in self.memory]}

    def load_state_dict(self, state: dict) -> None:
        self.memory = [{**e, "turns": [Trajectory.from_dict(t) for t in e["turns"]]} for e in state.get("memory", [])]
