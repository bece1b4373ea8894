import json
import math

import pytest

from turngym.types import Message, TokenRecord, ToolCall, ToolResult, ToolSpec, Trajectory, Turn


def _trajectory() -> Trajectory:
    call = ToolCall("t1_0", "act", {"command": "go north", "nested": {"k": [1, 2.5, None, "ü"]}})
    turn = Turn(
        action_text='<tool_call>{"name": "act"}</tool_call>',
        tool_calls=[call],
        observation=[Message("tool", "You are in a kitchen. ☕", tool_call_id="t1_0", name="act")],
        reward=0.1 + 0.2,  # a float that does not print as it reads
        info={"action_valid": True, "state_key": "k1", "elapsed_s": 1e-7, "won": False},
        span=(3, 5),
    )
    record = TokenRecord([1, 2, 3, 4, 5], [0, 0, 0, 1, 1], [0.0, 0.0, 0.0, -0.25, -1.0000000000000002])
    return Trajectory(
        task_id="game-3",
        turns=[turn, Turn(action_text="", info={"action_valid": False})],
        outcome=1.0,
        terminated=True,
        metadata={"seed": 7, "task_type": "coin"},
        initial_observation=[Message("system", "sys"), Message("user", "task")],
        record=record,
    )


def test_trajectory_json_round_trip_is_lossless():
    t = _trajectory()
    back = Trajectory.from_json(t.to_json())
    assert back == t
    assert back.turns[0].reward == 0.1 + 0.2
    assert back.action_logprobs(0)[1] == -1.0000000000000002
    assert back.prompt_ids(0) == [1, 2, 3] and back.action_ids(0) == [4, 5] and back.action_ids(1) == []
    assert json.loads(t.to_json()) == json.loads(back.to_json())


def test_a_trajectory_in_the_old_per_turn_prompt_format_fails_clearly():
    old = _trajectory().to_dict()
    del old["record"]
    old["turns"][0].update(prompt_ids=[1, 2, 3], action_ids=[4, 5], action_logprobs=[-0.25, -1.0])
    with pytest.raises(ValueError, match="older turngym"):
        Trajectory.from_dict(old)


def test_record_branch_shares_the_prefix_and_records_unknown_logprobs_as_nan():
    t = _trajectory()
    branch, span = t.record.branch(t.turns[0].span[0], [9, 8, 7])
    assert branch.ids == [1, 2, 3, 9, 8, 7] and span == (3, 6) and branch.prompt(span) == t.prompt_ids(0)
    assert branch.loss_mask == [0, 0, 0, 1, 1, 1] and all(math.isnan(x) for x in branch.logprobs[3:])
    branch.truncate(4)
    assert branch.ids == [1, 2, 3, 9] and len(branch.loss_mask) == len(branch.logprobs) == 4


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
    with pytest.raises(ValueError, match="log-probs"):
        TokenRecord().add_action([1, 2], [-1.0])


def test_trajectory_properties():
    t = _trajectory()
    assert t.success and math.isclose(t.total_reward, 0.3)
