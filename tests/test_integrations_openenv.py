"""``turngym openenv``: a real server on a free local port, played by OpenEnv's own clients.

The server is ``python -m turngym.cli openenv turngym/Maze-v0`` in a subprocess; the clients are
OpenEnv's ``EnvClient`` (through ``TurngymClient``, which only converts types) and its untyped
``GenericEnvClient``, both speaking OpenEnv's WebSocket session protocol.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("openenv", reason='needs openenv-core: pip install "turngym[openenv]"')

import httpx  # noqa: E402

from turngym.envs.games.maze import DIRS, make_task, open_dirs, shortest_path  # noqa: E402
from turngym.integrations.openenv import TurngymAction, TurngymClient, create_server, environment_class  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TASK = "small-test-0003"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The server's URL and the file its stderr goes to."""
    port = free_port()
    log = tmp_path_factory.mktemp("openenv") / "stderr.txt"
    proc = subprocess.Popen(
        [sys.executable, "-m", "turngym.cli", "openenv", "turngym/Maze-v0", "--split", "test", "--port", str(port)],
        cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL, stderr=log.open("w"),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120  # a hang guard for the subprocess, not a timing assertion
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the server did not start: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield url, log
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server(served):
    return served[0]


def test_a_client_that_closes_its_session_leaves_no_traceback_in_the_servers_log(served):
    url, log = served
    for _ in range(2):
        with TurngymClient(base_url=url).sync() as env:
            assert env.reset(task_id=TASK).observation.task_id == TASK
            env.step(move("north"))
    time.sleep(1.0)  # the server handles the close after the client has gone
    text = log.read_text()
    assert "Traceback" not in text and "WebSocketDisconnect" not in text and "ERROR" not in text, text[-3000:]
    assert text.startswith("turngym openenv: turngym/Maze-v0 on http://127.0.0.1:")


def move(direction) -> TurngymAction:
    return TurngymAction(tool_name="move", arguments={"direction": direction})


def test_openenv_client_plays_a_maze_to_the_goal(server):
    grid, start, goal = make_task(TASK)
    wall = next(d for d in DIRS if d not in open_dirs(grid, start))
    with TurngymClient(base_url=server).sync() as env:
        first = env.reset(task_id=TASK, seed=0)
        obs = first.observation
        assert not first.done and obs.task_id == TASK and obs.turn == 0 and "You are in a maze" in obs.text
        assert [t.name for t in obs.tools] == ["move"] and obs.tools[0].input_schema["required"] == ["direction"]

        bumped = env.step(move(wall))
        assert bumped.reward == 0.0 and not bumped.done and f"wall to the {wall}" in bumped.observation.text

        invalid = env.step(move("sideways"))  # an invalid action: the env's own error observation
        assert invalid.observation.action_valid is False and invalid.observation.error is None
        assert "unknown direction 'sideways'" in invalid.observation.text and not invalid.done
        assert invalid.observation.messages[0]["role"] == "tool" and invalid.observation.turn == 2

        for d in shortest_path(grid, start, goal):
            last = env.step(move(d))
        assert last.done and last.reward == 1.0 and "reached the goal" in last.observation.text
        assert last.observation.outcome == 1.0 and last.observation.episode_return == 1.0
        state = env.state()
        assert state.step_count == len(shortest_path(grid, start, goal)) + 2 and state.done and state.task_id == TASK

        over = env.step(move("north"))
        assert over.done and over.reward == 0.0 and over.observation.error and "episode is over" in over.observation.text
        assert env.state().step_count == state.step_count  # no step was taken


def test_malformed_calls_are_error_observations_and_the_session_survives(server):
    with TurngymClient(base_url=server).sync() as env:
        env.reset(task_id=TASK)
        bad = [TurngymAction(tool_name="move", arguments="north"), TurngymAction(tool_name="move", arguments=["north"]),
               TurngymAction(tool_name="move", arguments={"dir": "north"}), TurngymAction(tool_name="fly"),
               TurngymAction(tool_name=7, arguments={"direction": "north"}), TurngymAction()]
        for i, action in enumerate(bad, start=1):
            out = env.step(action)
            assert not out.done and out.observation.action_valid is False and out.observation.turn == i
            assert out.observation.text.startswith("Error:"), out.observation.text
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):  # not a call at all: OpenEnv's own error
            env._send_and_receive({"type": "step", "data": {"tool": "move", "args": {}}})
        assert env.step(move("east")).observation.turn == len(bad) + 1  # same session, same episode


def test_openenv_generic_client_and_concurrent_sessions(server):
    from openenv.core.generic_client import GenericEnvClient

    with GenericEnvClient(base_url=server).sync() as a, GenericEnvClient(base_url=server).sync() as b:
        a.reset(task_id=TASK)
        b.reset(task_id="small-test-0001")
        a.step({"tool_name": "move", "arguments": {"direction": "north"}})
        out = a.step({"tool_name": "move", "arguments": {"direction": "north"}})
        assert out.observation["turn"] == 2 and out.observation["task_id"] == TASK
        assert b.state()["step_count"] == 0 and b.state()["task_id"] == "small-test-0001"


def test_http_routes_and_the_environment_in_process():
    from fastapi.testclient import TestClient

    http = TestClient(create_server("turngym/Maze-v0", split="test"))
    assert http.get("/health").json()["status"] == "healthy"
    schema = http.get("/schema").json()
    assert {"tool_name", "arguments"} <= set(schema["action"]["properties"]) and "text" in schema["observation"]["properties"]
    assert http.get("/metadata").json()["name"] == "turngym/Maze-v0"
    assert "maze" in http.post("/reset", json={"task_id": TASK}).json()["observation"]["text"]

    env = environment_class("turngym/Maze-v0", split="test", max_turns=1)()
    env.reset(task_id=TASK)
    out = env.step(move("north"))
    assert out.done and out.truncated and env.step(move("north")).error  # the turn limit is the env's
    with pytest.raises(ValueError, match="tool_format"):
        environment_class("turngym/Maze-v0", tool_format="text")
