"""LMRL-Gym-style games: rules by hand, oracle vs random play, pluggable answerers, official lists."""

from __future__ import annotations

import json
from collections import deque

import pytest

import turngym
from turngym.agents.scripted import OracleAgent, RandomAgent
from turngym.envs.games.guess_city import GuessMyCityEnv
from turngym.envs.games.maze import DIRS, SIZES, carve_maze, make_task, open_dirs, shortest_path
from turngym.envs.games.textnav import apply, build_house, solve
from turngym.envs.games.twenty_questions import TwentyQuestionsEnv
from turngym.envs.games.wordle import WordleEnv, feedback
from turngym.rollout import episode_specs, make_env_factory, rollout

GAMES = ["turngym/Maze-v0", "turngym/Maze-partial-v0", "turngym/TextNav-v0", "turngym/Wordle-v0",
         "turngym/TwentyQuestions-v0", "turngym/GuessMyCity-v0"]


def _success(env_id, agent, n, **kw):
    ids = turngym.make(env_id, **kw).unwrapped.task_ids
    trajs = rollout(agent, make_env_factory(env_id, **agent.env_kwargs, **kw), episode_specs(ids, min(n, len(ids))), progress=False)
    return sum(t.outcome for t in trajs) / len(trajs)


@pytest.mark.parametrize("env_id", GAMES)
def test_oracle_wins_and_random_is_clearly_worse(env_id):
    oracle = _success(env_id, OracleAgent(), 60)
    rand = _success(env_id, RandomAgent(seed=3), 40)
    assert oracle >= 0.99
    assert rand <= 0.4 and rand < oracle - 0.5


@pytest.mark.parametrize("fmt", ["xml", "hermes", "openai"])
@pytest.mark.parametrize("env_id", GAMES)
def test_every_tool_format_works(env_id, fmt):
    assert _success(env_id, OracleAgent(), 8, tool_format=fmt) == 1.0


@pytest.mark.parametrize("env_id", GAMES)
def test_reset_is_deterministic_and_info_is_json(env_id):
    env = turngym.make(env_id, scripted_hints=True)
    a, info_a = env.reset(seed=7)
    b, info_b = env.reset(seed=7)
    assert [m.content for m in a] == [m.content for m in b] and info_a["task_id"] == info_b["task_id"]
    _, _, _, _, info = env.step(info_b["oracle_action"])
    json.dumps(info)
    tr, te = (turngym.make(env_id, split=s).unwrapped.task_ids for s in ("train", "test"))
    assert tr and te and not set(tr) & set(te)


# ----- maze --------------------------------------------------------------------------------------
def test_carved_maze_is_perfect():
    import random

    for n in SIZES.values():
        grid = carve_maze(n, random.Random(n))
        cells = [(r, c) for r in range(n) for c in range(n)]
        doors = sum(len(open_dirs(grid, cell)) for cell in cells) // 2
        assert doors == n * n - 1  # a spanning tree: connected with no cycle
        seen, queue = {(0, 0)}, deque([(0, 0)])
        while queue:
            cur = queue.popleft()
            for d in open_dirs(grid, cur):
                nxt = (cur[0] + DIRS[d][0], cur[1] + DIRS[d][1])
                if nxt not in seen:
                    seen.add(nxt)
                    queue.append(nxt)
        assert len(seen) == n * n


def test_maze_moves_observations_and_walls():
    env = turngym.make("turngym/Maze-v0").unwrapped
    obs, info = env.reset(seed=0, options={"task_id": "small-train-0000"})
    grid, start, goal = make_task("small-train-0000")
    assert "A" in obs[1].content and "G" in obs[1].content
    wall = next(d for d in DIRS if d not in open_dirs(grid, start))
    obs, r, term, _, info = env.step(wall)
    assert "wall" in obs[0].content and info["state_key"].endswith(f"{start[0]},{start[1]}") and info["action_valid"]
    obs, r, term, _, info = env.step("sideways")
    assert info["action_valid"] is False and "unknown direction" in obs[0].content
    path = shortest_path(grid, start, goal)
    for i, d in enumerate(path):
        obs, r, term, _, info = env.step(d[0])  # one-letter aliases work too
        assert term == (i == len(path) - 1)
    assert r == 1.0 and env.outcome() == 1.0
    partial = turngym.make("turngym/Maze-partial-v0").unwrapped
    obs, _ = partial.reset(seed=0, options={"task_id": "small-train-0000"})
    assert "#" not in obs[1].content and "Open:" in obs[1].content


# ----- text-nav ----------------------------------------------------------------------------------
def test_textnav_locked_door_needs_the_key():
    house, state = build_house("locked-train-0003")
    plan = solve(house, state)
    assert "take brass key" in plan and any(c.startswith("unlock") for c in plan)
    s = state
    for cmd in plan:
        s, _ = apply(house, s, cmd)
    assert s.where(house.target_item) == house.target_room
    # without the key, an unlock attempt is refused and the door stays shut
    room = next(r for r in house.doors if any(nb == house.target_room for nb in house.doors[r].values()))
    d = next(k for k, nb in house.doors[room].items() if nb == house.target_room)
    s0 = type(state)(room, state.items)
    s1, msg = apply(house, s0, f"unlock {d}")
    assert "need a key" in msg and s1 == s0
    s2, msg = apply(house, s0, f"go {d}")
    assert "locked" in msg and s2.room == room
    with pytest.raises(ValueError, match="unknown command"):
        apply(house, s0, "dance")


# ----- wordle ------------------------------------------------------------------------------------
@pytest.mark.parametrize("guess,answer,marks", [
    ("crane", "crane", "GGGGG"),
    ("speed", "abide", "..Y.Y"),  # the second e is gray: abide has only one e
    ("allee", "eagle", "YY.YG"),
    ("geese", "those", "...GG"),  # the first e's are gray: the only e of those is taken by the green
    ("lllll", "hello", "..GG."),
])
def test_wordle_feedback_by_hand(guess, answer, marks):
    assert feedback(guess, answer) == marks


def test_wordle_rules_and_reward():
    env = WordleEnv(letter_weight=0.1)
    env.reset(seed=0, options={"task_id": env.task_ids[0]})
    secret = env._secret
    _, r, term, _, info = env.step("abcde")
    assert info["action_valid"] is False and not term and r == 0.0  # not a word: no try used
    wrong = next(w for w in env.answers if feedback(w, secret).count("G") == 0 and w != secret)
    fb = feedback(wrong, secret)
    _, r, term, _, info = env.step(wrong)
    assert r == pytest.approx(0.1 * (fb.count("G") + 0.5 * fb.count("Y")) / 5) and info["guesses"] == 1
    for _ in range(5):
        obs, r, term, _, info = env.step(wrong)
    assert term and env.outcome() == 0.0 and secret.upper() in obs[0].content
    env.reset(seed=0, options={"task_id": env.task_ids[0]})
    _, r, term, _, _ = env.step(secret)
    assert term and r == pytest.approx(1.1)


@pytest.mark.data
def test_wordle_official_lists(shared_data):
    env = WordleEnv(words="lmrl", data_dir=str(shared_data), scripted_hints=True)
    assert len(env.answers) == 2315 and len(env.allowed) >= 12972
    wins = 0
    for tid in env.task_ids[:20]:
        _, info = env.reset(seed=0, options={"task_id": tid})
        for _ in range(6):
            _, _, term, _, info = env.step(info["oracle_action"])
            if term:
                break
        wins += env.outcome()
    assert wins >= 19


# ----- question games ----------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [TwentyQuestionsEnv, GuessMyCityEnv])
def test_every_secret_is_identifiable_and_answers_never_leak_it(cls):
    env = cls()
    sigs = {tuple(q.answer(e) for q in env.bank) for e in env.entities}
    assert len(sigs) == len(env.entities)
    for e in env.entities:
        for q in env.bank:
            assert e.name.lower() not in q.answer(e).lower()


def test_rule_answerer_matching():
    env = TwentyQuestionsEnv()
    rules = env.rules
    assert rules.classify("Is it an animal?")[1].key == "animal"
    assert rules.classify("does it have 4 legs")[1].key == "legs4"
    assert rules.classify("Could it be used in the kitchen?")[1].key == "kitchen"
    assert rules.classify("Is it a cell phone?") == ("guess", next(e for e in env.entities if e.name == "Smartphone"))
    assert rules.classify("Is it a zebra?") == ("wrong-guess", "zebra")
    assert rules.classify("What colour is it?")[0] == "unknown"
    city = GuessMyCityEnv().rules
    assert city.classify("Is it in the USA?")[1].key == "country:United States"
    assert city.classify("Is it in South America?")[1].key == "continent:South America"
    assert city.classify("is it bombay")[0] == "guess"


def test_question_game_ends_after_max_questions():
    env = turngym.make("turngym/TwentyQuestions-v0", max_questions=3).unwrapped
    env.reset(seed=0)
    for i in range(3):
        obs, r, term, _, info = env.step("Is it a zebra?")
    assert term and r == 0.0 and "out of questions" in obs[0].content and env.outcome() == 0.0


def test_model_answerer_plugs_in(tiny_model):
    from turngym.agents.hf import HFPolicy

    policy = HFPolicy(tiny_model.model, tiny_model.tokenizer)
    env = turngym.make("turngym/TwentyQuestions-llm-v0", answerer=policy, scripted_hints=True)
    assert env.spec.nondeterministic
    obs, info = env.reset(seed=0)
    assert info["nondeterministic"] is True
    obs, r, term, _, info = env.step("Is it an animal?")
    assert info["action_valid"] and obs[0].content and not term
    secret = env.unwrapped._secret
    obs, r, term, _, info = env.step(f"Is it {secret.name}?")  # the win is decided by the rules
    assert term and r == 1.0
    lmrl_env = turngym.make("turngym/GuessMyCity-llm-v0", answerer=policy, cities="builtin")
    assert lmrl_env.unwrapped.answerer is not None


@pytest.mark.data
def test_lmrl_object_and_city_lists(shared_data, tiny_model):
    from turngym.agents.hf import HFPolicy

    policy = HFPolicy(tiny_model.model, tiny_model.tokenizer)
    objs = TwentyQuestionsEnv(objects="lmrl", data_dir=str(shared_data), answerer=policy)
    assert len(objs.entities) == 158
    cities = GuessMyCityEnv(cities="lmrl", data_dir=str(shared_data), answerer=policy)
    assert len(cities.entities) == 100
    with pytest.raises(ValueError, match="model answerer"):
        TwentyQuestionsEnv(objects="lmrl", data_dir=str(shared_data))
