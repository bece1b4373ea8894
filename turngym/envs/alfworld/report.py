"""Success by ALFWorld task type (``scripts/alfworld_eval.py`` plays a split and prints it)."""

from __future__ import annotations

from turngym.envs.alfworld.games import TASK_TYPES
from turngym.types import Trajectory


def success_by_type(trajectories: list[Trajectory]) -> dict[str, tuple[int, int]]:
    """``task type -> (won, played)``, in ALFWorld's task-type order (plus ``all``)."""
    table: dict[str, list[int]] = {t: [0, 0] for t in TASK_TYPES}
    for tr in trajectories:
        row = table.setdefault(tr.metadata.get("task_type", "default"), [0, 0])
        row[0] += int(tr.outcome >= 1.0)
        row[1] += 1
    out = {t: (w, n) for t, (w, n) in table.items() if n}
    out["all"] = (sum(w for w, _ in out.values()), sum(n for _, n in out.values()))
    return out


def format_table(rows: dict[str, tuple[int, int]]) -> str:
    """The success table as aligned text."""
    width = max(len(t) for t in rows)
    lines = [f"{'task type':<{width}}  won/played  success", "-" * (width + 22)]
    for t, (w, n) in rows.items():
        lines.append(f"{t:<{width}}  {w:>4}/{n:<5}  {w / n:7.1%}")
    return "\n".join(lines)
