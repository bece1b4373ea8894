"""The benchmark report: numbers per env, per task type and per suite, as JSON, Markdown and PNG.

Success and mean score carry 95% percentile-bootstrap intervals over episodes (the Wilson
interval of ``summarize`` is kept in the JSON as ``success_ci95``).
"""

from __future__ import annotations

import json
import platform
import time
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from turngym.bench.metrics import bootstrap_ci, summarize
from turngym.types import Trajectory


def env_summary(trajs: Sequence[Trajectory]) -> dict:
    """``summarize`` plus bootstrap CIs and per-episode means, for the env and each task type."""
    out = _with_bootstrap(summarize(trajs), trajs)
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        groups[str(t.metadata.get("task_type", "default"))].append(t)
    for name, group in groups.items():
        _with_bootstrap(out["by_task_type"][name], group)
    return out


def _with_bootstrap(s: dict, trajs: Sequence[Trajectory]) -> dict:
    n = max(len(trajs), 1)
    s["success_boot_ci95"] = list(bootstrap_ci([float(t.success) for t in trajs]))
    s["mean_outcome_ci95"] = list(bootstrap_ci([t.outcome for t in trajs]))
    s["mean_action_tokens"] = s["action_tokens"] / n
    s["mean_tool_calls"] = s["tool_calls"] / n
    return s


def config_dict(cfg: Any) -> dict[str, Any]:
    """A run's settings (a ``BenchConfig``), for ``results.json``."""
    return asdict(cfg)


def build_results(cfg, plans, records: dict, *, wall_s: float, out_dir: Path) -> dict:
    """The machine-readable report of a run.

    Args:
        cfg: The run's ``BenchConfig``.
        plans: ``EntryPlan`` per suite entry (played or skipped).
        records: The episode log, by (env key, spec index).
        wall_s: This invocation's wall time (a resumed run's envs also sum their earlier time).
        out_dir: Where the run lives.

    Returns:
        ``{"config", "envs": {key: summary + "episodes_detail"}, "skipped": {key: reason},
        "suites": {name: pooled success}, "wall_s", "created"}``.
    """

    envs, skipped = {}, {}
    for plan in plans:
        key = plan.entry.key
        if plan.skipped:
            skipped[key] = plan.skipped
            continue
        recs = sorted((r for (k, _), r in records.items() if k == key), key=lambda r: r["index"])
        trajs = [Trajectory.from_dict(r["trajectory"]) for r in recs]
        s = env_summary(trajs)
        s.update(env_id=plan.entry.env_id, split=plan.entry.split, planned=len(plan.specs),
                 wall_s=float(sum(r["wall_share_s"] for r in recs)))
        s["episodes_detail"] = [
            {"index": r["index"], "task_id": r["task_id"], "seed": r["seed"], "task_type": t.metadata.get("task_type"),
             "outcome": t.outcome, "success": bool(t.success)}
            for r, t in zip(recs, trajs)
        ]
        envs[key] = s
    return {
        "config": {**config_dict(cfg), "out": str(out_dir), "entries": [[p.entry.key, p.entry.split, p.entry.episodes] for p in plans]},
        "envs": envs,
        "skipped": skipped,
        "suites": suite_groups(envs, [p.entry.key for p in plans]),
        "wall_s": wall_s,
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        "host": {"python": platform.python_version(), "machine": platform.machine()},
    }


def suite_groups(envs: dict, keys: list[str]) -> dict:
    """Pooled success of every registered suite (except ``all``) whose entries this run holds."""
    from turngym.bench.suites import get_suite, list_suites

    out = {}
    for name in list_suites():
        members = [e.key for e in get_suite(name)]
        if name == "all" or not set(members) <= set(keys):
            continue
        played = [k for k in members if k in envs]
        wins = [float(d["success"]) for k in played for d in envs[k]["episodes_detail"]]
        out[name] = {
            "envs": len(played),
            "skipped": [k for k in members if k not in envs],
            "episodes": len(wins),
            "success": float(np.mean(wins)) if wins else None,
            "success_boot_ci95": list(bootstrap_ci(wins)) if wins else None,
        }
    return out


def _pct(x: float | None) -> str:
    return "n/a" if x is None or x != x else f"{100 * x:.1f}"


def _ci(s: dict, mean_key: str, ci_key: str) -> str:
    lo, hi = s[ci_key] or (None, None)
    return f"{_pct(s[mean_key])} [{_pct(lo)}, {_pct(hi)}]"


def markdown(results: dict) -> str:
    """Markdown tables: per env, per suite, per task type, then the skipped entries."""
    c = results["config"]
    lines = [
        f"## Benchmark: suite `{c['suite']}`, agent `{c['agent']}`",
        "",
        f"seed {c['seed']}, {len(results['envs'])} envs played, {len(results['skipped'])} skipped, "
        f"wall {results['wall_s']:.0f} s, {results['created']}. Success and score in %, 95% bootstrap CI.",
        "",
        "| env | episodes | success % [95% CI] | score % [95% CI] | turns | action tokens/ep | tool calls/ep "
        "| invalid % | truncated | errors | wall s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, s in results["envs"].items():
        lines.append(
            f"| {key} | {s['episodes']} | {_ci(s, 'success', 'success_boot_ci95')} | "
            f"{_ci(s, 'mean_outcome', 'mean_outcome_ci95')} | {s['mean_turns']:.1f} | {s['mean_action_tokens']:.1f} | "
            f"{s['mean_tool_calls']:.1f} | {_pct(s['invalid_action_rate'])} | {s['truncated']} | {s['errors']} | "
            f"{s['wall_s']:.1f} |"
        )
    if results["suites"]:
        lines += ["", "| suite | envs | episodes | success % [95% CI] | skipped |", "|---|---:|---:|---:|---|"]
        for name, g in results["suites"].items():
            lines.append(f"| {name} | {g['envs']} | {g['episodes']} | {_ci(g, 'success', 'success_boot_ci95')} | "
                         f"{', '.join(g['skipped']) or '-'} |")
    lines += ["", "| env | task type | episodes | success % [95% CI] | score % [95% CI] | turns | invalid % |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for key, s in results["envs"].items():
        for tt, t in s["by_task_type"].items():
            lines.append(f"| {key} | {tt} | {t['episodes']} | {_ci(t, 'success', 'success_boot_ci95')} | "
                         f"{_ci(t, 'mean_outcome', 'mean_outcome_ci95')} | {t['mean_turns']:.1f} | "
                         f"{_pct(t['invalid_action_rate'])} |")
    if results["skipped"]:
        lines += ["", "Skipped:"] + [f"- `{k}`: {why}" for k, why in results["skipped"].items()]
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> Path:
    """A horizontal bar chart of success per env with bootstrap CI error bars (Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(results["envs"])
    succ = np.array([results["envs"][k]["success"] for k in keys], dtype=float)
    ci = np.array([results["envs"][k]["success_boot_ci95"] for k in keys], dtype=float).reshape(-1, 2)
    err = np.clip(np.stack([succ - ci[:, 0], ci[:, 1] - succ]), 0, None) if keys else None
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.35 * max(len(keys), 1)))
    ax.barh(range(len(keys)), succ, xerr=err, capsize=3, color="tab:blue")
    ax.set_yticks(range(len(keys)), [k.removeprefix("turngym/") for k in keys], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.05)
    ax.set_xlabel("success (95% bootstrap CI)")
    c = results["config"]
    ax.set_title(f"suite {c['suite']}, agent {c['agent']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_outputs(results: dict, out_dir: Path) -> dict[str, Path]:
    """Write ``results.json``, ``results.md`` and ``results.png`` into ``out_dir``."""
    out_dir = Path(out_dir)
    paths = {"json": out_dir / "results.json", "md": out_dir / "results.md", "png": out_dir / "results.png"}
    tmp = paths["json"].with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(paths["json"])
    paths["md"].write_text(markdown(results))
    plot(results, paths["png"])
    return paths


def load_results(path: str | Path) -> dict[str, Any]:
    """Read a ``results.json``."""
    return json.loads(Path(path).read_text())
