"""Plug-in ``sibling_auc``: does the critic rank a state's replies as their outcomes do? (not in the paper)

A search tree (plug-in ``tree``) holds several replies from one state, each played to the end: its
sibling groups. The sibling AUC is how often Q - V ranks the sibling that earned more first. Two
probes score it out of sample:

- cross-fitted (``critic/sibling_auc_xfit``): this iteration's tasks are split in two halves; for
  each, a copy of the critic trains on the buffer plus the other half's turns and scores the half's
  siblings, so no pair is scored by a critic that saw its task this iteration (``_low``/``_high``:
  its 95% bootstrap interval over states; ``_lost``: at the forks of episodes that lost);
- held out (``critic/sibling_auc``): the turns of a ``holdout`` share of the training tasks never
  reach the buffer; their sibling groups, kept across iterations, score the critic every iteration.

``gate``: plug-ins that let the critic move the actor (``awr``) read ``gate_open``: the cross-fitted
AUC (else the held-out one) is at least ``gate``, so a critic at chance does not drive the actor.
"""

from __future__ import annotations

import copy
import hashlib
import math
from dataclasses import dataclass
from typing import Any

import torch

from turngym.config import knob
from turngym.trainers.archer.encoder import select_rows
from turngym.trainers.archer.plugins import Plugin, register_plugin


# ----- the math ----------------------------------------------------------------------------------
def sibling_counts(scores: torch.Tensor, values: torch.Tensor, groups: list[list[int]],
                   eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Per group of sibling rows, the ranking wins (ties 1/2) and the pairs counted: every pair of
    siblings whose values differ by more than ``eps`` counts 1 when the better one scores higher."""
    wins, pairs = torch.zeros(len(groups), dtype=torch.float64), torch.zeros(len(groups), dtype=torch.float64)
    for n, g in enumerate(groups):
        idx = torch.tensor(g, dtype=torch.long)
        s, v = scores[idx], values[idx]
        better = (v[:, None] - v[None, :]) > eps  # (G, G): row's reply earned more than column's
        ds = s[:, None] - s[None, :]
        wins[n] = float(((ds > 0).float() + 0.5 * (ds == 0).float())[better].sum())
        pairs[n] = float(better.sum())
    return wins, pairs


def sibling_auc(scores: torch.Tensor, values: torch.Tensor, groups: list[list[int]]) -> tuple[float, int]:
    """``(auc, pairs)``: the share of sibling pairs ranked as their values rank them (NaN without a pair).

    Args:
        scores: ``(N,)`` e.g. the critic's ``Q(s, a) - V(s)``.
        values: ``(N,)`` e.g. the return after each reply.
        groups: Row indices of each sibling group.
    """
    wins, pairs = sibling_counts(scores, values, groups)
    total = int(pairs.sum())
    return (float(wins.sum()) / total if total else float("nan")), total


def sibling_auc_interval(scores: torch.Tensor, values: torch.Tensor, groups: list[list[int]], *, level: float = 0.95,
                         resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """A bootstrap interval for ``sibling_auc`` that resamples states, not pairs (the pairs of one
    state share its replies, so they are not independent). NaN for both without a pair."""
    wins, pairs = sibling_counts(scores, values, groups)
    keep = pairs > 0
    wins, pairs = wins[keep], pairs[keep]
    if not len(pairs):
        return float("nan"), float("nan")
    pick = torch.randint(0, len(pairs), (resamples, len(pairs)), generator=torch.Generator().manual_seed(seed))
    aucs = wins[pick].sum(1) / pairs[pick].sum(1)
    tail = (1 - level) / 2
    return float(torch.quantile(aucs, tail)), float(torch.quantile(aucs, 1 - tail))


def heldout_tasks(task_ids: list[str], share: float, seed: int) -> set[str]:
    """The tasks whose turns the critic never trains on: each task is in with probability ``share``,
    by a hash of (seed, task), independent of every schedule's RNG (a shuffle seeded like the screen's
    would hold out exactly the tasks screened first)."""
    cut = int(share * 2**32)
    return {t for t in task_ids if int(hashlib.sha256(f"{seed}:{t}".encode()).hexdigest()[:8], 16) < cut}


# ----- the plug-in -------------------------------------------------------------------------------
@dataclass
class SiblingAUCConfig:
    """The critic's out-of-sample sibling ranking, and the gate it opens."""

    holdout: float = knob(0.125, "share of the training tasks whose turns never train the critic (critic/sibling_auc)")
    gate: float = knob(0.6, "plug-ins that move the actor by the critic's ranking (awr) do so only while the "
                            "out-of-sample sibling AUC is at least this (0 = always)")
    crossfit: bool = knob(True, "score this iteration's siblings by two critics each trained without one half of "
                                "the tasks (two extra critic fits an iteration)")

    def __post_init__(self) -> None:
        if not 0 <= self.holdout < 1 or not 0 <= self.gate <= 1:
            raise ValueError("sibling_auc: holdout must be in [0, 1) and gate in [0, 1]")


@register_plugin
class SiblingAUC(Plugin):
    """The probes and the gate.

    Attributes:
        gate_open: Whether this iteration's evidence clears ``gate``.
        crossfit: The last cross-fit's out-of-sample scores of every offered candidate (``groups``,
            ``scores``, ``values``, ``logprobs``), from which the hierarchy stage estimates what acting
            with the critic would earn.
    """

    name, config, needs = "sibling_auc", SiblingAUCConfig, ("tree",)

    def setup(self, trainer: Any) -> None:
        self.heldout_tasks = heldout_tasks(trainer.task_ids, self.cfg.holdout, trainer.seed)
        self.heldout: dict[str, torch.Tensor] = {}  # held-out sibling rows: s, sa, value, group
        self.gate_open = self.cfg.gate <= 0
        self.crossfit: dict | None = None

    def buffer_rows(self, trainer: Any, tree: Any, turns: Any, rows: list[int]) -> list[int]:
        return [i for i in rows if tree.episodes[turns.refs[i][0]].task_id not in self.heldout_tasks]

    def _task(self, tree: Any, turns: Any, i: int) -> str:
        return tree.episodes[turns.refs[i][0]].task_id

    def on_turns(self, trainer: Any, tree: Any, turns: Any, metrics: dict) -> None:
        plug = trainer.plugins.get("tree")
        fresh = [g for g in plug.siblings if self._task(tree, turns, g[0]) not in self.heldout_tasks]
        offered = [g for g in plug.offered if self._task(tree, turns, g[0]) not in self.heldout_tasks]
        held = [g for g in plug.siblings if self._task(tree, turns, g[0]) in self.heldout_tasks]
        self._pending = held
        self.crossfit = None
        if self.cfg.crossfit and fresh:
            metrics.update(self._crossfit(trainer, tree, turns, fresh, offered))

    def _crossfit(self, trainer: Any, tree: Any, turns: Any, groups: list[list[int]], offered: list[list[int]]) -> dict:
        half = lambda i: int(hashlib.sha256(f"{trainer.iteration}:{self._task(tree, turns, i)}".encode()).hexdigest()[:8],  # noqa: E731
                             16) % 2
        train = [i for i in trainer.plugins.buffer_rows(trainer, tree, turns, turns.own)]
        scores = torch.zeros(len(turns.refs))
        for f in (0, 1):
            mine = [i for g in offered if half(g[0]) == f for i in g]
            if not mine:
                continue
            critic, target = copy.deepcopy(trainer.critic), copy.deepcopy(trainer.critic_target)
            opt = torch.optim.AdamW(critic.parameters(), lr=trainer.cfg.critic_lr)
            pool = trainer.critic_pool(extra=(turns, [i for i in train if half(i) != f]))
            if pool is not None:
                trainer.fit_critic(critic, target, opt, pool)
            index = torch.tensor(mine, dtype=torch.long)
            with torch.no_grad():
                scores[index] = critic.advantage(select_rows(turns.s, index), select_rows(turns.sa, index))
        logp = [sum(x for x in tree.episodes[e].action_logprobs(k) if not math.isnan(x)) for e, k in turns.refs]
        self.crossfit = {"groups": offered, "scores": scores.tolist(), "values": turns.returns.tolist(), "logprobs": logp}
        auc, pairs = sibling_auc(scores, turns.returns, groups)
        if not pairs:
            return {}
        low, high = sibling_auc_interval(scores, turns.returns, groups, seed=trainer.iteration)
        out = {"critic/sibling_auc_xfit": auc, "critic/sibling_pairs_xfit": float(pairs),
               "critic/sibling_auc_xfit_low": low, "critic/sibling_auc_xfit_high": high}
        # the forks of lost episodes apart: there the policy's own reply lost, where acting could gain
        lost = [g for g in groups if not tree.episodes[turns.refs[g[0]][0]].success]
        lost_auc, lost_pairs = sibling_auc(scores, turns.returns, lost)
        if lost_pairs:
            out.update({"critic/sibling_auc_xfit_lost": lost_auc, "critic/sibling_pairs_xfit_lost": float(lost_pairs)})
        return out

    def after_critic(self, trainer: Any, tree: Any, turns: Any, metrics: dict) -> None:
        if self._pending:  # the held-out tasks' sibling rows, kept to score every later critic
            rows = torch.tensor([i for g in self._pending for i in g], dtype=torch.long)
            base = int(self.heldout["group"].max()) + 1 if self.heldout else 0
            gid = torch.tensor([base + n for n, g in enumerate(self._pending) for _ in g], dtype=torch.long)
            new = {"s": select_rows(turns.s, rows), "sa": select_rows(turns.sa, rows), "value": turns.returns[rows],
                   "group": gid}
            self.heldout = {k: _cat(self.heldout[k], x) if self.heldout else x for k, x in new.items()}
        if self.heldout:
            with torch.no_grad():
                adv = trainer.critic.advantage(self.heldout["s"], self.heldout["sa"])
            groups: dict[int, list[int]] = {}
            for i, g in enumerate(self.heldout["group"].tolist()):
                groups.setdefault(g, []).append(i)
            auc, pairs = sibling_auc(adv, self.heldout["value"], list(groups.values()))
            if pairs:
                metrics.update({"critic/sibling_auc": auc, "critic/sibling_pairs": float(pairs)})
        evidence = metrics.get("critic/sibling_auc_xfit", metrics.get("critic/sibling_auc", 0.0))
        self.gate_open = self.cfg.gate <= 0 or evidence >= self.cfg.gate
        metrics["critic/gate_open"] = float(self.gate_open)

    def state_dict(self) -> dict:
        return {"heldout": dict(self.heldout)}

    def load_state_dict(self, state: dict) -> None:
        self.heldout = dict(state.get("heldout", {}))


def _cat(a: Any, b: Any) -> Any:
    return torch.cat([a, b]) if isinstance(a, torch.Tensor) else (torch.cat([a[0], b[0]]), torch.cat([a[1], b[1]]))
