"""``turngym bench``: suites, the resumable runner, the report files, compare, skipped entries."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from turngym.bench.compare import compare_files, compare_results
from turngym.bench.metrics import bootstrap_diff
from turngym.bench.report import load_results
from turngym.bench.runner import LOG_NAME, BenchConfig, BenchError, EpisodeLog, run_bench, spread
from turngym.bench.suites import SuiteEntry, get_suite, list_suites, register_suite
from turngym.cli import main as turngym_main

TOY = "tests/Guess-v0"
register_suite("test-toy", [(TOY, "", 8)])
register_suite("test-toy2", [(TOY, "", 4), (TOY, "", 4, {"n_tasks": 8})])


def _cfg(tmp_path, **kw) -> BenchConfig:
    base = dict(suite="test-toy", agent="oracle", out=str(tmp_path / "run"), workers=2, progress=False)
    return BenchConfig(**{**base, **kw})


def _log_keys(tmp_path) -> list[tuple[str, int]]:
    lines = (tmp_path / "run" / LOG_NAME).read_text().splitlines()
    return [(json.loads(x)["env"], json.loads(x)["index"]) for x in lines]


class _Killed(Exception):
    pass


def test_suite_registry():
    names = list_suites()
    for name in ("textworld", "alfworld", "sql", "search", "swe", "lmrl", "all"):
        assert name in names
    lmrl = [e.env_id for e in get_suite("lmrl")]
    assert "turngym/Maze-partial-v0" in lmrl and not any(i.endswith("-llm-v0") for i in lmrl)
    lmrl_gym_tasks = ("Maze", "TextNav", "Wordle", "Chess", "Endgames", "TwentyQuestions", "GuessMyCity", "CarDealer")
    assert all(f"turngym/{task}-v0" in lmrl for task in lmrl_gym_tasks)  # all 8 LMRL-Gym tasks
    assert [e.key for e in get_suite("all")] == [e.key for n in ("textworld", "alfworld", "sql", "search", "swe", "lmrl")
                                                 for e in get_suite(n)]
    assert {e.episodes for e in get_suite("sql", episodes=3)} == {3}
    toy2 = get_suite("test-toy2")
    assert toy2[1] == SuiteEntry(TOY, "", 4, (("n_tasks", 8),)) and toy2[1].key == f"{TOY}[n_tasks=8]"
    assert toy2[1].make_kwargs() == {"n_tasks": 8}
    with pytest.raises(KeyError, match="unknown suite"):
        get_suite("nope")
    with pytest.raises(ValueError, match="more than once"):
        register_suite("bad", [(TOY, "", 2), (TOY, "", 3)])


def test_spread_covers_the_split_evenly():
    assert spread(list("abcdef"), 3) == ["a", "c", "e"]
    assert spread(list("abc"), 5) == ["a", "b", "c"]


def test_bootstrap_diff_by_hand():
    # b - a per pair is 1, 0, 1, 0: mean 0.5; every resample of {0, 1} pairs lies in [0, 1].
    d = bootstrap_diff([0, 1, 0, 1], [1, 1, 1, 1], paired=True, n_boot=2000)
    assert d["diff"] == 0.5 and 0.0 <= d["ci"][0] <= 0.5 <= d["ci"][1] <= 1.0
    same = bootstrap_diff([0, 1, 1], [0, 1, 1], paired=True)
    assert same["diff"] == 0.0 and same["ci"] == [0.0, 0.0] and not same["significant"] and same["p"] == 1.0
    apart = bootstrap_diff([0.0] * 5, [1.0] * 7, paired=False)
    # no resample reaches 0, which bounds p by the resolution of 10,000 resamples; it does not make it 0
    assert apart["ci"] == [1.0, 1.0] and apart["significant"] and apart["p"] == 2 / 10_001
    json.dumps(apart)  # summary.json holds it
    with pytest.raises(ValueError):
        bootstrap_diff([0, 1], [1], paired=True)


def test_oracle_toy_suite_writes_json_md_png(tmp_path):
    res = run_bench(_cfg(tmp_path))  # envs in subprocess workers (the default)
    env = res["envs"][TOY]
    assert env["episodes"] == 8 and env["success"] == 1.0 and env["success_boot_ci95"] == [1.0, 1.0]
    assert env["mean_turns"] == 1.0 and env["invalid_action_rate"] == 0.0 and env["truncated"] == 0
    assert set(env["by_task_type"]) == {"default"} and env["wall_s"] > 0
    assert res["suites"]["test-toy"]["success"] == 1.0
    out = tmp_path / "run"
    assert load_results(out / "results.json")["envs"][TOY]["success"] == 1.0
    md = (out / "results.md").read_text()
    assert f"| {TOY} | 8 | 100.0 [100.0, 100.0] |" in md
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(i for _, i in _log_keys(tmp_path)) == list(range(8))


def test_resume_after_kill_runs_only_the_missing_episodes(tmp_path):
    def kill_after_first(entry, records):
        raise _Killed

    with pytest.raises(_Killed):
        run_bench(_cfg(tmp_path, chunk=3), on_chunk=kill_after_first)
    assert _log_keys(tmp_path) == [(TOY, 0), (TOY, 1), (TOY, 2)]

    played = []
    res = run_bench(_cfg(tmp_path, chunk=3), on_chunk=lambda e, recs: played.extend(r["index"] for r in recs))
    assert played == [3, 4, 5, 6, 7]
    keys = _log_keys(tmp_path)
    assert sorted(keys) == [(TOY, i) for i in range(8)] and len(keys) == 8
    assert res["envs"][TOY]["episodes"] == 8 and res["envs"][TOY]["success"] == 1.0

    played.clear()
    run_bench(_cfg(tmp_path, chunk=3), on_chunk=lambda e, recs: played.extend(recs))
    assert played == [] and len(_log_keys(tmp_path)) == 8  # a finished run plays nothing again


def test_truncated_last_line_is_dropped_and_rerun(tmp_path):
    run_bench(_cfg(tmp_path, in_process=True))
    log = tmp_path / "run" / LOG_NAME
    data = log.read_bytes()
    last_start = data.rstrip(b"\n").rfind(b"\n") + 1
    log.write_bytes(data[: last_start + (len(data) - last_start) // 2])  # killed mid-write of #7
    assert len(EpisodeLog(log).load()) == 7 and log.read_bytes().endswith(b"\n")

    played = []
    res = run_bench(_cfg(tmp_path, in_process=True), on_chunk=lambda e, recs: played.extend(r["index"] for r in recs))
    assert played == [7]
    assert sorted(_log_keys(tmp_path)) == [(TOY, i) for i in range(8)]
    assert res["envs"][TOY]["episodes"] == 8


def test_resume_refuses_other_settings(tmp_path):
    run_bench(_cfg(tmp_path, in_process=True, episodes=2))
    with pytest.raises(BenchError, match="agent"):
        run_bench(_cfg(tmp_path, in_process=True, episodes=2, agent="random"))


def test_compare_oracle_vs_random_and_identical(tmp_path, capsys):
    a = run_bench(_cfg(tmp_path / "a", episodes=24, in_process=True))
    b = run_bench(_cfg(tmp_path / "b", episodes=24, in_process=True, agent="random"))
    assert b["envs"][TOY]["success"] < 1.0
    (row,) = compare_results(a, b)
    assert row["paired"] and row["significant"] and row["diff"] < 0 and row["ci"][1] < 0
    (same,) = compare_results(a, a)
    assert same["diff"] == 0.0 and not same["significant"]

    pa, pb = tmp_path / "a" / "run" / "results.json", tmp_path / "b" / "run" / "results.json"
    assert turngym_main(["bench", "--compare", str(pa), str(pb)]) == 0
    out = capsys.readouterr().out
    assert "paired bootstrap" in out and "b worse" in out
    assert "no significant difference" in compare_files(pa, pa)


def test_compare_unpaired_when_specs_differ(tmp_path):
    a = run_bench(_cfg(tmp_path / "a", episodes=6, in_process=True))
    b = run_bench(_cfg(tmp_path / "b", episodes=6, in_process=True, seed=100))
    (row,) = compare_results(a, b)
    assert not row["paired"] and row["diff"] == 0.0 and not row["significant"]


def test_missing_data_entry_is_skipped_with_a_message(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TURNGYM_DATA", str(tmp_path / "empty"))
    monkeypatch.setenv("TURNGYM_CACHE", str(tmp_path / "cache"))
    register_suite("test-missing", [("turngym/SQL-spider-v1", "test", 2), (TOY, "", 2)])
    res = run_bench(_cfg(tmp_path, suite="test-missing", in_process=True))
    why = res["skipped"]["turngym/SQL-spider-v1"]
    assert "DataNotFound" in why and "turngym data download spider" in why
    assert "[bench] skipping turngym/SQL-spider-v1" in capsys.readouterr().out
    assert list(res["envs"]) == [TOY] and res["envs"][TOY]["success"] == 1.0
    assert "Skipped:" in (tmp_path / "run" / "results.md").read_text()


def test_a_bench_that_can_play_nothing_fails_and_says_why(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TURNGYM_DATA", str(tmp_path / "empty"))
    monkeypatch.setenv("TURNGYM_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    assert turngym_main(["bench", "--env", "turngym/SQL-spider-v1", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: nothing to play: every entry of suite 'turngym/SQL-spider-v1' was skipped")
    assert "turngym data download spider" in err and not out.exists()


def test_process_pool_over_entries(tmp_path):
    res = run_bench(_cfg(tmp_path, suite="test-toy2", jobs=2, chunk=2))
    assert [res["envs"][k]["episodes"] for k in res["envs"]] == [4, 4]
    assert all(s["success"] == 1.0 for s in res["envs"].values())
    assert sorted(_log_keys(tmp_path)) == sorted([(TOY, i) for i in range(4)] + [(f"{TOY}[n_tasks=8]", i) for i in range(4)])


def test_cli_real_lmrl_suite(tmp_path, capsys):
    out = tmp_path / "lmrl"
    rc = turngym_main(["bench", "--suite", "lmrl", "--agent", "oracle", "--episodes", "2", "--workers", "2",
                       "--out", str(out), "--quiet"])
    assert rc == 0
    res = load_results(out / "results.json")
    assert set(res["envs"]) | set(res["skipped"]) == {e.key for e in get_suite("lmrl")}
    may_skip = {"turngym/Wordle-v0[words=lmrl]"}  # the only one that needs data
    if shutil.which("stockfish") is None and not Path("/usr/games/stockfish").is_file():
        may_skip |= {"turngym/Chess-v0", "turngym/Endgames-v0"}  # they need the chess engine
    assert set(res["skipped"]) <= may_skip
    assert all(s["episodes"] == 2 and s["success"] == 1.0 for s in res["envs"].values())
    assert "| turngym/Maze-v0 | 2 | 100.0" in capsys.readouterr().out


def test_retry_errors_replays_only_errored_episodes(tmp_path):
    run_bench(_cfg(tmp_path, in_process=True, episodes=4))
    log = tmp_path / "run" / LOG_NAME
    recs = [json.loads(x) for x in log.read_text().splitlines()]
    recs[2]["trajectory"]["metadata"]["error"] = "env worker did not answer 'reset' within 120s"  # as a crash logs it
    recs[2]["trajectory"]["outcome"], recs[2]["trajectory"]["turns"] = 0.0, []
    log.write_text("".join(json.dumps(r) + "\n" for r in recs))

    played = []
    res = run_bench(_cfg(tmp_path, in_process=True, episodes=4), on_chunk=lambda e, rs: played.extend(rs))
    assert played == [] and res["envs"][TOY]["errors"] == 1 and res["envs"][TOY]["success"] == 0.75

    res = run_bench(_cfg(tmp_path, in_process=True, episodes=4, retry_errors=True),
                    on_chunk=lambda e, rs: played.extend(r["index"] for r in rs))
    assert played == [2] and res["envs"][TOY]["errors"] == 0 and res["envs"][TOY]["success"] == 1.0
    assert res["envs"][TOY]["episodes"] == 4 and len(_log_keys(tmp_path)) == 5  # the later record wins


def _bench_proc(out, *extra):
    """``turngym bench`` on the real LMRL suite, as its own process (so it can be SIGKILLed)."""
    import os
    import subprocess
    import sys

    args = ["bench", "--suite", "lmrl", "--agent", "random", "--episodes", "6", "--workers", "2", "--chunk", "2",
            "--out", str(out), "--quiet", *extra]
    code = "import sys; from turngym.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.Popen([sys.executable, "-c", code, *args], env={**os.environ, "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _descendants(pid: int) -> set[int]:
    import psutil

    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def _episodes(out) -> dict:
    recs = [json.loads(x) for x in (out / LOG_NAME).read_text().splitlines()]
    return {(r["env"], r["index"]): [t["action_text"] for t in r["trajectory"]["turns"]] for r in recs}


def test_sigkilled_bench_leaves_no_worker_and_resumes_to_the_uninterrupted_episodes(tmp_path):
    import signal
    import time

    import psutil

    whole = _bench_proc(tmp_path / "whole")
    assert whole.wait(timeout=600) == 0, whole.stderr.read()[-2000:]
    proc = _bench_proc(tmp_path / "killed")
    log = tmp_path / "killed" / LOG_NAME
    deadline = time.monotonic() + 300
    workers: set[int] = set()
    while not (workers and log.exists() and log.read_text().count("\n") >= 3):  # mid-run, env workers up
        assert proc.poll() is None, "the run ended before the kill"
        if time.monotonic() > deadline:  # a hang guard, not a speed check
            raise TimeoutError("the run stalled before any chunk was logged")
        time.sleep(0.02)
        workers = _descendants(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    gone = time.monotonic() + 30  # a hang guard: the workers notice their parent's death within a second
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in workers):
        if time.monotonic() > gone:  # they poll their parent every 0.5 s; 30 s means they never will
            raise AssertionError(f"workers outlived the killed runner: {sorted(workers)}")
        time.sleep(0.1)
    resumed = _bench_proc(tmp_path / "killed")
    assert resumed.wait(timeout=600) == 0, resumed.stderr.read()[-2000:]
    assert _episodes(tmp_path / "killed") == _episodes(tmp_path / "whole")
