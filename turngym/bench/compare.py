"""Compare two benchmark runs: per env, the success difference b - a with a 95% CI.

Where both runs played exactly the same episode specs of an env (same spec indices, task ids and
reset seeds, as two agents on one suite with one seed do), the test is a paired bootstrap over
per-episode differences; otherwise an unpaired bootstrap resamples each run on its own. The
difference is called significant when its 95% interval excludes 0 (see
``turngym.bench.metrics.bootstrap_diff``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from turngym.bench.metrics import bootstrap_diff
from turngym.bench.report import load_results


def _episodes(env: dict) -> dict[tuple, float]:
    return {(d["index"], d["task_id"], d["seed"]): float(d["success"]) for d in env.get("episodes_detail", [])}


def compare_results(a: dict, b: dict, *, n_boot: int = 10000, seed: int = 0) -> list[dict[str, Any]]:
    """One row per env played in both runs.

    Args:
        a: Baseline results (a ``results.json`` dict).
        b: Results to compare against it.
        n_boot: Bootstrap resamples.
        seed: Seed of the resampling.

    Returns:
        Rows ``{"env", "a", "b", "n_a", "n_b", "n_boot", "diff", "ci", "p", "paired", "significant"}``.
    """
    rows = []
    for key, ea in a["envs"].items():
        eb = b["envs"].get(key)
        if eb is None:
            continue
        xa, xb = _episodes(ea), _episodes(eb)
        if not xa or not xb:
            continue
        paired = xa.keys() == xb.keys()
        if paired:
            order = sorted(xa)
            d = bootstrap_diff([xa[k] for k in order], [xb[k] for k in order], paired=True, n_boot=n_boot, seed=seed)
        else:
            d = bootstrap_diff(list(xa.values()), list(xb.values()), paired=False, n_boot=n_boot, seed=seed)
        rows.append({"env": key, "a": ea["success"], "b": eb["success"], "n_a": len(xa), "n_b": len(xb),
                     "n_boot": n_boot, **d})
    return rows


def _p(row: dict) -> str:
    floor = 2 / (row["n_boot"] + 1)  # the smallest p the bootstrap can show: no resample past 0
    return f"<= {floor:.1g}" if row["p"] <= floor else f"{row['p']:.3g}"


def format_compare(rows: list[dict], a_name: str, b_name: str, only_a=(), only_b=()) -> str:
    """A Markdown table of ``compare_results`` rows, with the envs found in one run only."""
    lines = [
        f"a = {a_name}", f"b = {b_name}", "",
        "| env | success a % | success b % | b - a (pts) | 95% CI (pts) | p | test | verdict |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        lo, hi = r["ci"]
        test = "paired bootstrap" if r["paired"] else "unpaired bootstrap"
        verdict = ("b better" if r["diff"] > 0 else "b worse") if r["significant"] else "no significant difference"
        lines.append(
            f"| {r['env']} | {100 * r['a']:.1f} (n={r['n_a']}) | {100 * r['b']:.1f} (n={r['n_b']}) | "
            f"{100 * r['diff']:+.1f} | [{100 * lo:+.1f}, {100 * hi:+.1f}] | {_p(r)} | {test} | {verdict} |"
        )
    for name, keys in (("a", only_a), ("b", only_b)):
        if keys:
            lines.append(f"\nonly in {name}: {', '.join(keys)}")
    return "\n".join(lines)


def compare_files(path_a: str | Path, path_b: str | Path) -> str:
    """Load two ``results.json`` files and format their comparison."""
    a, b = load_results(path_a), load_results(path_b)
    rows = compare_results(a, b)
    only_a = [k for k in a["envs"] if k not in b["envs"]]
    only_b = [k for k in b["envs"] if k not in a["envs"]]
    return format_compare(rows, str(path_a), str(path_b), only_a, only_b)
