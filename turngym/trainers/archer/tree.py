"""Plug-in ``tree``: collect a search tree instead of sampled episodes (not in the paper).

Each iteration screens ``episodes_per_iter`` training tasks greedily (unsolved and least recently
screened first: the roots, played as held-out evaluation plays), then branch search
(``rollout.branching``) plays the policy's runner-up replies on from the failed roots, at the turns
before an episode came back to where it had been. A tree holds several replies from one state, each
followed to the end: the sibling groups that the ``awr``, ``sibling_auc`` and ``critic_rank``
plug-ins read (``siblings``). Shared prefixes count once: a branch adds only its own turns.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from turngym.config import knob
from turngym.rollout import EpisodeSpec
from turngym.rollout.branching import BRANCH_BY, BRANCH_PICK, Tree, is_no_op
from turngym.rollout.schedule import run_seed, screen_order
from turngym.trainers.archer.plugins import Plugin, register_plugin


@dataclass
class TreeConfig:
    """The search from each iteration's greedy screen."""

    points: int = knob(2, "turns to branch at in each failed episode (the one that first came back to where it "
                          "had been, and the ones before it)")
    width: int = knob(3, "runner-up replies tried at each branch point")
    depth: int = knob(2, "search levels (failed branches are branched again after their branch turn)")
    by: str = knob("observation", "how a branch point sees a return: observation (what the agent was shown) | "
                                  "state_key (the env's privileged world-state key)")
    pick: str = knob("latest", "which turns before that return to branch at: latest | uncertain (where the "
                               "policy was least sure of its reply)")
    from_wins: bool = knob(False, "also branch the won roots, and go on searching a task after a branch won: "
                                  "sibling pairs that earned differently at won games' forks too")
    no_ops: bool = knob(False, "the runner-ups the env refused or that changed nothing are kept as one-turn dead "
                               "ends (their reward, done): they train the critic, never the actor, and are "
                               "offered to a critic that acts")

    def __post_init__(self) -> None:
        if min(self.points, self.width, self.depth) < 1:
            raise ValueError("tree: points, width and depth must be >= 1")
        if self.by not in BRANCH_BY or self.pick not in BRANCH_PICK:
            raise ValueError(f"tree: by must be one of {BRANCH_BY} and pick one of {BRANCH_PICK}")


@register_plugin
class TreeCollection(Plugin):
    """Greedy roots on the screened tasks, then branch search from the failed ones.

    Attributes (this iteration's, after ``on_turns``):
        siblings: Row groups of different replies from one state, the policy's own first.
        offered: The same with the refused runner-ups too (what a critic that acts is offered).
        screened: Task -> the iteration it was last screened in (the hierarchy stage reads it).
    """

    name, config = "tree", TreeConfig

    def setup(self, trainer: Any) -> None:
        if trainer.ctx.enabled:
            raise ValueError("plugin tree branches with the HF policy in one process, not under torchrun")
        self.screened: dict[str, int] = {}
        self.siblings: list[list[int]] = []
        self.offered: list[list[int]] = []
        self.rank = None  # a plug-in (critic_rank) may set how each branch point's runner-ups are chosen

    def collect(self, trainer: Any) -> tuple[Tree, dict[str, float]]:
        cfg, arch = self.cfg, trainer.cfg
        solved = {t for t, ok in trainer.tasks.greedy_outcomes.items() if ok}
        tasks = screen_order(trainer.task_ids, solved, self.screened, trainer.seed, trainer.iteration,
                             arch.episodes_per_iter)
        specs = [EpisodeSpec(t, run_seed(trainer.seed, trainer.task_ids.index(t)), greedy=True) for t in tasks]
        roots, metrics = trainer.collector.collect(trainer.env, specs, trainer.sampling(), num_envs=arch.num_envs,
                                                   version=trainer.iteration)
        self.screened.update({t: trainer.iteration for t in tasks})
        trainer.tasks.record_screen(roots)
        t0 = time.perf_counter()
        rank = self.rank(trainer) if self.rank is not None else None
        tree = trainer.collector.tree_rollout(trainer.env, specs, roots=roots, points=cfg.points, width=cfg.width,
                                              depth=cfg.depth, max_new_tokens=arch.max_new_tokens, num_envs=arch.num_envs,
                                              by=cfg.by, pick=cfg.pick, from_wins=cfg.from_wins, keep_no_ops=cfg.no_ops,
                                              **(rank or {}))
        branches = [b for b in tree.episodes[len(roots):] if not is_no_op(b)]
        failed = {r.task_id for r in roots if not r.success}
        metrics.update({"search/seconds": time.perf_counter() - t0, "search/branches": float(len(branches)),
                        "search/failed_tasks": float(len(failed)),
                        "search/solved_tasks": float(len({b.task_id for b in branches if b.success})),
                        "search/sibling_groups": float(len(tree.sibling_groups())),
                        "search/no_op_leaves": float(len(tree.episodes) - len(roots) - len(branches))})
        metrics["rollout/env_steps"] += sum(len(b.turns) for b in tree.episodes[len(roots):])  # replays step the env too
        metrics["rollout/episodes"] += len(tree.episodes) - len(roots)
        return tree, metrics

    def on_turns(self, trainer: Any, tree: Tree, turns: Any, metrics: dict) -> None:
        row = turns.row()
        self.siblings = [[row[ref] for ref in g] for g in tree.sibling_groups()]
        self.offered = [[row[ref] for ref in g] for g in tree.sibling_groups(no_ops=True)] if self.cfg.no_ops \
            else self.siblings

    def state_dict(self) -> dict:
        return {"screened": dict(self.screened)}

    def load_state_dict(self, state: dict) -> None:
        self.screened = dict(state.get("screened", {}))
