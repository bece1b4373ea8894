"""``ToolCallSession``, the piece the TRL and OpenEnv adapters share: any call a model or client can
send becomes the env's own step (or, with no episode to step, an error text), never an exception."""

from __future__ import annotations

import pytest

from turngym.integrations.session import ToolCallSession

ENVS = ["turngym/Maze-v0", "turngym/SQL-synthetic-v1", "turngym/Search-synthetic-v0", "turngym/Wordle-v0",
        "turngym/TextNav-v0", "turngym/TwentyQuestions-v0"]
MALFORMED = [("", {}), (None, None), (7, {"a": 1}), (["move"], {}), ("no_such_tool", {"x": 1}),
             ("__init__", {}), ("{tool}", "not a dict"), ("x" * 10_000, {"y": "\udcff"})]


@pytest.mark.parametrize("env_id", ENVS)
def test_malformed_calls_are_invalid_env_steps(env_id):
    s = ToolCallSession(env_id)
    assert not s.call("anything", {}).stepped  # no episode yet
    opening = s.reset(task_id=s.base.task_ids[0], seed=0)
    assert opening and all(s._format_block not in m.content for m in opening)
    name = s.specs[0].name
    for tool, args in MALFORMED + [(name, {"nope": 1}), (name, {k: 12345 for k in s.specs[0].parameters.get("properties", {})}),
                                   (name, [1, 2]), (name, "x")]:
        out = s.call(tool, args)
        assert out.stepped and isinstance(out.text, str) and out.text
        if s.done:
            break
        assert out.action_valid is False and out.text.startswith("Error"), (tool, args, out.text)
    assert s.turn >= 1


def test_tool_format_is_the_session_s_to_choose():
    with pytest.raises(ValueError, match="tool_format"):
        ToolCallSession("turngym/Maze-v0", tool_format="hermes")
