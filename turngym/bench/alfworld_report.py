"""Success by ALFWorld task type, as the field reports it (``scripts/alfworld_eval.py`` plays a split, or
reads a training run's ``eval_*.json``, and prints it)."""

from __future__ import annotations

from turngym.bench.metrics import wilson_interval
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
    """The success table as aligned text, each row with its 95% (Wilson) interval."""
    width = max(len(t) for t in rows)
    lines = [f"{'task type':<{width}}  won/played  success  95% CI", "-" * (width + 37)]
    for t, (w, n) in rows.items():
        lo, hi = wilson_interval(w, n)
        lines.append(f"{t:<{width}}  {w:>4}/{n:<5}  {w / n:7.1%}  {lo:.1%}-{hi:.1%}")
    return "\n".join(lines)


def episode_costs(trajectories: list[Trajectory]) -> dict[str, float]:
    """What the episodes cost a policy: turns, and tokens per turn (prompt growth from the env, and
    the replies), from the episodes' token records (empty for scripted agents)."""
    turns = [len(t.turns) for t in trajectories]
    n_turns = max(1, sum(turns))
    replies = sum(x.num_tokens for t in trajectories for x in t.turns)
    records = [t.record for t in trajectories if t.record is not None and len(t.record.ids)]
    total = sum(len(r.ids) for r in records)
    return {
        "episodes": len(trajectories),
        "mean_turns": sum(turns) / max(1, len(turns)),
        "truncated_share": sum(bool(t.truncated) for t in trajectories) / max(1, len(trajectories)),
        "reply_tokens_per_turn": replies / n_turns,
        "episode_tokens_mean": total / max(1, len(records)),
        "episode_tokens_max": max((len(r.ids) for r in records), default=0),
        "env_tokens_per_turn": (total - replies) / n_turns if records else 0.0,
    }
