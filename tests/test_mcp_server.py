"""``turngym mcp``: an env served over MCP, driven by the official SDK's own client.

The stdio test spawns ``python -m turngym.cli mcp ...`` and talks to it with ``mcp.client.stdio``,
as an MCP host would. The other tests connect the SDK's ``Client`` to the same server in-process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import pytest

mcp = pytest.importorskip("mcp", reason="needs the MCP SDK: pip install 'turngym[mcp]'")

from mcp import Client  # noqa: E402
from mcp.client.session import ClientSession  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402

import turngym  # noqa: E402
from turngym.envs.games.maze import DIRS, make_task, open_dirs, shortest_path  # noqa: E402
from turngym.envs.mcp_server import EnvSession, StepError, build_server  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _run(fn):
    return anyio.run(fn)


def test_stdio_server_plays_a_maze_to_the_goal_with_the_sdk_client():
    task = "small-test-0003"
    grid, start, goal = make_task(task)
    path = shortest_path(grid, start, goal)
    wall = next(d for d in DIRS if d not in open_dirs(grid, start))
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "turngym.cli", "mcp", "turngym/Maze-v0", "--split", "test"],
        cwd=str(ROOT), env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )

    async def main():
        with anyio.fail_after(120):  # a hang guard for the subprocess, not a timing assertion
            await play()

    async def play():
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert sorted(tools) == ["move", "reset"]
            assert tools["move"].input_schema["properties"]["direction"]["type"] == "string"
            assert tools["move"].output_schema["required"][:3] == ["observation", "reward", "terminated"]

            early = await s.call_tool("move", {"direction": "north"})
            assert early.is_error and "call reset first" in early.content[0].text

            r = await s.call_tool("reset", {"task_id": task, "seed": 0})
            assert not r.is_error and r.structured_content["task_id"] == task
            assert r.structured_content["turn"] == 0 and "You are in a maze" in r.content[0].text

            w = (await s.call_tool("move", {"direction": wall})).structured_content
            assert w["reward"] == 0.0 and not w["terminated"] and f"wall to the {wall}" in w["observation"]
            bad = (await s.call_tool("move", {"direction": "sideways"})).structured_content
            assert bad["action_valid"] is False and "unknown direction" in bad["observation"] and bad["turn"] == 2

            for d in path:
                last = await s.call_tool("move", {"direction": d})
            out = last.structured_content
            assert out["reward"] == 1.0 and out["terminated"] and not out["truncated"]
            assert out["outcome"] == 1.0 and out["episode_return"] == 1.0 and out["turn"] == len(path) + 2
            assert "reached the goal" in last.content[0].text

            over = await s.call_tool("move", {"direction": "north"})
            assert over.is_error and "episode is over" in over.content[0].text

    _run(main)


@pytest.mark.parametrize("fmt", ["hermes", "openai", "xml", "text"])
def test_every_tool_format_routes_calls_through_env_step(fmt):
    session = EnvSession(turngym.make("tests/Guess-v0", tool_format=fmt))

    async def main():
        async with Client(build_server(session, "tests/Guess-v0")) as c:
            await c.call_tool("reset", {"task_id": "3"})
            low = (await c.call_tool("guess", {"number": 1})).structured_content
            assert low["observation"] == "higher" and low["reward"] == 0.0 and low["action_valid"]
            win = (await c.call_tool("guess", {"number": 3})).structured_content
            assert win["observation"] == "correct!" and win["reward"] == 1.0 and win["terminated"]
            assert win["outcome"] == 1.0 and win["turn"] == 2

    _run(main)


@pytest.mark.parametrize("fmt", ["text", "hermes", "xml"])
def test_reset_tells_an_mcp_client_to_call_the_tools_not_to_write_them(fmt):
    session = EnvSession(turngym.make("turngym/Maze-v0", tool_format=fmt))
    out = session.reset(task_id="small-train-0000")
    text = out["observation"]
    assert "You are in a maze" in text and "Act by calling the tools (move); each call is one step" in text
    for how_to_write in ("single command", "<tool_call>", "You can use these tags"):
        assert how_to_write not in text and how_to_write not in json.dumps(out["messages"])
    assert session.call("move", {"direction": "north"})["turn"] == 1


def test_turn_limit_truncates_and_reset_starts_over():
    session = EnvSession(turngym.make("tests/Guess-v0", max_turns=3))

    async def main():
        async with Client(build_server(session, "g")) as c:
            await c.call_tool("reset", {"task_id": "2"})
            outs = [(await c.call_tool("guess", {"number": 8})).structured_content for _ in range(3)]
            assert [o["truncated"] for o in outs] == [False, False, True]
            assert not outs[-1]["terminated"] and outs[-1]["outcome"] == 0.0
            assert (await c.call_tool("guess", {"number": 2})).is_error
            again = (await c.call_tool("reset", {"task_id": "2"})).structured_content
            assert again["turn"] == 0 and again["episode_return"] == 0.0
            assert (await c.call_tool("guess", {"number": 2})).structured_content["terminated"]
            missing = await c.call_tool("reset", {"task_id": "99"})
            assert missing.is_error and "not in this env's split" in missing.content[0].text

    _run(main)


def test_a_text_format_env_cannot_call_its_second_tool_and_says_so():
    session = EnvSession(turngym.make("turngym/SQL-synthetic-v1", tool_format="text"))
    session.reset(task_id=session.base.task_ids[0], seed=0)
    first, second = session.base.tools.names[:2]
    with pytest.raises(StepError, match=rf"cannot express a call to '{second}'.*tool_format=hermes"):
        session.call(second, {"query": "SELECT 1"})
    assert session.turn == 0  # no step was taken


def test_unknown_tool_is_an_error_result_not_a_step():
    session = EnvSession(turngym.make("tests/Guess-v0"))
    session.reset(task_id="1")
    with pytest.raises(StepError, match="unknown tool 'shout'; this env has: guess"):
        session.call("shout", {})
    assert session.turn == 0


@pytest.mark.parametrize("fmt", ["hermes", "xml"])
def test_missing_arguments_reach_the_env_as_they_are_and_make_an_invalid_step(fmt):
    session = EnvSession(turngym.make("tests/Guess-v0", tool_format=fmt))
    session.reset(task_id="2")
    out = session.call("guess", {})
    assert out["action_valid"] is False and out["reward"] == 0.0 and out["turn"] == 1
    assert "number" in out["observation"] and "..." not in out["observation"]
