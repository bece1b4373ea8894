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


def test_your_own_env_plugs_into_all_three_by_its_id():
    """A user's env, named as ``"their.module:ns/Name-v0"`` (the module registers it), in each adapter."""
    pytest.importorskip("trl")
    pytest.importorskip("openenv")
    skyrl_gym = pytest.importorskip("skyrl_gym")
    from turngym.integrations.openenv import TurngymAction, environment_class
    from turngym.integrations.skyrl import register_envs
    from turngym.integrations.trl import environment_factory

    env_id = "toy_envs:tests/Guess-v0"
    trl_env = environment_factory(env_id)()
    assert "Guess a number" in trl_env.reset(task_id="3") and trl_env.guess(number=3) == "correct!"
    assert trl_env.get_reward() == 1.0

    openenv_env = environment_class(env_id)()
    openenv_env.reset(task_id="4")
    assert openenv_env.step(TurngymAction(tool_name="guess", arguments={"number": 4})).reward == 1.0
    assert openenv_env.get_metadata().name == "tests/Guess-v0"

    register_envs([env_id])
    skyrl_env = skyrl_gym.make(env_id, extras={"task_id": "2", "max_turns": 3})
    skyrl_env.init([])
    out = skyrl_env.step('<tool_call>{"name": "guess", "arguments": {"number": 2}}</tool_call>')
    assert out["reward"] == 1.0 and out["done"] and skyrl_env.max_turns == 3
