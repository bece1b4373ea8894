"""``EnvInfo``: one probe per env id and kwargs, and the one definition of a valid action."""

from __future__ import annotations

import turngym
from turngym.rollout import env_info
from turngym.envs.info import task_groups
from turngym.tools.formats import format_stops
from turngym.types import Turn, action_valid


def test_env_info_reads_the_env_once_per_id_and_kwargs(monkeypatch):
    made = []
    real = turngym.envs.registry.make
    monkeypatch.setattr(turngym.envs.registry, "make", lambda *a, **k: made.append(a) or real(*a, **k))
    info = env_info("tests/Guess-v0", tool_format="xml", n_tasks=3)
    assert info.task_ids == ("1", "2", "3")
    assert [t.name for t in info.tools] == ["guess"] and info.tool_format == "xml"
    assert info.stop_strings == ("</guess>",)
    # the same facts again, and max_turns (how episodes run, not what the env is) changes nothing
    assert env_info("tests/Guess-v0", n_tasks=3, tool_format="xml") is info
    assert env_info("tests/Guess-v0", tool_format="xml", n_tasks=3, max_turns=2) is info
    assert len(made) == 1
    other = env_info("tests/Guess-v0", tool_format="hermes", n_tasks=3)
    assert other.stop_strings == ("</tool_call>",) and len(made) == 2
    assert task_groups("tests/Guess-v0", n_tasks=2) == {"1": "default", "2": "default"}


def test_format_stops_is_empty_without_tools():
    assert format_stops("xml", []) == []


def test_action_valid_has_one_default():
    assert action_valid({"action_valid": True}) and not action_valid({"action_valid": False})
    assert not action_valid({})  # valid only when the env said so
    assert Turn("x", info={"action_valid": True}).action_valid and not Turn("x").action_valid
