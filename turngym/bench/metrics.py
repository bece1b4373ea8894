"""Metrics over trajectories, with confidence intervals.

Success is a binomial proportion, so its interval is Wilson's (well-behaved at 0% and 100%,
unlike the normal approximation). Means of unbounded quantities get a percentile bootstrap.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Sequence

import numpy as np

from turngym.types import Trajectory


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion.

    Args:
        successes: Number of successes.
        n: Number of trials.
        z: Normal quantile (1.96 for 95%).

    Returns:
        ``(low, high)``; ``(0.0, 1.0)`` when ``n == 0``.
    """
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap_ci(values: Sequence[float], n_boot: int = 2000, alpha: float = 0.05, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval for the mean of ``values``."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1)
    return float(np.quantile(means, alpha / 2)), float(np.quantile(means, 1 - alpha / 2))


def summarize(trajectories: Sequence[Trajectory]) -> dict:
    """Success (with 95% Wilson CI), mean outcome and return, turns, invalid-action rate, tokens.

    Returns:
        A JSON-serialisable dict; ``by_task_type`` holds the same numbers per task type.
    """
    out = _summary(trajectories)
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        groups[str(t.metadata.get("task_type", "default"))].append(t)
    out["by_task_type"] = {k: _summary(v) for k, v in sorted(groups.items())}
    return out


def _summary(trajs: Sequence[Trajectory]) -> dict:
    n = len(trajs)
    wins = sum(t.success for t in trajs)
    low, high = wilson_interval(wins, n)
    turns = [len(t.turns) for t in trajs]
    steps = sum(turns)
    invalid = sum(1 for t in trajs for turn in t.turns if not turn.action_valid)
    tool_calls = sum(len(turn.tool_calls) for t in trajs for turn in t.turns)
    tokens = sum(turn.num_tokens for t in trajs for turn in t.turns)
    return {
        "episodes": n,
        "success": wins / n if n else 0.0,
        "success_ci95": [low, high],
        "mean_outcome": float(np.mean([t.outcome for t in trajs])) if n else 0.0,
        "mean_return": float(np.mean([t.total_reward for t in trajs])) if n else 0.0,
        "mean_turns": float(np.mean(turns)) if n else 0.0,
        "invalid_action_rate": invalid / steps if steps else 0.0,
        "tool_calls": tool_calls,
        "action_tokens": tokens,
        "truncated": sum(t.truncated for t in trajs),
        "errors": sum(1 for t in trajs if "error" in t.metadata),
    }


def format_summary(summary: dict, title: str = "") -> str:
    """A compact human-readable table of a ``summarize`` result."""
    lo, hi = summary["success_ci95"]
    lines = [title] if title else []
    lines.append(
        f"success {summary['success']:.1%} (95% CI {lo:.1%}-{hi:.1%}) over {summary['episodes']} episodes | "
        f"return {summary['mean_return']:.3f} | turns {summary['mean_turns']:.2f} | "
        f"invalid actions {summary['invalid_action_rate']:.1%}"
        + (f" | errors {summary['errors']}" if summary["errors"] else "")
    )
    by_type = summary.get("by_task_type") or {}
    if len(by_type) > 1 or (by_type and "default" not in by_type):
        width = max(len(k) for k in by_type)
        lines.append(f"  {'task type'.ljust(width)}  episodes  success  95% CI         turns  invalid")
        for k, s in by_type.items():
            lo, hi = s["success_ci95"]
            lines.append(
                f"  {k.ljust(width)}  {s['episodes']:8d}  {s['success']:6.1%}  {lo:5.1%}-{hi:6.1%}  "
                f"{s['mean_turns']:5.2f}  {s['invalid_action_rate']:6.1%}"
            )
    return "\n".join(lines)


def bootstrap_diff(
    a: Sequence[float], b: Sequence[float], *, paired: bool, n_boot: int = 10000, alpha: float = 0.05, seed: int = 0
) -> dict:
    """Difference of means ``mean(b) - mean(a)`` with a percentile bootstrap interval.

    Paired: ``a[i]`` and ``b[i]`` are the same episode (same task and seed) played by two agents,
    so the per-episode differences are resampled together, which removes the task-difficulty
    variance from the interval. Unpaired: each side is resampled on its own.

    Args:
        a: Per-episode values of the baseline.
        b: Per-episode values of the other run (same length and order when ``paired``).
        paired: Resample episode pairs (True) or each sample independently (False).
        n_boot: Bootstrap resamples.
        alpha: 1 - confidence level.
        seed: Seed of the resampling.

    Returns:
        ``{"diff", "ci": [low, high], "p": two-sided bootstrap p-value, "paired", "significant"}``;
        significant means the interval excludes 0; ``p`` is at least ``2 / (n_boot + 1)``, the
        smallest p that many resamples can show.

    Raises:
        ValueError: an empty sample, or unequal lengths when ``paired``.
    """
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.size == 0 or y.size == 0:
        raise ValueError("bootstrap_diff needs two non-empty samples")
    rng = np.random.default_rng(seed)
    if paired:
        if x.size != y.size:
            raise ValueError(f"paired samples differ in length: {x.size} vs {y.size}")
        d = y - x
        boot = d[rng.integers(0, d.size, size=(n_boot, d.size))].mean(axis=1)
    else:
        boot = (y[rng.integers(0, y.size, size=(n_boot, y.size))].mean(axis=1)
                - x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1))
    low, high = float(np.quantile(boot, alpha / 2)), float(np.quantile(boot, 1 - alpha / 2))
    # Two-sided p: twice the bootstrap mass on the far side of 0 (0 itself counts for both sides),
    # counted as (k + 1) / (n_boot + 1) (Davison and Hinkley, 1997, eq. 4.11): n_boot resamples
    # cannot show a p below that, and a resample set with none past 0 is no proof of p = 0
    far = min(int(np.sum(boot <= 0)), int(np.sum(boot >= 0)))
    p = min(1.0, 2 * (far + 1) / (n_boot + 1))
    return {
        "diff": float(y.mean() - x.mean()),
        "ci": [low, high],
        "p": p,
        "paired": paired,
        "significant": bool(low > 0 or high < 0),
    }


def mcnemar_exact(a: Sequence[float], b: Sequence[float]) -> dict:
    """Exact McNemar test of paired binary outcomes (two agents on the same episodes).

    Only discordant pairs carry information: ``n01`` episodes only ``b`` solved, ``n10`` only ``a``.
    Under the null (equal success rates) each discordant pair is a fair coin, so the two-sided
    p-value is ``min(1, 2 * P(X <= min(n01, n10)))`` with ``X ~ Binomial(n01 + n10, 1/2)``.

    Args:
        a: Per-episode 0/1 outcomes of the baseline.
        b: Per-episode 0/1 outcomes of the other agent, same length and order.

    Returns:
        ``{"n01", "n10", "p"}``; ``p`` is 1.0 when there is no discordant pair.

    Raises:
        ValueError: unequal lengths, or an outcome that is not 0 or 1.
    """
    if len(a) != len(b):
        raise ValueError(f"paired samples differ in length: {len(a)} vs {len(b)}")
    if any(v not in (0, 1) for v in (*a, *b)):
        raise ValueError("mcnemar_exact needs 0/1 outcomes")
    n01 = sum(1 for x, y in zip(a, b) if not x and y)
    n10 = sum(1 for x, y in zip(a, b) if x and not y)
    n = n01 + n10
    tail = sum(math.comb(n, i) for i in range(min(n01, n10) + 1)) / 2**n
    return {"n01": n01, "n10": n10, "p": min(1.0, 2 * tail)}


def paired_comparison(a: Sequence[float], b: Sequence[float], *, n_boot: int = 10000, seed: int = 0) -> dict:
    """``b`` against the baseline ``a`` on the same episodes: the difference of success rates with
    a paired-bootstrap 95% CI, and (for 0/1 outcomes) the exact McNemar p-value.

    Args:
        a: Per-episode outcomes of the baseline (0/1, or per-episode means of several samples).
        b: The other agent's outcomes on the same episodes in the same order.
        n_boot: Bootstrap resamples.
        seed: Seed of the resampling.

    Returns:
        ``{"diff", "ci": [low, high], "n", "p_mcnemar", "n01", "n10"}``; the McNemar entries are
        None when the outcomes are not all 0/1.
    """
    d = bootstrap_diff(a, b, paired=True, n_boot=n_boot, seed=seed)
    out = {"diff": d["diff"], "ci": d["ci"], "n": len(a), "p_mcnemar": None, "n01": None, "n10": None}
    if all(v in (0, 1) for v in (*a, *b)):
        m = mcnemar_exact(a, b)
        out.update(p_mcnemar=m["p"], n01=m["n01"], n10=m["n10"])
    return out


# Two-sided 97.5% quantiles of Student's t for 1..10 degrees of freedom (a protocol has 2-10 seeds);
# beyond 10 the normal's 1.96 is within 0.25 of them.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def seed_t_interval(diffs: Sequence[float]) -> dict:
    """A 95% Student-t interval for the mean of per-seed differences (each seed one observation).

    With 3 seeds this is wide (t = 4.30 on 2 degrees of freedom); it says how far the seeds agree.

    Args:
        diffs: One paired difference per seed (e.g. arm minus SFT, each over the same games).

    Returns:
        ``{"diff": mean, "ci": [low, high], "seeds": n}``; with one seed the interval is ``[nan, nan]``.

    Raises:
        ValueError: no seeds.
    """
    x = np.asarray(diffs, dtype=float)
    if x.size == 0:
        raise ValueError("seed_t_interval needs at least one seed")
    mean = float(x.mean())
    if x.size == 1:
        return {"diff": mean, "ci": [float("nan"), float("nan")], "seeds": 1}
    half = _T975.get(x.size - 1, 1.96) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return {"diff": mean, "ci": [mean - half, mean + half], "seeds": int(x.size)}


def cluster_bootstrap_diff(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]], *, n_boot: int = 10000,
                           alpha: float = 0.05, seed: int = 0) -> dict:
    """Paired difference pooled over seeds, resampling games with all their seeds together.

    ``a[s][g]`` and ``b[s][g]`` are game ``g``'s outcome in seed ``s`` for the baseline and the
    other arm. Every seed plays the same games, so one game's seeds are not independent draws:
    resampling the ``S x G`` pairs as if they were would make the interval about sqrt(S) too narrow.
    Each resample draws ``G`` games with replacement and keeps every seed of a drawn game (a
    cluster bootstrap with games as clusters).

    Args:
        a: Baseline outcomes, ``S`` seeds x ``G`` games (same game order in every seed).
        b: The other arm's outcomes on the same seeds and games.
        n_boot: Bootstrap resamples.
        alpha: 1 - confidence level.
        seed: Seed of the resampling.

    Returns:
        ``{"diff", "ci": [low, high], "games": G, "seeds": S, "significant"}``.

    Raises:
        ValueError: empty input, or shapes that differ.
    """
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.ndim != 2 or x.size == 0 or x.shape != y.shape:
        raise ValueError(f"cluster_bootstrap_diff needs two equal S x G arrays, got {x.shape} and {y.shape}")
    per_game = (y - x).mean(axis=0)  # (G,): each game's difference, averaged over its seeds
    rng = np.random.default_rng(seed)
    boot = per_game[rng.integers(0, per_game.size, size=(n_boot, per_game.size))].mean(axis=1)
    low, high = float(np.quantile(boot, alpha / 2)), float(np.quantile(boot, 1 - alpha / 2))
    return {"diff": float(per_game.mean()), "ci": [low, high], "games": int(x.shape[1]), "seeds": int(x.shape[0]),
            "significant": bool(low > 0 or high < 0)}
