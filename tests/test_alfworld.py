"""ALFWorld on the real valid_seen games (``shared_data``; skipped without them)."""

from __future__ import annotations

import json

import pytest

import turngym
from turngym.agents.scripted import OracleAgent, RandomAgent
from turngym.envs.alfworld.games import TASK_TYPES, list_games, task_type_of
from turngym.bench.alfworld_report import format_table, success_by_type
from turngym.rollout import episode_specs, make_env_factory, rollout
from turngym.types import Trajectory

pytestmark = pytest.mark.data
VALID_SEEN_COUNTS = {  # games per task type in json_2.1.1/valid_seen
    "pick_and_place_simple": 35, "look_at_obj_in_light": 13, "pick_clean_then_place_in_recep": 27,
    "pick_heat_then_place_in_recep": 16, "pick_cool_then_place_in_recep": 25, "pick_two_obj_and_place": 24,
}


@pytest.fixture
def data_dir(shared_data):
    if not (shared_data / "alfworld" / "json_2.1.1" / "valid_seen").is_dir():
        pytest.skip(f"no ALFWorld valid_seen in {shared_data}")
    pytest.importorskip("alfworld")
    return str(shared_data)


def one_per_type(data_dir) -> list[str]:
    games = list_games(turngym.envs.alfworld.games.alfworld_root(data_dir), "valid_seen")
    return [next(g.task_id for g in games if g.task_type == t) for t in TASK_TYPES]


def test_games_are_listed_with_their_six_task_types(data_dir):
    from pathlib import Path

    games = list_games(Path(data_dir) / "alfworld", "valid_seen")
    assert len(games) == 140 and len({g.task_id for g in games}) == 140
    counts = {t: sum(g.task_type == t for g in games) for t in TASK_TYPES}
    assert counts == VALID_SEEN_COUNTS
    with pytest.raises(ValueError, match="task type"):
        task_type_of("make_coffee-Mug-1")
    with pytest.raises(ValueError, match="unknown ALFWorld split"):
        list_games(Path(data_dir) / "alfworld", "validation")


def test_missing_data_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TURNGYM_DATA", str(tmp_path))
    monkeypatch.setenv("TURNGYM_CACHE", str(tmp_path / "cache"))
    with pytest.raises(FileNotFoundError, match="turngym data download alfworld"):
        turngym.make("turngym/ALFWorld-v0", split="valid_seen")


def test_play_invalid_command_determinism_and_hints(data_dir):
    env = turngym.make("turngym/ALFWorld-v0", split="valid_seen", data_dir=data_dir, scripted_hints=True,
                       tool_format="text")
    u = env.unwrapped
    tid = one_per_type(data_dir)[2]
    obs, info = env.reset(seed=0, options={"task_id": tid})
    assert "Your task is to:" in obs[-1].content and "Welcome to TextWorld" not in obs[-1].content
    assert info["task_type"] == "pick_clean_then_place_in_recep"
    assert info["oracle_action"] == u.walkthrough()[0] and u.walkthrough()
    assert info["oracle_action"] in info["admissible_actions"]
    start_key = info["state_key"]
    assert obs[-1].content.endswith("Admissible commands: go to (any receptacle of the room), inventory, look.")
    obs, reward, term, _, info = env.step("dance wildly")
    assert obs[0].content == "Nothing happens."  # the commands are as they were: no list
    assert not info["action_valid"] and info["state_key"] == start_key
    obs, reward, term, _, info = env.step(info["oracle_action"])
    assert info["action_valid"] and info["state_key"] != start_key and reward == 0.0
    json.dumps(info)
    obs2, info2 = env.reset(seed=0, options={"task_id": tid})
    assert info2["state_key"] == start_key and obs2[-1].content == env.reset(seed=1, options={"task_id": tid})[0][-1].content
    env.close()


def test_backslashes_are_refused_and_a_missed_deadline_truncates(data_dir):
    env = turngym.make("turngym/ALFWorld-v0", split="valid_seen", data_dir=data_dir, tool_format="text")
    base = env.unwrapped
    tid = one_per_type(data_dir)[0]
    env.reset(seed=0, options={"task_id": tid})
    for cmd in ("\\help", "look \\_ go to desk 1"):
        obs, _, _, truncated, info = env.step(cmd)
        assert "backslash" in obs[0].content and not info["action_valid"] and not truncated
    # A deadline no engine call can meet: the step's one call misses it, for real, and the
    # episode ends as truncated; the next reset starts a fresh engine and plays on.
    base.engine_deadline_s = 1e-6
    obs, reward, term, truncated, info = env.step("look")
    assert truncated and not term and "deadline" in info["truncated_reason"] and base._engine.restarts == 1
    base.engine_deadline_s = 30.0
    env.reset(seed=0, options={"task_id": tid})
    obs, _, _, truncated, info = env.step(base.walkthrough()[0])
    assert info["action_valid"] and not truncated
    env.close()


def test_oracle_wins_a_few_games_and_random_does_not(data_dir):
    ids = [one_per_type(data_dir)[i] for i in (1, 3, 5)]  # look, heat, pick two (the full run is slow)
    factory = make_env_factory("turngym/ALFWorld-v0", split="valid_seen", data_dir=data_dir, scripted_hints=True)
    trajs = rollout(OracleAgent(), factory, episode_specs(ids, len(ids)), num_envs=1, progress=False)
    assert [t.outcome for t in trajs] == [1.0] * 3
    assert all(t.turns[-1].reward == 1.0 and t.terminated for t in trajs)
    rows = success_by_type(trajs)
    assert rows["all"] == (3, 3) and rows["pick_heat_then_place_in_recep"] == (1, 1)
    factory = make_env_factory("turngym/ALFWorld-v0", split="valid_seen", data_dir=data_dir, scripted_hints=True,
                               max_turns=8)
    randoms = rollout(RandomAgent(seed=0), factory, episode_specs(ids[:2], 2), num_envs=1, progress=False)
    assert sum(t.outcome for t in randoms) == 0


def test_success_table_by_type():
    trajs = [Trajectory("a", outcome=1.0, metadata={"task_type": "look_at_obj_in_light"}),
             Trajectory("b", outcome=0.0, metadata={"task_type": "look_at_obj_in_light"}),
             Trajectory("c", outcome=1.0, metadata={"task_type": "pick_two_obj_and_place"})]
    rows = success_by_type(trajs)
    assert rows == {"look_at_obj_in_light": (1, 2), "pick_two_obj_and_place": (1, 1), "all": (2, 3)}
    lines = format_table(rows).splitlines()
    assert lines[2].split() == ["look_at_obj_in_light", "1/2", "50.0%", "9.5%-90.5%"]  # Wilson's interval
    assert lines[-1].split() == ["all", "2/3", "66.7%", "20.8%-93.9%"]


@pytest.mark.slow
@pytest.mark.timeout(3600)  # 140 games at 2-5 s each (parsing a game's PDDL dominates)
def test_oracle_wins_every_valid_seen_game(data_dir):
    factory = make_env_factory("turngym/ALFWorld-v0", split="valid_seen", data_dir=data_dir, scripted_hints=True)
    env = factory()
    ids = env.unwrapped.task_ids
    env.close()
    trajs = rollout(OracleAgent(), factory, episode_specs(ids, len(ids)), num_envs=1, progress=False)
    rows = success_by_type(trajs)
    print("\n" + format_table(rows))
    assert rows["all"] == (140, 140), format_table(rows)


def test_a_missing_split_names_the_splits_this_copy_holds(tmp_path):
    (tmp_path / "json_2.1.1" / "valid_unseen").mkdir(parents=True)
    with pytest.raises(FileNotFoundError) as e:
        list_games(tmp_path, "train")
    msg = str(e.value)
    assert "no ALFWorld split 'train'" in msg and "`--split valid_unseen`" in msg and "`--split test`" not in msg
    assert "turngym data download alfworld" in msg
    (tmp_path / "json_2.1.1" / "valid_seen").mkdir()
    with pytest.raises(FileNotFoundError, match=r"`--split valid_seen`, `--split valid_unseen`, `--split test`"):
        list_games(tmp_path, "train")
