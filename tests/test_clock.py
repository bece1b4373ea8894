"""Where a run's time goes (``turngym.clock``): seconds charged by hand-made ticks, and the progress
of ``turngym train``: a bar in a terminal, lines in a log, for every long stage, an ETA from turns
that holds from the first ended episode on; ``--quiet`` silences them."""

from __future__ import annotations

import re
import threading
import time

import pytest
from fixtures_model import build_tiny_model

from turngym.clock import Clock, Progress, bar, bars_on, breakdown_table, clock_text, quiet
from turngym.train import EvalConfig, TrainConfig, run
from turngym.trainers.branch_bc import BranchBCConfig
from turngym.trainers.sft import SFTConfig


class Ticks:
    """A timer that reads whatever the test set: seconds move only when the test says."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_clock_charges_each_second_to_the_innermost_stage_and_kind():
    t = Ticks()
    clock = Clock(timer=t)
    t.now = 1.0  # 1 s outside any stage, no kind
    with clock.stage("eval"):
        t.now = 3.0  # 2 s in eval, other
        with clock.kind("generation"):
            t.now = 7.0  # 4 s generating
            with clock.kind("env_step"):  # an inner kind pauses the outer one
                t.now = 8.5  # 1.5 s stepping
            t.now = 9.0  # 0.5 s generating again
        with clock.stage("inner"):
            with clock.kind("update"):
                t.now = 12.0  # 3 s in eval/inner, update
    t.now = 13.0
    b = clock.breakdown()
    assert b["total_s"] == 13.0
    assert b["by_stage"] == {"": {"other": 2.0}, "eval": {"other": 2.0, "generation": 4.5, "env_step": 1.5},
                             "eval/inner": {"update": 3.0, "other": 0.0}}
    assert b["by_kind"] == {"other": 4.0, "generation": 4.5, "env_step": 1.5, "update": 3.0}
    assert sum(b["by_kind"].values()) == b["total_s"]  # the kinds add up to the wall time
    table = breakdown_table(b).splitlines()
    assert table[0].split() == ["stage", "total", "generation", "env_step", "update", "other"]
    assert table[1].split()[0] == "(outside" and table[2].split() == ["eval", "8.0", "4.5", "1.5", "0.0", "2.0"]
    assert table[3].split() == ["eval/inner", "3.0", "0.0", "0.0", "3.0", "0.0"]
    assert table[-1].split() == ["total", "13.0", "4.5", "1.5", "3.0", "4.0"]


def test_clock_ignores_other_threads_and_decorated_calls_count():
    t = Ticks()
    clock = Clock(timer=t)

    @clock.timed("update")
    def step():
        t.now += 2.0

    step()

    def background():
        with clock.kind("generation"):  # overlaps the main thread's time: not counted
            t.now += 5.0

    worker = threading.Thread(target=background)
    worker.start()
    worker.join()
    assert clock.breakdown()["by_kind"] == {"other": 5.0, "update": 2.0}


def test_bars_follow_quiet_and_the_environment(monkeypatch):
    monkeypatch.setenv("TURNGYM_PROGRESS", "always")
    assert bars_on()
    with quiet():
        assert not bars_on()
        with quiet(False):  # an inner call cannot turn bars back on
            assert not bars_on()
    monkeypatch.setenv("TURNGYM_PROGRESS", "never")
    assert not bars_on()


def test_clock_text():
    assert [clock_text(s) for s in (0, 59.4, 75, 3725)] == ["0:00", "0:59", "1:15", "1:02:05"]


def test_off_a_terminal_a_stage_writes_a_line_every_few_seconds_and_one_at_its_end(monkeypatch, capsys):
    monkeypatch.delenv("TURNGYM_PROGRESS", raising=False)  # stderr is captured here: not a terminal
    monkeypatch.setenv("TURNGYM_PROGRESS_EVERY", "0.5")
    shown = bar(10, "eval sft", "ep")
    shown.add_turns(4, [1, 1, 1, 1])
    time.sleep(1.6)  # the caller busy in one long call: the ticker writes anyway
    shown.update(1, turns=2)
    shown.close()
    lines = capsys.readouterr().err.splitlines()
    ticks = [ln for ln in lines if ln.startswith("turngym: eval sft: 0/10 ep, 4 turns, ") and "ETA ?" in ln]
    assert len(ticks) >= 2, lines
    assert re.fullmatch(r"turngym: eval sft: 1/10 ep, 4 turns, [0-9.]+ turns/s, done in 0:0[12]", lines[-1]), lines
    with quiet():
        bar(10, "eval final", "ep").close()
    assert capsys.readouterr().err == ""


def simulated_rollout(lengths: list[int], num_envs: int, cap: int | None) -> list[tuple[float, float | None]]:
    """A sync rollout's shape, one second per turn of the batch (every episode in play steps at
    once, a free slot takes the next episode): per second, the true time left and the ETA shown."""
    ticks = Ticks()
    shown = Progress(len(lengths), "eval", "ep", cap=cap, clock=ticks, ticker=False)
    queue, live, etas = list(lengths), [], []
    while queue or live:
        while queue and len(live) < num_envs:
            live.append([queue.pop(0), 0])  # [length, turns played]
        ticks.now += 1.0
        stepped = len(live)
        for ep in live:
            ep[1] += 1
        for ep in [ep for ep in live if ep[1] == ep[0]]:
            shown.update(1, turns=ep[0])
            live.remove(ep)
        shown.add_turns(stepped, [played for _, played in live])
        etas.append(shown.eta_s())
    return [(ticks.now - (i + 1), eta) for i, eta in enumerate(etas)]


@pytest.mark.parametrize("lengths, cap", [
    ([3 if i % 3 == 0 else 12 for i in range(128)], 12),  # a third win in 3 turns; the rest play to the limit
    ([2 + (7 * i) % 9 for i in range(128)], 30),  # 2 to 10 turns, far below the limit
    ([2 + (7 * i) % 9 for i in range(128)], None),
])
def test_a_rollouts_eta_counts_turns_and_is_not_wild_once_an_episode_has_ended(lengths, cap):
    points = simulated_rollout(lengths, 32, cap)
    first_end = next(i for i, (_, eta) in enumerate(points) if eta is not None)
    assert first_end + 1 == min(lengths)  # nothing to go by before the first episode ends: "?"
    slack = 0.1 * len(points)  # near the end a few seconds either way are no error
    for left, eta in points[first_end:]:
        assert 0.5 * left - slack <= eta <= 2.0 * left + slack, (left, eta)


def _tiny_run(tmp_path, tiny_tokenizer, name):
    model_dir = tmp_path / "tiny"
    if not model_dir.exists():
        build_tiny_model(tiny_tokenizer).save_pretrained(model_dir)
        tiny_tokenizer.save_pretrained(model_dir)
    return TrainConfig(
        model=f"hf:{model_dir}", algo="branch_bc", env_id="tests/Guess-v0", env_kwargs={"tool_format": "text"},
        train_split="", output_dir=str(tmp_path / name),
        sft=SFTConfig(episodes=2, epochs=1, batch_size=2, autocast="none"),
        branch=BranchBCConfig(iterations=1, episodes_per_iter=3, num_envs=3, max_new_tokens=6, branch_points=1,
                              branch_width=2, branch_depth=1, expert_replay=2, minibatch_size=2, autocast="none"),
        eval=EvalConfig(episodes=2, split="", max_new_tokens=6, num_envs=2, allow_train_overlap=True),  # one split
    )


BARS = ("sft", "eval sft", "screen", "search 1/1", "fit", "eval final", "branch_bc")


def test_train_shows_a_bar_for_every_long_stage_and_quiet_silences_them(tmp_path, tiny_tokenizer, capsys, monkeypatch):
    monkeypatch.setenv("TURNGYM_PROGRESS", "always")  # as on a terminal
    summary = run(_tiny_run(tmp_path, tiny_tokenizer, "loud"), progress=True)
    err = capsys.readouterr().err
    missing = [name for name in BARS if f"{name}:" not in err]
    assert not missing, f"no progress bar for {missing}"
    stages = summary["time_breakdown"]["by_stage"]
    for stage in ("load", "sft", "eval_sft", "branch_bc/screen", "branch_bc/search", "branch_bc/fit", "eval_final"):
        assert stage in stages, stage
    kinds = summary["time_breakdown"]["by_kind"]
    assert {"generation", "env_step", "env_startup", "update", "other"} <= set(kinds)
    assert sum(kinds.values()) == pytest.approx(summary["time_breakdown"]["total_s"], rel=1e-6)

    monkeypatch.delenv("TURNGYM_PROGRESS")  # turngym train > log 2>&1: a line for every stage
    run(_tiny_run(tmp_path, tiny_tokenizer, "log"), progress=True)
    err = capsys.readouterr().err
    missing = [name for name in BARS if f"turngym: {name}: " not in err]
    assert not missing, f"no progress line for {missing}"
    assert "\r" not in err  # no bar redrawn in a log

    run(_tiny_run(tmp_path, tiny_tokenizer, "quiet"), progress=False)  # turngym train --quiet
    err = capsys.readouterr().err
    assert not [name for name in BARS if f"{name}:" in err], err[-2000:]
