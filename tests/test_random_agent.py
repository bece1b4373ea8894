"""The random agent on an env that lists no admissible actions: well-formed calls sampled from the
tools' JSON schemas, in the env's own tool format, so its invalid-action rate measures the env and
not the agent's typing."""

from __future__ import annotations

import random

import jsonschema
import pytest
from toy_envs import GuessEnv

import turngym
from turngym.agents.scripted import RandomAgent, sample_value
from turngym.rollout import episode_specs, make_env_factory, rollout


class NoHintsGuess(GuessEnv):
    """The toy game without ``admissible_actions`` (like the README's example env)."""

    def admissible_actions(self):
        return None


turngym.register("tests/NoHintsGuess-v0", entry_point=NoHintsGuess, max_turns=5)

SCHEMAS = [
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 5}}, "required": ["n"]},
    {"type": "object", "properties": {"x": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                                      "flag": {"type": "boolean"}}, "required": ["x", "flag"]},
    {"type": "object", "properties": {"kind": {"enum": ["a", "b"]}, "name": {"type": "string", "maxLength": 4},
                                      "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1}},
     "required": ["kind", "tags"]},
    {"type": "object", "properties": {"v": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                                      "c": {"const": 7}, "o": {"type": ["null", "string"]}}, "required": ["v", "c"]},
]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_sampled_arguments_satisfy_their_schema(schema):
    rng = random.Random(0)
    for _ in range(200):
        jsonschema.validate(sample_value(schema, rng), schema)


def test_sampled_values_by_hand():
    rng = random.Random(0)
    assert {sample_value({"type": "integer", "minimum": 3, "maximum": 4}, rng) for _ in range(50)} == {3, 4}
    assert {sample_value({"type": "integer"}, rng) for _ in range(300)} == set(range(10))  # unbounded: 0 to 9
    assert sample_value({"const": "x"}, rng) == "x" and sample_value({"type": "null"}, rng) is None
    obj = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a"]}
    keys = [tuple(sorted(sample_value(obj, rng))) for _ in range(100)]
    assert set(keys) == {("a",), ("a", "b")}  # required always, optional half the time


@pytest.mark.parametrize("fmt", ["hermes", "openai", "xml", "text"])
def test_random_play_without_admissible_actions_is_mostly_valid(fmt):
    factory = make_env_factory("tests/NoHintsGuess-v0", n_tasks=8, tool_format=fmt, scripted_hints=True)
    trajs = rollout(RandomAgent(seed=0), factory, episode_specs([str(i) for i in range(1, 9)], 16), progress=False)
    turns = [t for traj in trajs for t in traj.turns]
    invalid = sum(not t.info["action_valid"] for t in turns) / len(turns)
    assert invalid < 0.5, invalid
    assert all(t.tool_calls and t.tool_calls[0].name == "guess" for t in turns)
    # guesses come from 0 to 9 (the schema has no bounds), so some of the 1-8 secrets are found
    assert 0 < sum(traj.success for traj in trajs) < len(trajs)
