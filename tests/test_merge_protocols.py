"""scripts/merge_protocols.py: arms taken from two protocol runs are paired game by game, and an
outcome two runs both hold is refused rather than replaced."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("merge_protocols", Path(__file__).parents[1] / "scripts" / "merge_protocols.py")
merge_mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(merge_mod)


def _final(outcomes: list[float]) -> dict:
    n = len(outcomes)
    return {"success": sum(outcomes) / n, "success_ci95": [0.0, 1.0], "episodes": n, "per_episode_success": outcomes,
            "games": n, "groups": ["g"] * n, "temp_success": None, "temp_ci95": None}


def _report(finals: dict) -> dict:
    return {"env_id": "toy", "finals": {arm: {str(s): _final(o) for s, o in by_seed.items()} for arm, by_seed in finals.items()}}


def test_merged_arms_are_paired_game_by_game(tmp_path):
    old = tmp_path / "old.json"  # the baseline wins games 0-1 in seed 0, games 0-2 in seed 1
    old.write_text(json.dumps(_report({"base": {0: [1, 1, 0, 0], 1: [1, 1, 1, 0]}, "other": {0: [0, 0, 0, 0]}})))
    new = tmp_path / "new.json"  # the new arm wins games 0-3 in seed 0 and games 0-2 in seed 1
    new.write_text(json.dumps(_report({"arm": {0: [1, 1, 1, 1], 1: [1, 1, 1, 0]}, "base": {0: [0, 0, 0, 0]}})))
    out = tmp_path / "merged"
    assert merge_mod.main(["--baseline", "base", "--run", str(old), "base", "--run", str(new), "arm=new_arm",
                           "--out", str(out)]) == 0
    table = json.loads(out.with_suffix(".json").read_text())["table"]
    assert set(table) == {"base", "new_arm"}  # only the picked arms, renamed
    seed0, seed1 = (table["new_arm"]["per_seed"][s]["vs_base"]["greedy"] for s in ("0", "1"))
    assert (seed0["diff"], seed0["n01"], seed0["n10"]) == (0.5, 2, 0)  # +2 of 4 games, both won by the new arm
    assert (seed1["diff"], seed1["n01"], seed1["n10"]) == (0.0, 0, 0)
    assert table["new_arm"]["mean"]["vs_base"] == 0.25
    assert "new_arm" in out.with_suffix(".md").read_text()


def test_an_outcome_in_two_runs_is_refused(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_report({"sft": {0: [1, 0]}})))
    b.write_text(json.dumps(_report({"sft": {0: [0, 0]}})))
    with pytest.raises(SystemExit, match="in two runs"):
        merge_mod.main(["--run", str(a), "--run", str(b), "--out", str(tmp_path / "m")])
    assert merge_mod.main(["--run", str(a), "--run", str(b), "sft=sft_rerun", "--out", str(tmp_path / "m")]) == 0
    with pytest.raises(SystemExit, match="not in this run"):
        merge_mod.main(["--run", str(a), "archer", "--out", str(tmp_path / "m")])


def test_curves_of_both_runs_are_kept_and_drawn(tmp_path):
    """Seeds run in two protocol runs (one per machine) pool into one table and one figure."""
    point = lambda steps, success: {"iteration": steps, "env_steps": steps, "train_seconds": steps, "success": success}
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({**_report({"arm": {0: [1, 0]}}), "curves": {"arm": {"0": [point(0, 0.0), point(5, 0.5)]}}}))
    b.write_text(json.dumps({**_report({"arm": {1: [1, 1]}}), "curves": {"arm": {"1": [point(0, 0.5), point(5, 1.0)]}}}))
    out = tmp_path / "merged"
    assert merge_mod.main(["--baseline", "arm", "--run", str(a), "--run", str(b), "--out", str(out)]) == 0
    merged = json.loads(out.with_suffix(".json").read_text())
    assert sorted(merged["curves"]["arm"]) == ["0", "1"]
    assert merged["table"]["arm"]["mean"]["success"] == 0.75  # seed 0 won 1 of 2, seed 1 won 2 of 2
    assert out.with_suffix(".png").stat().st_size > 0


def test_a_curve_point_is_an_arm(tmp_path):
    """An SFT-continued arm evaluated part way (its run dir's curve.json) pairs with an RL arm."""
    curve = tmp_path / "curve.json"
    curve.write_text(json.dumps({"10": {**_final([0, 0, 0, 0]), "train_seconds": 100.0},
                                 "40": {**_final([1, 1, 0, 0]), "train_seconds": 3972.4},
                                 "90": {**_final([1, 1, 1, 1]), "train_seconds": 9000.0}}))
    run = tmp_path / "run.json"
    run.write_text(json.dumps(_report({"rl": {1: [1, 0, 1, 0]}})))
    out = tmp_path / "merged"
    assert merge_mod.main(["--baseline", "cont", "--point", str(curve), "1", "cont", "3972",
                           "--run", str(run), "--out", str(out)]) == 0
    merged = json.loads(out.with_suffix(".json").read_text())
    assert merged["finals"]["cont"]["1"]["per_episode_success"] == [1, 1, 0, 0]  # the 3972 s point
    row = merged["table"]["rl"]["per_seed"]["1"]["vs_cont"]["greedy"]
    assert (row["diff"], row["n01"], row["n10"]) == (0.0, 1, 1)  # game 2 won only by rl, game 1 only by cont
    with pytest.raises(SystemExit, match=r"no point .* at 5000 s \(its points: \[100, 3972, 9000\] s\)"):
        merge_mod.main(["--point", str(curve), "1", "cont", "5000", "--run", str(run), "--out", str(out)])
    with pytest.raises(SystemExit, match="SECONDS must be a number, got '1h'"):
        merge_mod.main(["--point", str(curve), "1", "cont", "1h", "--run", str(run), "--out", str(out)])


def test_a_finished_stage_of_an_unfinished_run_is_an_arm(tmp_path):
    """A run stopped before its protocol.json still pairs through its SFT stage's evaluation."""
    stages = tmp_path / "stages.json"
    stages.write_text(json.dumps({"sft": {"sft/loss": 0.3}, "eval_sft": _final([1, 0, 0, 0])}))
    run = tmp_path / "run.json"
    run.write_text(json.dumps(_report({"rl": {0: [1, 1, 1, 0]}})))
    out = tmp_path / "merged"
    assert merge_mod.main(["--baseline", "sft", "--stage", str(stages), "0", "sft", "eval_sft",
                           "--run", str(run), "--out", str(out)]) == 0
    row = json.loads(out.with_suffix(".json").read_text())["table"]["rl"]["per_seed"]["0"]["vs_sft"]["greedy"]
    assert (row["diff"], row["n01"], row["n10"]) == (0.5, 2, 0)  # games 1 and 2 won only by rl
    with pytest.raises(SystemExit, match=r"no evaluated stage 'eval_rl' \(it has \['eval_sft'\]\)"):
        merge_mod.main(["--stage", str(stages), "0", "sft", "eval_rl", "--run", str(run), "--out", str(out)])
