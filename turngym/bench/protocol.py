"""The learning protocol's statistics and evaluation: one held-out evaluation every arm shares, a
run's stage-vs-SFT table (``held_out_table``, in every ``summary.json``), the arm-vs-arm statistics,
the Markdown report and the learning-curve plot. ``turngym protocol`` (``turngym/protocol.py``)
runs the arms.

An evaluation plays a fixed list of held-out games, each once greedily and ``samples`` times at the
training temperature with fixed sampling seeds. Every arm and every seed plays the same list in the
same order, so outcomes pair up game by game: differences between arms are paired (bootstrap CI on
the per-game differences, exact McNemar test on the greedy outcomes).
"""

from __future__ import annotations

import ctypes
import gc
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from turngym.agents.base import SamplingParams
from turngym.bench.evaluate import evaluate
from turngym.bench.metrics import (bootstrap_diff, cluster_bootstrap_diff, paired_comparison, seed_t_interval,
                                   wilson_interval)
from turngym.envs import info as envinfo
from turngym.rollout import Collector

BASELINES = ("sft", "sft_continued")


def release_memory() -> bool:
    """Collect garbage and hand the heap's free pages back to the OS; call it between arms.

    A protocol process runs arm after arm. glibc keeps what a finished arm freed (activations,
    optimizer state, a policy) in its heap, behind blocks still in use, so the process's RSS only
    grows to the highest peak any arm had (the Search protocol's process: 2.7 GB, then 7.7 and
    8.6 GB after the branch rounds of seeds 1 and 2, and it stayed there). ``malloc_trim``
    returns those pages. Returns whether it could be called
    (glibc only; elsewhere this only collects garbage).
    """
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        return False
    return True


def task_groups(env_id: str, env_kwargs: dict) -> dict[str, str]:
    """Report group of every task of a split: the env's ``task_group`` (e.g. TextWorld's level)
    when it has one, else its ``task_type``."""
    return envinfo.task_groups(env_id, **env_kwargs)


def held_out_table(stages: dict) -> dict:
    """Each evaluated stage's held-out success with its 95% CI and n, and its paired difference from
    the SFT stage (paired bootstrap over the same held-out episodes)."""
    evals = {k.removeprefix("eval_"): v for k, v in stages.items() if k.startswith("eval_")}
    table = {tag: {"success": v["success"], "ci95": v["success_ci95"], "n": v["episodes"]} for tag, v in evals.items()}
    base = evals.get("sft", {}).get("per_episode_success")
    for tag, v in evals.items():
        other = v.get("per_episode_success")
        if tag != "sft" and base and other and len(other) == len(base):
            d = bootstrap_diff(base, other, paired=True)
            table[tag]["vs_sft"] = {"diff": d["diff"], "ci95": d["ci"], "p": d["p"], "n": len(base)}
    return table


def held_out_eval(policy: Any, env_id: str, env_kwargs: dict, *, games: int, samples: int, temperature: float,
                  max_new_tokens: int, num_envs: int = 16, seed: int = 10_000,
                  groups: dict[str, str] | None = None, collector: Collector | None = None) -> dict:
    """Play the held-out list greedily and ``samples`` times at ``temperature``.

    Args:
        policy: The policy to evaluate (its caches are invalidated first).
        env_id: The env.
        env_kwargs: Constructor kwargs of the held-out split.
        games: Held-out games (cycling over the split's tasks, reset seeds ``seed + i``).
        samples: Samples per game at ``temperature`` (sampling seeds 0..samples-1).
        temperature: The training temperature.
        max_new_tokens: Length cap per utterance.
        num_envs: Episodes in flight.
        seed: Reset seed of the first game: the same for every arm and seed.
        groups: Task id -> report group (default: the trajectories' ``task_type``).
        collector: The process's ``Collector``: envs kept open across evaluations.

    Returns:
        A record with ``evaluate_policy``'s keys (greedy ``success``, ``success_ci95``, ``episodes``,
        ``invalid_action_rate``, ``per_episode_success``) plus ``games`` ([task_id, seed] per game),
        ``groups``, ``temp_success``, ``temp_ci95``, ``per_episode_temp_success`` (mean over samples)
        and ``temp_samples`` (per game, per sample).
    """
    def play(temp: float, sample_seed: int):
        policy.invalidate_caches()
        return evaluate(env_id, policy, episodes=games, seed=seed, env_kwargs=env_kwargs, num_envs=num_envs,
                        sampling=SamplingParams(temperature=temp, max_new_tokens=max_new_tokens, seed=sample_seed),
                        progress=False, distinct=True, collector=collector)

    greedy = play(0.0, 0)
    trajs = greedy.trajectories
    sampled = [[float(t.success) for t in play(temperature, j).trajectories] for j in range(samples)]
    temp_samples = [list(col) for col in zip(*sampled)] if samples else [[] for _ in trajs]
    wins = sum(sum(s) for s in temp_samples)
    return {
        "success": greedy.summary["success"], "success_ci95": greedy.summary["success_ci95"], "episodes": len(trajs),
        "invalid_action_rate": greedy.summary["invalid_action_rate"], "wall_s": greedy.summary["wall_s"],
        "per_episode_success": [float(t.success) for t in trajs],
        "games": [[t.task_id, t.metadata.get("seed")] for t in trajs],
        "groups": [(groups or {}).get(t.task_id, str(t.metadata.get("task_type", "default"))) for t in trajs],
        "temperature": temperature, "samples": samples,
        "temp_success": wins / (len(trajs) * samples) if samples else None,
        "temp_ci95": list(wilson_interval(int(wins), len(trajs) * samples)) if samples else None,
        "per_episode_temp_success": [sum(s) / len(s) for s in temp_samples] if samples else [],
        "temp_samples": temp_samples,
    }


def _cell(rec: dict) -> dict:
    return {"success": rec["success"], "ci95": rec["success_ci95"], "n": rec["episodes"],
            "temp_success": rec.get("temp_success"), "temp_ci95": rec.get("temp_ci95")}


def _vs(base: dict | None, rec: dict) -> dict | None:
    """Paired comparison of ``rec`` against ``base`` (greedy, and temperature per-game means)."""
    if base is None or base["games"] != rec["games"]:
        return None
    out = {"greedy": paired_comparison(base["per_episode_success"], rec["per_episode_success"])}
    if base.get("per_episode_temp_success") and rec.get("per_episode_temp_success"):
        out["temp"] = paired_comparison(base["per_episode_temp_success"], rec["per_episode_temp_success"])
    return out


def compare_arms(finals: dict[str, dict[int, dict]], baselines: tuple[str, ...] = BASELINES) -> dict:
    """Every arm against each baseline arm: per seed, the mean over seeds, and pooled over seeds x games.

    Args:
        finals: ``{arm: {seed: record}}`` of each arm's final ``held_out_eval``.
        baselines: Arms the others are compared with (those present are used).

    Returns:
        ``{arm: {"per_seed": {seed: {"greedy", "vs_<baseline>"...}}, "mean": {...}, "by_group": {...}}}``:
        ``mean`` holds the mean over seeds of success, temperature success and each ``vs`` difference,
        plus ``seed_t_vs_<baseline>`` (a t-interval over the per-seed differences) and
        ``pooled_vs_<baseline>`` (a cluster bootstrap over games, every game's seeds resampled
        together: the seeds replay the same games, so their pairs are not independent); ``by_group`` the
        greedy success per report group, pooled over seeds.
    """
    out = {}
    for arm, by_seed in finals.items():
        per_seed = {}
        for seed, rec in sorted(by_seed.items()):
            row = _cell(rec)
            for b in baselines:
                if b != arm and (v := _vs(finals.get(b, {}).get(seed), rec)) is not None:
                    row[f"vs_{b}"] = v
            per_seed[seed] = row
        out[arm] = {"per_seed": per_seed, "mean": _mean_row(arm, by_seed, per_seed, finals, baselines),
                    "by_group": _by_group(by_seed.values())}
    return out


def _mean_row(arm: str, by_seed: dict, per_seed: dict, finals: dict, baselines: tuple[str, ...]) -> dict:
    rows = list(per_seed.values())
    temps = [r["temp_success"] for r in rows if r["temp_success"] is not None]
    mean = {"success": float(np.mean([r["success"] for r in rows])), "seeds": len(rows),
            "temp_success": float(np.mean(temps)) if temps else None,
            "n": sum(r["n"] for r in rows)}
    for b in baselines:
        key = f"vs_{b}"
        diffs = [r[key]["greedy"]["diff"] for r in rows if key in r]
        if b == arm or not diffs:
            continue
        mean[key] = float(np.mean(diffs))
        mean[f"seed_t_{key}"] = seed_t_interval(diffs)
        seeds = [s for s in by_seed if key in per_seed[s]]
        pooled = _pooled_vs([finals[b][s] for s in seeds], [by_seed[s] for s in seeds])
        if pooled is not None:
            mean[f"pooled_{key}"] = pooled
    return mean


def _pooled_vs(base: list[dict], recs: list[dict]) -> dict | None:
    """Seeds pooled: a cluster bootstrap over games (each game's seeds resampled together), on the
    greedy outcomes and on the per-game temperature means. None when the seeds' game lists differ
    (then games are not clusters)."""
    games = base[0]["games"]
    if any(r["games"] != games for r in (*base, *recs)):
        return None
    out = {"greedy": cluster_bootstrap_diff([r["per_episode_success"] for r in base],
                                            [r["per_episode_success"] for r in recs])}
    if all(r.get("per_episode_temp_success") for r in (*base, *recs)):
        out["temp"] = cluster_bootstrap_diff([r["per_episode_temp_success"] for r in base],
                                             [r["per_episode_temp_success"] for r in recs])
    return out


def _by_group(recs) -> dict:
    wins: dict[str, list[float]] = defaultdict(list)
    for rec in recs:
        for g, s in zip(rec["groups"], rec["per_episode_success"]):
            wins[g].append(s)
    out = {}
    for g, v in sorted(wins.items()):
        out[g] = {"success": sum(v) / len(v), "ci95": list(wilson_interval(int(sum(v)), len(v))), "n": len(v)}
    return out


def steps_to_target(curves: dict[str, dict[int, list[dict]]], target: float) -> dict:
    """Env steps each arm needed to reach ``target`` held-out success, per seed and over seeds.

    A seed's value is the env steps of its first evaluated point at or above ``target`` (so it is an
    upper bound when evaluations are sparse), or None when no point reaches it. Arms without env
    steps (SFT-continued) are left out.

    Args:
        curves: ``{arm: {seed: [{"env_steps", "success", ...}, ...]}}`` in training order.
        target: The held-out greedy success to reach.

    Returns:
        ``{arm: {"per_seed": {seed: steps | None}, "reached": k, "seeds": n, "mean_steps": mean over
        the seeds that reached it | None, "final_env_steps": mean over seeds of the last point's env
        steps}}``.
    """
    out = {}
    for arm, by_seed in curves.items():
        per_seed, finals = {}, []
        for seed, points in sorted(by_seed.items()):
            points = [p for p in points if p.get("env_steps") is not None]
            if not points:
                continue
            per_seed[seed] = next((p["env_steps"] for p in points if p["success"] >= target), None)
            finals.append(points[-1]["env_steps"])
        if not finals:
            continue
        hit = [v for v in per_seed.values() if v is not None]
        out[arm] = {"per_seed": per_seed, "reached": len(hit), "seeds": len(per_seed),
                    "mean_steps": float(np.mean(hit)) if hit else None,
                    "final_env_steps": float(np.mean(finals))}
    return out


# ----- the report ---------------------------------------------------------------------------------
def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _diff(v: dict | None) -> str:
    if v is None:
        return "-"
    lo, hi = v["ci"]
    p = "" if v.get("p_mcnemar") is None else f", p={v['p_mcnemar']:.3g}"
    return f"{v['diff']:+.1%} [{lo:+.1%}, {hi:+.1%}]{p}"


def markdown_report(table: dict, *, title: str = "Learning protocol", note: str = "",
                    to_target: dict | None = None, target: float | None = None,
                    baselines: tuple[str, ...] = BASELINES) -> str:
    """``compare_arms``' table as Markdown: arm x seed (and mean over seeds) with the paired
    differences against the baselines, then greedy success per report group.

    Args:
        table: ``compare_arms``' result.
        title: The heading.
        note: A line under the heading (e.g. the env, games, temperature).
        to_target: ``steps_to_target``' result, reported after the table when given.
        target: The success ``to_target`` was computed for.
        baselines: The arms that get a column of paired differences (those in ``table``).

    Returns:
        The Markdown text.
    """
    bases = [b for b in baselines if b in table]
    head = ["arm", "seed", "greedy success [95% CI] (n)", "temp success"] + [f"vs {b}: diff [95% CI], McNemar p"
                                                                          for b in bases]
    lines = [f"# {title}", "", note, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, res in table.items():
        for seed, r in res["per_seed"].items():
            lo, hi = r["ci95"]
            cells = [arm, str(seed), f"{r['success']:.1%} [{lo:.1%}, {hi:.1%}] ({r['n']})", _pct(r["temp_success"])]
            cells += [_diff(r.get(f"vs_{b}", {}).get("greedy")) for b in bases]
            lines.append("| " + " | ".join(cells) + " |")
        m = res["mean"]
        cells = [f"**{arm}**", f"mean of {m['seeds']}", f"{m['success']:.1%} ({m['n']} games)", _pct(m["temp_success"])]
        for b in bases:
            cells.append(_pooled_cell(m, b))
        lines.append("| " + " | ".join(cells) + " |")
    if to_target:
        lines += ["", f"## Env steps to reach {target:.1%} held-out greedy success", "",
                  "First evaluated point at or above the target (an upper bound between evaluations).", "",
                  "| arm | per seed | seeds reaching it | mean env steps (those seeds) | env steps at the end (mean) |",
                  "|---|---|---|---|---|"]
        for arm, r in to_target.items():
            seeds = ", ".join("-" if v is None else str(v) for v in r["per_seed"].values())
            mean = "-" if r["mean_steps"] is None else f"{r['mean_steps']:.0f}"
            lines.append(f"| {arm} | {seeds} | {r['reached']}/{r['seeds']} | {mean} | {r['final_env_steps']:.0f} |")
    groups = sorted({g for res in table.values() for g in res["by_group"]})
    lines += ["", "## Greedy success per task group (pooled over seeds)", "",
              "| group | " + " | ".join(table) + " |", "|" + "---|" * (len(table) + 1)]
    for g in groups:
        cells = [g] + [_group_cell(res["by_group"].get(g)) for res in table.values()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _pooled_cell(mean: dict, base: str) -> str:
    """The mean row's cell against ``base``: the mean paired difference, the cluster-bootstrap
    interval over games (seeds kept together) and the seed-level t-interval."""
    key = f"vs_{base}"
    if key not in mean:
        return "-"
    cell = f"{mean[key]:+.1%}"
    pooled = mean.get(f"pooled_{key}", {}).get("greedy")
    if pooled is not None:
        lo, hi = pooled["ci"]
        cell += f"; games-cluster [{lo:+.1%}, {hi:+.1%}]"
    t = mean.get(f"seed_t_{key}")
    if t is not None and t["seeds"] > 1:
        lo, hi = t["ci"]
        cell += f"; seeds-t [{lo:+.1%}, {hi:+.1%}]"
    return cell


def _group_cell(c: dict | None) -> str:
    return "-" if c is None else f"{c['success']:.1%} ({c['n']})"


def plot_curves(curves: dict[str, dict[int, list[dict]]], path: str | Path, title: str = "") -> Path | None:
    """Held-out greedy success of every arm against env episodes and against training seconds: every
    evaluation point with its 95% interval (each seed's, thin), and the mean over seeds (thick).
    Arms without env episodes (SFT-continued) appear only against seconds; a single-point arm (SFT)
    is a dashed horizontal line with its interval shaded.

    Args:
        curves: ``{arm: {seed: [{"env_episodes", "train_seconds", "success", "success_ci95"}, ...]}}``
            (points without ``env_episodes``, from before it was recorded, use ``env_steps``).
        path: The PNG to write.
        title: The figure title.

    Returns:
        The PNG path, or None when there is nothing to plot.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not any(pts for by_seed in curves.values() for pts in by_seed.values()):
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for i, (arm, by_seed) in enumerate(curves.items()):
        color = f"C{i % 10}"
        for ax, x_key in zip(axes, ("env_episodes", "train_seconds")):
            _plot_arm(ax, arm, by_seed, x_key, color)
    for ax, label in zip(axes, ("training episodes played in the env", "training wall-clock (s, evaluation excluded)")):
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("held-out success (greedy)")
    axes[0].set_ylim(-0.02, 1.02)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def _plot_arm(ax: Any, arm: str, by_seed: dict[int, list[dict]], x_key: str, color: str) -> None:
    def x_of(p: dict):
        return p.get(x_key) if x_key != "env_episodes" or p.get(x_key) is not None else p.get("env_steps")

    series = [[(x_of(p), p["success"], p.get("success_ci95")) for p in pts if x_of(p) is not None]
              for pts in by_seed.values()]
    series = [s for s in series if s]
    if not series:
        return
    if all(len(s) == 1 for s in series):  # one point (the SFT stage): a reference line, its interval shaded
        mean = float(np.mean([s[0][1] for s in series]))
        ax.axhline(mean, color=color, ls="--", lw=1.5, label=arm)
        cis = [s[0][2] for s in series if s[0][2]]
        if len(series) == 1 and cis:
            ax.axhspan(cis[0][0], cis[0][1], color=color, alpha=0.08)
        return
    for s in series:  # each seed's points with their 95% intervals
        xs, ys = [p[0] for p in s], [p[1] for p in s]
        lo = [p[1] - p[2][0] if p[2] else 0.0 for p in s]
        hi = [p[2][1] - p[1] if p[2] else 0.0 for p in s]
        ax.errorbar(xs, ys, yerr=[lo, hi], color=color, lw=0.7, alpha=0.5, capsize=2, fmt="o", ms=2)
        ax.plot(xs, ys, color=color, lw=0.7, alpha=0.4)
    series = [[(x, y) for x, y, _ in s] for s in series]
    # the mean over seeds at each point index (seeds of one arm evaluate at matching points)
    n = min(len(s) for s in series)
    xs = [float(np.mean([s[k][0] for s in series])) for k in range(n)]
    ys = [float(np.mean([s[k][1] for s in series])) for k in range(n)]
    ax.plot(xs, ys, color=color, lw=2, marker="o", ms=3, label=arm)

