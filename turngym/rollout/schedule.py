"""Which training tasks each iteration plays, and with which reset seeds.

``task_schedule`` draws an iteration's tasks (uniformly, or weighted), each repeated ``group_size``
times from one reset seed so a group replays the same start. ``TaskSchedule`` keeps what the
weights are made of: each task's outcomes in its last group (``contrast``) and whether greedy play
solved it at the last screen (``greedy_failed``). Every reset seed and draw comes from ``run_seed``,
so a resumed run plays exactly what the original would have.
"""

from __future__ import annotations

import random
from typing import Any

from turngym.rollout.episode import EpisodeSpec
from turngym.types import Trajectory

TASK_SAMPLING = ("uniform", "contrast", "greedy_failed")
# task_sampling=greedy_failed: a task greedy decoding solved keeps a small chance of a group, so
# a fix that breaks it is still seen (and its successes still anchor the policy)
SOLVED_TASK_WEIGHT = 0.1


def run_seed(seed: int, offset: int) -> int:
    """The one seed formula of a run: ``seed`` (the config's) combined with an ``offset`` (an
    iteration, a task's index, ...), far enough apart that runs with nearby seeds never share one."""
    return seed * 1_000_003 + offset


def contrast_weight(successes: int, episodes: int) -> float:
    """How likely a task's next group is to hold both outcomes: ``p (1 - p)`` with ``p`` its success
    rate smoothed by Laplace's rule, ``(successes + 1) / (episodes + 2)``. An unseen task gets the
    maximum, 1/4; a task its last group always won (or always lost) gets less, never 0."""
    p = (successes + 1) / (episodes + 2)
    return p * (1 - p)


def task_schedule(task_ids: list[str], n: int, seed: int, iteration: int, group_size: int = 1,
                  weights: list[float] | None = None, greedy_first: bool = False) -> list[EpisodeSpec]:
    """``n`` episodes for one iteration: tasks drawn by (seed, iteration), each repeated
    ``group_size`` times with one reset seed so a group replays the same start; with
    ``greedy_first`` the first episode of each group is played greedily.

    With ``weights`` (one per task, > 0), tasks are drawn in proportion to them and without
    replacement while there are tasks left (Efraimidis-Spirakis keys ``u ** (1 / w)``)."""
    rng = random.Random(run_seed(seed, iteration))
    groups = max(1, n // group_size)
    if weights is None:
        picks = [task_ids[rng.randrange(len(task_ids))] for _ in range(groups)]
    else:
        keys = sorted(range(len(task_ids)), key=lambda i: -(rng.random() ** (1.0 / weights[i])))
        picks = [task_ids[keys[g % len(keys)]] for g in range(groups)]
    specs = []
    for g, task in enumerate(picks):
        reset_seed = run_seed(seed, iteration * 1000 + g)
        specs += [EpisodeSpec(task, reset_seed, greedy=greedy_first and k == 0) for k in range(group_size)]
    return specs


def screen_order(task_ids: list[str], solved: set[str], screened: dict[str, int], seed: int, iteration: int,
                 n: int) -> list[str]:
    """The ``n`` training tasks a greedy screen plays next: unsolved first, then the ones screened
    longest ago (never screened: -1), ties in a seeded order that changes every iteration."""
    order = list(task_ids)
    random.Random(run_seed(seed, iteration)).shuffle(order)
    rank = {t: i for i, t in enumerate(order)}
    return sorted(task_ids, key=lambda t: (t in solved, screened.get(t, -1), rank[t]))[:n]


def demo_task_ids(task_ids: list[str], episodes: int, demo_seed: int = -1, pool: int = 0) -> list[str]:
    """The tasks demonstrations are played on: the first ``episodes`` (``demo_seed`` -1), or
    ``episodes`` drawn without replacement by ``demo_seed`` (cycling when there are fewer tasks).

    ``pool`` > 0 draws from the first ``pool`` tasks only, so a training split grown beyond them
    (more tasks for RL to play) keeps the demonstrations it had at ``pool`` tasks."""
    if pool > 0:
        task_ids = task_ids[:pool]
    if demo_seed < 0:
        return list(task_ids)
    order = list(task_ids)
    random.Random(demo_seed).shuffle(order)
    return order[: max(1, min(episodes, len(order)))]


class TaskSchedule:
    """A training run's task draws and what they are weighted by.

    Args:
        task_ids: The training split's tasks.
        seed: The run's seed (``run_seed``).
        sampling: ``uniform`` | ``contrast`` (weight ``contrast_weight`` of the task's last group) |
            ``greedy_failed`` (weight 1 for tasks the last greedy screen failed, ``SOLVED_TASK_WEIGHT`` else).
        screen_every: Iterations between greedy screens (``greedy_failed``).
        greedy_first: Play the first episode of every group greedily.

    Raises:
        ValueError: an unknown ``sampling``, or no tasks.
    """

    def __init__(self, task_ids: list[str], seed: int = 0, sampling: str = "uniform", screen_every: int = 4,
                 greedy_first: bool = False) -> None:
        if sampling not in TASK_SAMPLING:
            raise ValueError(f"task_sampling must be uniform, contrast or greedy_failed, got {sampling!r}")
        if not task_ids:
            raise ValueError("no tasks to play")
        self.task_ids, self.seed, self.sampling = list(task_ids), seed, sampling
        self.screen_every, self.greedy_first = screen_every, greedy_first
        self.task_outcomes: dict[str, tuple[int, int]] = {}  # task -> (successes, episodes) of its last group
        self.greedy_outcomes: dict[str, bool] = {}  # task -> whether its last greedy screen succeeded

    def needs_screen(self, iteration: int) -> bool:
        """Whether ``greedy_failed`` screens before this iteration's draw."""
        return self.sampling == "greedy_failed" and (iteration % self.screen_every == 0 or not self.greedy_outcomes)

    def screen_specs(self) -> list[EpisodeSpec]:
        """Every training task once, greedily, each from its own fixed reset seed."""
        return [EpisodeSpec(t, run_seed(self.seed, i), greedy=True) for i, t in enumerate(self.task_ids)]

    def specs(self, n: int, iteration: int, group_size: int = 1) -> list[EpisodeSpec]:
        """This iteration's ``n`` episodes (``task_schedule``), weighted by ``sampling``."""
        weights = None
        if self.sampling == "contrast":
            weights = [contrast_weight(*self.task_outcomes.get(t, (0, 0))) for t in self.task_ids]
        if self.sampling == "greedy_failed":
            weights = [SOLVED_TASK_WEIGHT if self.greedy_outcomes.get(t) else 1.0 for t in self.task_ids]
        return task_schedule(self.task_ids, n, self.seed, iteration, group_size, weights,
                             greedy_first=self.greedy_first and group_size > 1)

    def record(self, trajs: list[Trajectory]) -> None:
        """Remember each task's outcomes in this iteration (``contrast``)."""
        seen: dict[str, list[int]] = {}
        for t in trajs:
            s = seen.setdefault(t.task_id, [0, 0])
            s[0] += int(t.success)
            s[1] += 1
        self.task_outcomes.update({k: (v[0], v[1]) for k, v in seen.items()})

    def record_screen(self, trajs: list[Trajectory]) -> None:
        """Remember which tasks greedy play solved."""
        self.greedy_outcomes.update({t.task_id: bool(t.success) for t in trajs})

    def state_dict(self) -> dict[str, Any]:
        return {"task_outcomes": dict(self.task_outcomes), "greedy_outcomes": dict(self.greedy_outcomes)}

    def load_state_dict(self, st: dict[str, Any]) -> None:
        self.task_outcomes = {k: tuple(v) for k, v in st.get("task_outcomes", {}).items()}
        self.greedy_outcomes = dict(st.get("greedy_outcomes", {}))
