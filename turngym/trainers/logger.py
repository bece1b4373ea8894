"""Metrics to JSONL (always), TensorBoard (when installed) and W&B (when installed and
configured), plus a learning-curve PNG at the end."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from turngym.clock import Progress, bar


class MetricsLogger:
    """Log ``{key: number}`` dicts per step.

    Args:
        out_dir: Where ``metrics.jsonl``, ``tb/`` and ``learning_curve.png`` go.
        tensorboard: Also write TensorBoard events when ``tensorboard`` is importable.
        wandb_project: Also log to Weights & Biases when ``wandb`` is importable and this (or
            ``$WANDB_PROJECT``) is set.
        resume: Append to an existing ``metrics.jsonl`` instead of starting it afresh. A resumed
            trainer then calls ``truncate(step)`` with its checkpoint's step, so rows logged after
            that checkpoint (by a run killed before its next save) are not repeated.
    """

    def __init__(self, out_dir: str | Path, tensorboard: bool = True, wandb_project: str | None = None,
                 config: dict | None = None, resume: bool = False) -> None:
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "metrics.jsonl"
        if not resume and self.path.exists():
            self.path.unlink()
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(self.dir / "tb"))
            except ImportError:
                self.tb = None
        self.wandb = None
        project = wandb_project or os.environ.get("WANDB_PROJECT")
        if project:
            try:
                import wandb

                self.wandb = wandb.init(project=project, config=config or {}, dir=str(self.dir), resume="allow")
            except ImportError:
                self.wandb = None

    def log(self, metrics: dict[str, Any], step: int) -> None:
        row = {"step": step, "time": time.time(), **metrics}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        for k, v in metrics.items():
            if isinstance(v, (int, float)):
                if self.tb is not None:
                    self.tb.add_scalar(k, v, step)
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=step)

    def rows(self) -> list[dict]:
        return read_rows(self.path)

    def truncate(self, step: int) -> None:
        """Keep only the rows up to ``step`` (and no torn last line): the run resumes from there."""
        kept = [r for r in self.rows() if r.get("step", 0) <= step]
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
        tmp.replace(self.path)
        if self.tb is not None:  # TensorBoard drops its events past the resumed step the same way
            from torch.utils.tensorboard import SummaryWriter

            self.tb.close()
            self.tb = SummaryWriter(str(self.dir / "tb"), purge_step=step + 1)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def read_rows(path: Path) -> list[dict]:
    """The logged rows; a last line cut short by a kill is dropped."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def plot_learning_curve(rows: list[dict], path: str | Path, keys: tuple[str, ...] = ("rollout/success",),
                        x_key: str = "env_steps", title: str = "") -> Path | None:
    """Plot ``keys`` against ``x_key`` from logged rows; returns the PNG path (None if no data)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    drew = False
    for key in keys:
        pts = [(r.get(x_key, r["step"]), r[key]) for r in rows if key in r]
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o", label=key)
            drew = True
    if not drew:
        plt.close(fig)
        return None
    ax.set_xlabel(x_key)
    ax.set_ylabel("value")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def progress_bar(desc: str, *, steps: int, budget_s: float = 0.0, done_steps: int = 0, done_s: float = 0.0,
                 disable: bool = False) -> Progress:
    """A training stage's progress (``clock.bar``) over ``steps``, or over the seconds of ``budget_s``
    when it is set: a time budget usually ends a run long before its step cap (a 1000-iteration
    "no cap" showed a 31-hour ETA). Move it with ``advance_bar(bar, trained_seconds)``."""
    budgeted = budget_s > 0
    shown = bar(round(budget_s) if budgeted else steps, desc, "s" if budgeted else "step", disable=disable,
                initial=min(round(budget_s), int(done_s)) if budgeted else done_steps)
    shown.budgeted = budgeted
    return shown


def advance_bar(bar: Progress, trained_s: float) -> None:
    """One step done: a budgeted bar moves to ``trained_s`` (capped at its total), a step bar by 1."""
    bar.update(min(bar.total, int(trained_s)) - bar.n if bar.budgeted else 1)
