import json
import math

import pytest

from turngym.types import Message, ToolCall, ToolResult, ToolSpec, Trajectory, Turn


def _trajectory() -> Trajectory:
    call = ToolCall("t1_0", "act", {"command": "go north", "nested": {"k": [1, 2.5, None, "ü"]}})
    turn = Turn(
        action_text='<tool_call>{"name": "act"}</tool_call>',
        tool_calls=[call],
        observation=[Message("tool", "You are in a kitchen. ☕", tool_call_id="t1_0", name="act")],
        reward=0.1 + 0.2,  # a float that does not print as it reads
        info={"action_valid": True, "state_key": "k1", "elapsed_s": 1e-7, "won": False},
        prompt_ids=[1, 2, 3],
        action_ids=[4, 5],
        action_logprobs=[-0.25, -1.0000000000000002],
    )
    return Trajectory(
        task_id="game-3",
        turns=[turn, Turn(action_text="", info={"action_valid": False})],
        outcome=1.0,
        terminated=True,
        metadata={"seed": 7, "task_type": "coin"},
        initial_observation=[Message("system", "sys"), Message("user", "task")],
    )


def test_trajectory_json_round_trip_is_lossless():
    t = _trajectory()
    back = Trajectory.from_json(t.to_json())
    assert back == t
    assert back.turns[0].reward == 0.1 + 0.2
    assert back.turns[0].action_logprobs[1] == -1.0000000000000002
    assert json.loads(t.to_json()) == json.loads(back.to_json())


def test_message_and_tool_types_round_trip():
    m = Message("assistant", "", tool_calls=[ToolCall("c", "f", {"a": 1})])
    assert Message.from_dict(m.to_dict()) == m
    spec = ToolSpec("f", "does f", {"type": "object", "properties": {}})
    assert ToolSpec.from_dict(spec.to_dict()) == spec
    assert spec.to_openai()["function"]["name"] == "f"
    r = ToolResult("c", "oops", True, "f")
    assert ToolResult.from_dict(r.to_dict()) == r
    chat = m.to_chat()
    assert chat["tool_calls"][0]["function"] == {"name": "f", "arguments": {"a": 1}}


def test_validation():
    with pytest.raises(ValueError, match="role"):
        Message("robot", "hi")
    with pytest.raises(TypeError):
        Message("user", None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="logprobs"):
        Turn(action_text="x", action_ids=[1, 2], action_logprobs=[-1.0])


def test_trajectory_properties():
    t = _trajectory()
    assert t.success and math.isclose(t.total_reward, 0.3)
