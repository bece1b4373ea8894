"""Pair arms from several ``turngym protocol`` runs that played the same held-out games.

A new arm is often run later than its baselines (another day, another machine): this script takes
each arm's per-game outcomes from the runs' ``protocol.json`` files and builds the protocol's own
table from them: per seed a paired bootstrap CI and McNemar p, and over seeds a seed-level t-interval
and a cluster bootstrap over games. Each ``--run`` names a ``protocol.json``, optionally followed by
the arms to take from it (``arm`` or ``arm=new_name``); by default all of them. An (arm, seed) that
two runs both hold is an error, so that no outcome is silently replaced. Writes OUT.json (the table,
the finals and the curves), OUT.md and, where the runs recorded learning curves, OUT.png.

An arm's evaluation part way through its training (an SFT-continued arm evaluated where a shorter RL
arm ended) is in its run dir's ``curve.json`` rather than in ``protocol.json``: ``--point CURVE_JSON
SEED ARM SECONDS`` takes the point evaluated at SECONDS of training (to within 1%) as that arm's
outcomes for that seed. A run stopped before its ``protocol.json`` was written still holds each
finished stage's evaluation in its run dirs' ``stages.json``: ``--stage STAGES_JSON SEED ARM STAGE``
takes one (``eval_sft``: the SFT weights the run's RL arms start from).

    python scripts/merge_protocols.py --baseline branch_bc --baseline sft \\
        --run docs/results/protocol_2026-11-26_search_three_seeds.json branch_bc archer sft \\
        --run runs/search_wins/protocol.json archer_wins sft=sft_rerun --out runs/search_wins/merged
    python scripts/merge_protocols.py --baseline sft_continued_4976s \\
        --point runs/tw0/seed0/sft_continued/curve.json 0 sft_continued_4976s 4976 \\
        --run runs/tw0/protocol.json archer_sil_v0 --out runs/tw0/at_4976s
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from turngym.bench.protocol import compare_arms, markdown_report, plot_curves


def take(report: dict, picks: list[str], key: str = "finals") -> dict[str, dict[str, dict]]:
    """``{arm: {seed: record}}`` of ``picks`` (``arm`` or ``arm=new_name``; empty: every arm) from the
    report's ``key`` section (``finals``, or ``curves``, which a run may lack: then empty)."""
    finals = report["finals"]
    names = dict(p.split("=", 1) if "=" in p else (p, p) for p in picks) or {a: a for a in finals}
    missing = sorted(set(names) - set(finals))
    if missing:
        raise SystemExit(f"arms {missing} are not in this run (it has {sorted(finals)})")
    section = report.get(key, {})
    return {new: {str(s): rec for s, rec in section[old].items()} for old, new in names.items() if old in section}


def merge(runs: list[tuple[dict, list[str]]], key: str = "finals") -> dict[str, dict[str, dict]]:
    """The runs' picked ``key`` records (finals or curves) in one ``{arm: {seed: record}}``; every
    (arm, seed) from one run only."""
    merged: dict[str, dict[str, dict]] = {}
    for report, picks in runs:
        for arm, by_seed in take(report, picks, key).items():
            for seed, rec in by_seed.items():
                if seed in merged.get(arm, {}):
                    raise SystemExit(f"arm {arm!r}, seed {seed} is in two runs: rename one (arm=new_name)")
                merged.setdefault(arm, {})[seed] = rec
    return merged


def curve_point(path: Path, seed: str, arm: str, given: str) -> dict:
    """A report holding, as ``arm``'s outcomes for ``seed``, the point of a run dir's ``curve.json``
    evaluated at ``given`` seconds of training (within 1%: a near miss is another point, not a rounding)."""
    try:
        seconds = float(given)
    except ValueError:
        raise SystemExit(f"--point {path} {seed} {arm}: SECONDS must be a number, got {given!r}") from None
    points = json.loads(path.read_text()).values()
    near = [p for p in points if abs(p["train_seconds"] - seconds) <= 0.01 * seconds and "per_episode_success" in p]
    if not near:
        have = sorted(round(p["train_seconds"]) for p in points)
        raise SystemExit(f"{path} has no point with per-game outcomes at {seconds:g} s (its points: {have} s)")
    point = min(near, key=lambda p: abs(p["train_seconds"] - seconds))
    return {"env_id": "", "finals": {arm: {seed: point}}}


def stage_outcomes(path: Path, seed: str, arm: str, stage: str) -> dict:
    """A report holding, as ``arm``'s outcomes for ``seed``, the evaluation a run dir's ``stages.json``
    recorded for ``stage`` (e.g. ``eval_sft``)."""
    stages = json.loads(path.read_text())
    evaluated = sorted(k for k, v in stages.items() if isinstance(v, dict) and "per_episode_success" in v)
    if stage not in evaluated:
        raise SystemExit(f"{path} has no evaluated stage {stage!r} (it has {evaluated})")
    return {"env_id": "", "finals": {arm: {seed: stages[stage]}}}


def same_games(finals: dict[str, dict[str, dict]]) -> dict[str, dict[str, dict]]:
    """``finals``, once every (arm, seed) is known to have played the same number of held-out games."""
    games = {len(rec["per_episode_success"]) for by_seed in finals.values() for rec in by_seed.values()}
    if len(games) > 1:
        raise SystemExit(f"the runs played different numbers of held-out games: {sorted(games)}")
    return finals


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", nargs="+", action="append", required=True, metavar=("PROTOCOL_JSON", "ARM"),
                    help="a protocol.json, then the arms to take from it (arm or arm=new_name; default all)")
    ap.add_argument("--point", nargs=4, action="append", default=[], metavar=("CURVE_JSON", "SEED", "ARM", "SECONDS"),
                    help="an arm's outcomes for a seed from a run dir's curve.json, evaluated at SECONDS of training")
    ap.add_argument("--stage", nargs=4, action="append", default=[], metavar=("STAGES_JSON", "SEED", "ARM", "STAGE"),
                    help="an arm's outcomes for a seed from a run dir's stages.json (e.g. its eval_sft stage)")
    ap.add_argument("--baseline", action="append", default=[], help="arms the others are paired with (repeatable)")
    ap.add_argument("--out", type=Path, required=True, help="writes OUT.json, OUT.md and (with curves) OUT.png")
    args = ap.parse_args(argv)
    runs = [(json.loads(Path(r[0]).read_text()), r[1:]) for r in args.run]
    runs += [(curve_point(Path(path), seed, arm, seconds), []) for path, seed, arm, seconds in args.point]
    runs += [(stage_outcomes(Path(path), seed, arm, stage), []) for path, seed, arm, stage in args.stage]
    finals, curves = same_games(merge(runs)), merge(runs, "curves")
    baselines = tuple(args.baseline) or ("sft",)
    table = compare_arms(finals, baselines)
    sources = "; ".join([f"{r[0]} ({', '.join(r[1:]) or 'all arms'})" for r in args.run]
                        + [f"{path} (seed {seed} {arm} at {seconds} s)" for path, seed, arm, seconds in args.point]
                        + [f"{path} (seed {seed} {arm}: its {stage})" for path, seed, arm, stage in args.stage])
    note = (f"{runs[0][0]['env_id']}, merged from {sources}. Paired differences: bootstrap 95% CI over games, "
            f"exact McNemar p; means: seed-level t-interval and a cluster bootstrap over games.")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"sources": args.run, "points": args.point, "stages": args.stage,
                                                         "baselines": baselines,
                                                         "table": table, "finals": finals, "curves": curves},
                                                        indent=1))
    if curves:
        plot_curves(curves, args.out.with_suffix(".png"), title=f"{runs[0][0]['env_id']}: held-out greedy success")
    report = markdown_report(table, title="Arms merged from several protocol runs", note=note, baselines=baselines)
    args.out.with_suffix(".md").write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
