"""Is a held-out set held out? The tasks a held-out evaluation plays, checked against the training
split before any training runs, and the plot of held-out success per stage.

Three checks, all cheap next to training:

- by id: a test task id that is also a training task id (an env that ignores ``split=``);
- by content: a test task whose opening (``envs.info.task_openings``: the reset observation
  under a fixed seed, and the oracle's first move when the env has one) equals a training task's.
  That catches the same task under another name. A fingerprint several tasks of one split share
  tells nothing (e.g. Wordle: every game opens alike and the secret is hidden), so it is left out.
  Resets can be slow (ALFWorld: 2 s), so the content check stops after a time budget and says how
  much it covered;
- by what the task is made of: an env that defines ``content_keys(task_id) -> set[str]`` names
  what a held-out task may share with no training task (SQL: its database's tables; SWE: its bug
  template and package; Maze: the maze itself). Every evaluated test task's keys are compared with
  every training task's, over the whole training split; ``content_keys`` must be cheap (no reset).
  The keys also settle what openings cannot: two tasks that open alike (a partially observed maze
  shows only the open directions) but are made of different things are not the same task.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turngym.envs.info import env_info, task_content_keys, task_openings


@dataclass
class SplitCheck:
    """What the check found.

    Args:
        train_tasks: Task ids of the training split.
        test_tasks: Task ids the held-out evaluation plays (the first ``episodes`` of the test split).
        split_size: How many tasks the test split holds.
        id_overlap: Test ids that are training ids too.
        content_overlap: ``(test id, training id)`` pairs with the same opening.
        content_checked: Tasks fingerprinted, ``(test, train)``.
        content_note: Why the content check covered less than everything, if it did.
        train_oracle: The env has an oracle move on its first training task (SFT needs one).
        key_overlap: ``(test id, training id, key)``: a test task made of something a training
            task is made of too (one pair per shared key).
        keys_checked: Tasks whose ``content_keys`` were compared, ``(test, train)``; ``(0, 0)``
            when the env defines none.
    """

    train_tasks: list[str]
    test_tasks: list[str]
    split_size: int
    id_overlap: list[str] = field(default_factory=list)
    content_overlap: list[tuple[str, str]] = field(default_factory=list)
    content_checked: tuple[int, int] = (0, 0)
    content_note: str = ""
    train_oracle: bool = False
    key_overlap: list[tuple[str, str, str]] = field(default_factory=list)
    keys_checked: tuple[int, int] = (0, 0)

    @property
    def clean(self) -> bool:
        return not self.id_overlap and not self.content_overlap and not self.key_overlap

    def to_dict(self) -> dict[str, Any]:
        return {"train_tasks": len(self.train_tasks), "test_tasks": len(self.test_tasks),
                "id_overlap": self.id_overlap, "content_overlap": [list(p) for p in self.content_overlap],
                "content_checked": {"test": self.content_checked[0], "train": self.content_checked[1]},
                "content_note": self.content_note, "key_overlap": [list(k) for k in self.key_overlap],
                "keys_checked": {"test": self.keys_checked[0], "train": self.keys_checked[1]}}


def check_splits(env_id: str, train_kwargs: dict, test_kwargs: dict, episodes: int, *,
                 budget_s: float = 10.0) -> SplitCheck:
    """Compare the tasks a held-out evaluation of ``episodes`` games plays with the training tasks.

    Args:
        env_id: A registered env id.
        train_kwargs: Constructor kwargs of the training env (its split included).
        test_kwargs: Constructor kwargs of the evaluation env.
        episodes: Distinct held-out games the evaluation plays.
        budget_s: Seconds for the content check (0: ids only); the key check is not timed.

    Returns:
        A ``SplitCheck``; the caller decides what to refuse.

    Raises:
        Whatever making the envs raises (e.g. ``TypeError`` for a kwarg the env does not take).
    """
    train_ids = list(env_info(env_id, **train_kwargs).task_ids)
    split = list(env_info(env_id, **test_kwargs).task_ids)
    out = SplitCheck(train_ids, split[:episodes], len(split))
    known = set(train_ids)
    out.id_overlap = [t for t in out.test_tasks if t in known]
    if not train_ids:
        return out
    if budget_s > 0 and out.test_tasks:
        _check_content(out, env_id, train_kwargs, test_kwargs, budget_s)
        _check_keys(out, env_id, train_kwargs, test_kwargs)
    else:  # SFT needs an oracle: one opening says whether there is one
        out.train_oracle = task_openings(env_id, train_ids[:1], **train_kwargs)[train_ids[0]].oracle
    return out


def _check_content(out: SplitCheck, env_id: str, train_kwargs: dict, test_kwargs: dict, budget_s: float) -> None:
    """Hash the openings of the test tasks (half the budget), then of the training tasks in a seeded
    random order (the rest), so a cut by the budget still samples the whole training split."""
    t0 = time.perf_counter()
    test = task_openings(env_id, out.test_tasks, budget_s / 2, **test_kwargs)
    train_order = list(out.train_tasks)
    random.Random(0).shuffle(train_order)
    train = task_openings(env_id, train_order, max(0.0, budget_s - (time.perf_counter() - t0)), **train_kwargs)
    out.train_oracle = any(o.oracle for o in train.values())
    test_fp = {t: o.digest for t, o in test.items()}
    train_fp = {t: o.digest for t, o in train.items()}
    out.content_checked = (len(test_fp), len(train_fp))
    shared = {h for fps in (test_fp, train_fp) for h, n in Counter(fps.values()).items() if n > 1}
    by_hash = {h: t for t, h in train_fp.items() if h not in shared}
    out.content_overlap = [(t, by_hash[h]) for t, h in test_fp.items() if h in by_hash and by_hash[h] != t]
    notes = []
    if out.content_checked != (len(out.test_tasks), len(out.train_tasks)):
        notes.append(f"content checked on {len(test_fp)} of {len(out.test_tasks)} test and {len(train_fp)} of "
                     f"{len(out.train_tasks)} training tasks in the {budget_s:g} s budget")
    if shared:
        notes.append(f"{len(shared)} openings are shared by several tasks of one split and tell nothing")
    out.content_note = "; ".join(notes)


def _check_keys(out: SplitCheck, env_id: str, train_kwargs: dict, test_kwargs: dict) -> None:
    test = task_content_keys(env_id, out.test_tasks, **test_kwargs)
    if test is None:
        return
    train = task_content_keys(env_id, out.train_tasks, **train_kwargs) or {}
    owner: dict[str, str] = {}
    for t, keys in train.items():
        for k in keys:
            owner.setdefault(k, t)
    out.keys_checked = (len(test), len(train))
    out.key_overlap = [(t, owner[k], k) for t, keys in test.items() for k in sorted(keys) if k in owner]
    alike = [(t, o) for t, o in out.content_overlap if t in test and o in train and test[t] != train[o]]
    if alike:
        out.content_overlap = [p for p in out.content_overlap if p not in alike]
        note = f"{len(alike)} held-out tasks open like a training task but are made of different content"
        out.content_note = "; ".join(n for n in (out.content_note, note) if n)


def describe_overlap(check: SplitCheck, limit: int = 5) -> str:
    """One line naming what overlaps, with a few examples."""
    parts = []
    if check.id_overlap:
        shown = ", ".join(check.id_overlap[:limit]) + (", ..." if len(check.id_overlap) > limit else "")
        parts.append(f"{len(check.id_overlap)} of the {len(check.test_tasks)} held-out task ids are training "
                     f"task ids ({shown})")
    if check.content_overlap:
        shown = ", ".join(f"{a} = {b}" for a, b in check.content_overlap[:limit])
        parts.append(f"{len(check.content_overlap)} held-out tasks open exactly like a training task ({shown})")
    if check.key_overlap:
        tasks = sorted({t for t, _, _ in check.key_overlap})
        shown = ", ".join(f"{t} and {o} share {k}" for t, o, k in check.key_overlap[:limit])
        parts.append(f"{len(tasks)} held-out tasks are made of what training tasks are made of ({shown})")
    return "; ".join(parts)


# ----- the plot of held-out success per stage -------------------------------------------------------
STAGE_LABELS = {"zero_shot": "zero-shot", "sft": "after SFT"}


def stage_label(tag: str, algo: str) -> str:
    """``"sft"`` -> ``"after SFT"``, ``"final"`` -> ``"after <algo>"``."""
    return STAGE_LABELS.get(tag, f"after {algo}" if tag == "final" else tag)


def stage_figure(table: dict, title: str, algo: str) -> Any:
    """A bar per evaluated stage (in the table's order): held-out success with its 95% CI as an error
    bar, the stage's name and n under it, the value above it. ``table`` is
    ``train.held_out_table``'s: ``{tag: {"success", "ci95": [lo, hi], "n"}}``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tags = list(table)
    succ = [table[t]["success"] for t in tags]
    lo = [max(0.0, s - table[t]["ci95"][0]) for s, t in zip(succ, tags)]
    hi = [max(0.0, table[t]["ci95"][1] - s) for s, t in zip(succ, tags)]
    fig, ax = plt.subplots(figsize=(1.6 + 1.5 * len(tags), 4))
    bars = ax.bar(range(len(tags)), succ, yerr=[lo, hi], capsize=6, color="tab:blue", width=0.6)
    ax.bar_label(bars, labels=[f"{s:.1%}" for s in succ], padding=8)
    ax.set_xticks(range(len(tags)), [f"{stage_label(t, algo)}\nn={table[t]['n']}" for t in tags])
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("held-out success (95% CI)")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_stages(table: dict, path: str | Path, title: str, algo: str) -> Path | None:
    """``stage_figure`` saved as a PNG; None when no stage was evaluated."""
    if not table:
        return None
    import matplotlib.pyplot as plt

    fig = stage_figure(table, title, algo)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
