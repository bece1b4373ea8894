"""turngym envs made by ``skyrl_gym.make`` and played through SkyRL's ``BaseTextEnv`` contract.

The loop below is SkyRL's generator loop without the model: ``make(id, env_config=..., extras=row)``,
``init(prompt)``, then ``step(text)`` until ``done``, summing the rewards. The text comes from the
env's oracle (``oracle_action()``), rendered in the env's own tool format, as a model would write it.
"""

from __future__ import annotations

import pytest

skyrl_gym = pytest.importorskip("skyrl_gym", reason='needs skyrl-gym: pip install "turngym[skyrl]"')

from skyrl_gym.envs.base_text_env import BaseTextEnv  # noqa: E402

import turngym  # noqa: E402
from turngym.integrations.skyrl import TurngymTextEnv, register_envs, task_rows  # noqa: E402

# Wordle also pays a per-letter reward on every guess, so its oracle's return is above 1; its outcome is 1.
ORACLE_ENVS = ["turngym/Maze-v0", "turngym/SQL-synthetic-v1", "turngym/Search-synthetic-v0", "turngym/Wordle-v0"]


def play(env: TurngymTextEnv, replies=None) -> tuple[float, int, list[dict]]:
    """SkyRL's loop; the replies default to the env's oracle. Returns (summed reward, turns, last step)."""
    chat, meta = env.init([])
    assert chat and all(set(m) == {"role", "content"} for m in chat) and meta["task_id"] == env.task_id
    total, out, turns = 0.0, None, 0
    while out is None or not out["done"]:
        text = replies.pop(0) if replies else env.turngym_env.unwrapped.oracle_action()
        out = env.step(text)
        total += out["reward"]
        turns += 1
    return total, turns, out


def test_every_turngym_id_is_in_the_skyrl_registry():
    assert {i for i in turngym.list_envs() if i.startswith("turngym/")} <= set(skyrl_gym.registry)  # at import
    register_envs()  # ids registered after the import (other test modules register their own envs)
    assert set(turngym.list_envs()) <= set(skyrl_gym.registry)
    assert register_envs() == []  # registering again adds nothing


@pytest.mark.parametrize("env_id", ORACLE_ENVS)
def test_skyrl_make_builds_the_env_and_an_oracle_episode_earns_1(env_id):
    task = turngym.make(env_id, split="test").unwrapped.task_ids[0]
    env = skyrl_gym.make(env_id, env_config={"split": "test"}, extras={"task_id": task, "max_turns": 100})
    assert isinstance(env, BaseTextEnv) and isinstance(env, TurngymTextEnv) and env.spec.id == env_id
    total, turns, last = play(env)
    assert last["done"] and last["metadata"]["terminated"] and last["metadata"]["outcome"] == 1.0
    assert env.get_metrics() == {"outcome": 1.0, "return": pytest.approx(total), "turns": turns, "invalid_actions": 0}
    assert total == pytest.approx(1.0) if env_id != "turngym/Wordle-v0" else total >= 1.0
    assert env.step("anything")["done"]  # after the end: no step, no exception
    env.close()


def test_malformed_replies_are_error_observations():
    env = skyrl_gym.make("turngym/SQL-synthetic-v1", env_config={}, extras={"extra_info": {"task_id": "shop-easy-00"}})
    env.init([])
    for reply in ["", "<submit>", "<execute_sql>SELEC nonsense</execute_sql>", "<describe_table>nope</describe_table>",
                  "<think><submit>SELECT 1</submit></think>", "\udcff" * 3, "<submit>" + "x" * 100_000 + "</submit>"]:
        out = env.step(reply)
        assert not out["done"] and out["metadata"]["action_valid"] is False
        assert out["observations"] and "rror" in out["observations"][0]["content"]
    assert env.get_metrics()["invalid_actions"] == 7


def test_turn_limit_is_the_smaller_of_the_env_and_skyrl_max_turns():
    env = skyrl_gym.make("turngym/Maze-v0", env_config={"split": "test"}, extras={"task_id": "small-test-0003", "max_turns": 2})
    total, turns, last = play(env, replies=["north", "north"])
    assert turns == 2 and last["done"] and last["metadata"]["truncated"] and total == 0.0
    assert skyrl_gym.make("turngym/Maze-v0", env_config={}, extras={"max_turns": 1000}).max_turns == 60


def test_task_rows_are_the_prompts_init_returns():
    rows = task_rows("turngym/Maze-v0", split="test")
    assert [r["task_id"] for r in rows] == turngym.make("turngym/Maze-v0", split="test").unwrapped.task_ids
    row = rows[3]
    env = skyrl_gym.make(row["env_class"], env_config={"split": "test"}, extras={k: v for k, v in row.items() if k != "prompt"})
    assert env.init(row["prompt"])[0] == row["prompt"]
