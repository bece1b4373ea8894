"""``turngym.envs.engine``: an engine in a child process, every call with a deadline.

The deadlines here are hang guards of a few seconds; the assertions are about what happened
(which error, which process), never about how fast.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from turngym.envs.engine import (
    EngineBacked,
    EngineCrashed,
    EngineError,
    EngineFault,
    EngineProcess,
    EngineTimeout,
    InlineEngine,
)

TESTS = Path(__file__).resolve().parent
TOY = "engine_toys:ToyEngine"


# "fresh": each engine child is a new interpreter; "forked": children fork from a server that
# imported the engine's module once (forkserver.py). Every test below holds for both.
PRELOAD = {"fresh": (), "forked": ("engine_toys",)}


@pytest.fixture(params=sorted(PRELOAD))
def engine(monkeypatch, request):
    monkeypatch.setenv("PYTHONPATH", str(TESTS))  # the child imports engine_toys from here
    e = EngineProcess(TOY, {"greeting": "hello"}, preload=PRELOAD[request.param])
    yield e
    e.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie is dead too
            return f.read().split(") ")[-1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # reaped between the signal and the read (either errno)
        return False


def _wait_dead(pid: int, within_s: float = 10.0) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_calls_reach_one_engine_that_keeps_its_state(engine):
    assert engine.call("echo", [1, "a\ud800"], deadline_s=60) == ["hello", [1, "a\ud800"], 1]  # JSON: lists
    assert engine.call("echo", None, deadline_s=60) == ["hello", None, 2]
    pid = engine.call("pid", deadline_s=60)
    assert pid == engine.pid != os.getpid() and engine.restarts == 0


def test_a_missed_deadline_kills_the_engine_and_the_next_call_restarts_it(engine):
    first = engine.call("pid", deadline_s=60)
    with pytest.raises(EngineTimeout, match="'sleep' within its 0.5s deadline"):
        engine.call("sleep", 30, deadline_s=0.5)
    assert _wait_dead(first)
    assert engine.call("echo", "again", deadline_s=60) == ["hello", "again", 1]  # a fresh engine
    assert engine.call("pid", deadline_s=60) != first and engine.restarts == 1


def test_an_engine_error_comes_back_as_data_and_the_engine_lives_on(engine):
    pid = engine.call("pid", deadline_s=60)
    with pytest.raises(EngineError, match="ValueError: the engine refuses"):
        engine.call("boom", deadline_s=60)
    with pytest.raises(EngineError, match="AttributeError"):
        engine.call("no_such_method", deadline_s=60)
    with pytest.raises(EngineError, match="not JSON serializable"):
        engine.call("raw", deadline_s=60)
    assert engine.call("pid", deadline_s=60) == pid
    with pytest.raises(ValueError, match="private"):
        engine.call("__init__", deadline_s=60)


def test_an_engine_that_cannot_be_built_is_an_error(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    e = EngineProcess("engine_toys:NoSuchEngine")
    with pytest.raises(EngineError, match="AttributeError"):
        e.call("echo", 1, deadline_s=60)
    assert e.pid is None


def test_a_dying_engine_is_reported_and_replaced(engine):
    pid = engine.call("pid", deadline_s=60)
    # a forked child's exit code is its server's to reap: only a fresh child's is known here
    with pytest.raises(EngineCrashed, match="exit code -1" if engine.preload else "exit code 3"):
        engine.call("die", deadline_s=60)
    assert engine.call("pid", deadline_s=60) != pid


def test_a_flooding_engine_writes_nothing_to_our_stdout(engine, capfd):
    engine.call("pid", deadline_s=60)
    with pytest.raises(EngineTimeout):
        engine.call("flood", deadline_s=1.0)
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_close_stops_the_child(engine):
    pid = engine.call("pid", deadline_s=60)
    engine.close()
    assert _wait_dead(pid)


@pytest.mark.parametrize("kind", sorted(PRELOAD))
def test_the_child_exits_when_its_parent_is_killed_mid_call(kind):
    # A parent that starts an engine, hangs it in a call, then is SIGKILLed: the orphan must go.
    code = (
        "import sys; from turngym.envs.engine import EngineProcess\n"
        f"e = EngineProcess({TOY!r}, preload={PRELOAD[kind]!r}); print(e.call('pid', deadline_s=60), flush=True)\n"
        "e.call('sleep', 3600, deadline_s=3600)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)])}
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    try:
        child = int(parent.stdout.readline())
        assert _alive(child)
        parent.kill()
        parent.wait()
        assert _wait_dead(child), "the engine outlived its parent"
    finally:
        parent.kill()


def test_inline_engine_has_the_same_interface(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    e = InlineEngine(TOY, {"greeting": "yo"})
    assert e.call("echo", 1) == ("yo", 1, 1) and e.call("pid") == os.getpid()
    e.close()


class ToyEnv(EngineBacked):
    """The mixin's side of a ``TextEnv``: a turn counter and an engine."""

    engine_target = TOY
    engine_setup_deadline_s = 3.0

    def __init__(self, deadline_s):
        self._turn = 0
        self._setup_engine({}, deadline_s)


def test_engine_backed_budget_truncation_and_reset_retry(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    env = ToyEnv(deadline_s=2.0)
    try:
        # The first load hangs past the setup deadline: the reset retries on a fresh engine,
        # which loads the game again, rather than resetting an engine with nothing loaded.
        game = f"{tmp_path / 'marker'}:hang-once"
        assert env._engine_reset(game) == game and env._engine.restarts == 1
        env._turn = 1
        assert env._engine_step("step", 0.0) == game and env._cut_reason is None
        env._turn = 2  # one step: its calls share one budget; either call alone would fit in it
        env._engine_step("step", 0.5)
        with pytest.raises(EngineTimeout):
            env._engine_step("step", 1.8)
        assert "deadline" in env._cut_reason
        with pytest.raises(EngineFault, match="episode is over"):
            env._engine_step("step", 0.0)
        assert env._engine_reset(game) == game and env._cut_reason is None and env._engine.restarts == 2
    finally:
        env._close_engine()


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().split(") ")[-1].split()[1])


def test_forked_engines_share_one_warm_server_and_fall_back_to_fresh_interpreters(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    a, b = (EngineProcess(TOY, preload=("engine_toys",)) for _ in range(2))
    try:
        pa, pb = a.call("pid", deadline_s=60), b.call("pid", deadline_s=60)
        assert pa != pb and _ppid(pa) == _ppid(pb) != os.getpid()  # both children of one server
        assert _ppid(_ppid(pa)) == os.getpid()  # which is ours
    finally:
        a.close()
        b.close()
    assert _wait_dead(pa) and _wait_dead(pb)
    broken = EngineProcess(TOY, preload=("no_such_module_here",))  # the server cannot start: a fresh child
    try:
        assert _ppid(broken.call("pid", deadline_s=60)) == os.getpid()
    finally:
        broken.close()
