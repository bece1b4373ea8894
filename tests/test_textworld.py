"""TextWorld env family: suites, generation cache, env contract, oracle and random play.

Games are generated once into pytest's cache folder (``.pytest_cache/d/turngym_textworld``) and
reused by later runs; a fresh checkout first spends about 30 s (idle machine) generating 11 games.
One test generates a game into a fresh folder on every run (about 3 s), to check locking and
determinism.
"""

from __future__ import annotations

import fcntl
import json
import multiprocessing as mp
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import psutil
import pytest
from gymnasium.utils.env_checker import check_env

import turngym
import turngym.envs.base
import turngym.envs.textworld.env
from turngym.agents.scripted import OracleAgent, RandomAgent
from turngym.envs.textworld.env import check_command, clean_feedback, normalize_command
from turngym.envs.textworld.games import SUITES, content_hash, ensure_games, split_dir
from turngym.rollout import episode_specs, make_env_factory, rollout
from turngym.types import Message

pytest.importorskip("textworld")

IDS = {lv: f"turngym/TextWorld-{lv}-v0" for lv in ("easy", "medium", "hard")}
N_GAMES = {"easy": 4, "medium": 2, "hard": 1}  # medium: one treasure hunter, one cooking game


@pytest.fixture(scope="session")
def tw_root(request, tmp_path_factory) -> Path:
    cache = getattr(request.config, "cache", None)
    return cache.mkdir("turngym_textworld") if cache is not None else tmp_path_factory.mktemp("textworld")


def make(tw_root, level="easy", split="test", num_games=None, **kw):
    return turngym.make(IDS[level], split=split, num_games=num_games or N_GAMES[level], cache_dir=str(tw_root), **kw)


def hermes(cmd: str) -> str:
    return f'<tool_call>\n{json.dumps({"name": "act", "arguments": {"command": cmd}})}\n</tool_call>'


def play(env, task_id, commands, seed=0):
    obs, info = env.reset(seed=seed, options={"task_id": task_id})
    steps = []
    for c in commands:
        steps.append(env.step(c))
        if steps[-1][2] or steps[-1][3]:
            break
    return obs, info, steps


# ----- registry and suites ----------------------------------------------------------------------
def test_suites_are_registered_with_matching_turn_limits():
    listed = turngym.list_envs("turngym")
    for level, env_id in IDS.items():
        assert listed[env_id] and "TextWorld" in listed[env_id]
        assert gym.spec(env_id).max_episode_steps == SUITES[level].max_turns
        assert SUITES[level].max_moves < SUITES[level].max_turns  # the oracle always fits


def test_registering_does_not_import_textworld():
    code = "import sys, turngym; assert 'turngym/TextWorld-easy-v0' in turngym.list_envs(); print('textworld' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_bad_constructor_arguments_are_clear_errors(tw_root):
    with pytest.raises(ValueError, match="level"):
        turngym.make("turngym/TextWorld-easy-v0", level="impossible", cache_dir=str(tw_root))
    with pytest.raises(ValueError, match="reward"):
        make(tw_root, reward="shaped")
    with pytest.raises(ValueError, match="split"):
        make(tw_root, split="valid")


# ----- the game cache ---------------------------------------------------------------------------
def test_walkthrough_lengths_follow_the_ladder(tw_root):
    for level, n in N_GAMES.items():
        suite = SUITES[level]
        for g in ensure_games(level, "test", n, tw_root):
            assert suite.min_moves <= len(g.walkthrough) <= suite.max_moves
            assert g.task_type in {v.task_type for v in suite.variants}
    assert {g.task_type for g in ensure_games("medium", "test", 2, tw_root)} == {"treasure", "cooking"}


def test_train_and_test_games_never_overlap(tw_root):
    train = ensure_games("easy", "train", 4, tw_root)
    test = ensure_games("easy", "test", 4, tw_root)
    hashes = {}
    for split, games in (("train", train), ("test", test)):
        folder = split_dir("easy", split, tw_root)
        # The recorded hash is the hash of the game file on disk (content, not seed).
        hashes[split] = {content_hash(json.loads((folder / g.file).with_suffix(".json").read_text())) for g in games}
        assert hashes[split] == {g.content_hash for g in games} and len(hashes[split]) == len(games)
    assert not hashes["train"] & hashes["test"]
    assert not {g.seed for g in train} & {g.seed for g in test}
    assert not {g.task_id for g in train} & {g.task_id for g in test}


def _ensure_in_child(root, out):
    out.put([g.content_hash for g in ensure_games("easy", "test", 1, root)])


def test_generation_is_deterministic_and_safe_from_two_processes(tw_root, tmp_path):
    # Two processes ask for the same fresh split at once: one generates under the lock, the other
    # waits; both see the same game, and it is the game every other machine generates too.
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_ensure_in_child, args=(tmp_path, out)) for _ in range(2)]
    for p in procs:
        p.start()
    got = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    assert got[0] == got[1] == [ensure_games("easy", "test", 1, tw_root)[0].content_hash]
    assert sorted(p.name for p in split_dir("easy", "test", tmp_path).iterdir()) == [".lock", "0000.json", "0000.z8", "index.json"]


def test_a_killed_caller_leaves_no_second_generator_beside_its_child(tw_root, tmp_path):
    # SIGTERM ends the caller at once, not its generator child: the child keeps the split's lock,
    # so the next caller waits for it and then finds its games, instead of generating beside it
    code = f"from turngym.envs.textworld.games import ensure_games; ensure_games('easy', 'test', 3, {str(tmp_path)!r})"
    caller = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.DEVNULL)
    folder = split_dir("easy", "test", tmp_path)
    deadline = time.monotonic() + 120
    while not list(folder.glob(".gen-*")) and time.monotonic() < deadline:  # the child is making a game
        time.sleep(0.05)
    child = psutil.Process(caller.pid).children()[0]
    caller.terminate()
    caller.wait(timeout=30)
    with open(folder / ".lock", "w") as lock:  # while the child runs, no one else may take the lock
        while child.is_running() and child.status() != psutil.STATUS_ZOMBIE:
            with pytest.raises(BlockingIOError):
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            time.sleep(0.2)
    games = ensure_games("easy", "test", 3, tmp_path)
    assert [g.content_hash for g in games] == [g.content_hash for g in ensure_games("easy", "test", 3, tw_root)]
    assert not list(folder.glob(".gen-*"))


@pytest.mark.slow
def test_worker_processes_make_the_sequence_one_process_makes(tw_root, tmp_path, monkeypatch):
    from turngym.envs.textworld.games import generate

    monkeypatch.setenv("PYTHONHASHSEED", "0")  # the workers read it; games depend on it
    made = {w: generate("easy", "test", 5, tmp_path / str(w), workers=w)["games"] for w in (1, 3)}
    cached = ensure_games("easy", "test", 5, tw_root)  # the same games as every machine makes
    assert [g["content_hash"] for g in made[1]] == [g["content_hash"] for g in made[3]] == [g.content_hash for g in cached]
    assert [g["task_id"] for g in made[3]] == [g.task_id for g in cached]
    assert sorted(p.name for p in (tmp_path / "3").iterdir()) == sorted(
        [f"{i:04d}.{ext}" for i in range(5) for ext in ("json", "z8")] + ["index.json"])  # no temp folders left


# ----- the env contract -------------------------------------------------------------------------
@pytest.mark.parametrize("level", ["easy", "medium", "hard"])
def test_oracle_wins_every_game(tw_root, level):
    env = make(tw_root, level, scripted_hints=True)
    base = env.unwrapped
    for task_id in base.task_ids:
        obs, info = env.reset(seed=0, options={"task_id": task_id})
        assert info["task_type"] == base.task_type(task_id)
        total, turns = 0.0, 0
        while True:
            obs, reward, terminated, truncated, info = env.step(info["oracle_action"])
            total, turns = total + reward, turns + 1
            assert info["action_valid"], obs
            json.dumps(info)  # infos cross process boundaries and land in trajectory files
            if terminated or truncated:
                break
        assert terminated and not truncated and info["won"] and not info["lost"]
        assert info["score"] == info["max_score"] and base.outcome() == 1.0
        assert total == pytest.approx(1.0)  # dense: the normalised score gains add up to one
        assert turns == len(base.walkthrough(task_id))
        assert info["oracle_action"] is None  # nothing left to do
    env.close()


def test_random_admissible_play_wins_clearly_less_on_easy(tw_root):
    ids = make(tw_root).unwrapped.task_ids
    factory = make_env_factory(IDS["easy"], split="test", num_games=4, cache_dir=str(tw_root), scripted_hints=True)
    specs = episode_specs(ids, 24)
    oracle = rollout(OracleAgent(), factory, specs, progress=False)
    rand = rollout(RandomAgent(seed=0), factory, specs, progress=False)
    success = lambda trajs: sum(t.outcome for t in trajs) / len(trajs)  # noqa: E731
    assert success(oracle) == 1.0
    assert success(rand) <= 0.7


def test_rollout_in_subprocess_workers(tw_root):
    ids = make(tw_root).unwrapped.task_ids
    factory = make_env_factory(IDS["easy"], split="test", num_games=4, cache_dir=str(tw_root), scripted_hints=True)
    trajs = rollout(OracleAgent(), factory, episode_specs(ids, 6), num_envs=2, workers=True, progress=False)
    assert [t.outcome for t in trajs] == [1.0] * 6
    assert all(t.terminated and t.turns[-1].info["won"] for t in trajs)


def test_reset_is_deterministic(tw_root):
    env = make(tw_root)
    a, b = env.reset(seed=7), env.reset(seed=7)
    assert a[1]["task_id"] == b[1]["task_id"] and a[0] == b[0] and a[1]["state_key"] == b[1]["state_key"]
    for task_id in env.unwrapped.task_ids:
        first = env.reset(seed=1, options={"task_id": task_id})
        env.step(hermes("look"))
        again = env.reset(seed=2, options={"task_id": task_id})
        assert first[0] == again[0] and first[1]["state_key"] == again[1]["state_key"]
    obs = a[0]
    assert [m.role for m in obs] == ["system", "user"] and "act" in obs[0].content
    record = env.unwrapped.games[env.unwrapped.task_ids.index(a[1]["task_id"])]
    assert obs[1].content.startswith(record.objective) and "$$" not in obs[1].content and "0/1" not in obs[1].content


def test_state_key_is_the_world_state(tw_root):
    env = make(tw_root)
    base = env.unwrapped
    task_id = base.task_ids[0]
    first = base.walkthrough(task_id)[0]  # "go <dir>"
    back = {"north": "south", "south": "north", "east": "west", "west": "east"}[first.split()[-1]]
    obs, info = env.reset(seed=0, options={"task_id": task_id})
    start = info["state_key"]
    assert isinstance(start, str)
    assert env.step(hermes("look"))[4]["state_key"] == start  # looking changes nothing
    assert env.step(hermes("xyzzy"))[4]["state_key"] == start
    moved = env.step(hermes(first))[4]["state_key"]
    assert moved != start
    assert env.step(hermes(f"go {back}"))[4]["state_key"] == start  # same state by another path
    other = make(tw_root)  # another instance agrees: the key is not a per-process hash
    assert other.reset(seed=5, options={"task_id": task_id})[1]["state_key"] == start


def test_dense_and_sparse_rewards(tw_root):
    cooking = [g for g in ensure_games("medium", "test", 2, tw_root) if g.task_type == "cooking"][0]
    assert cooking.max_score > 1
    rewards = {}
    for mode in ("dense", "sparse"):
        env = make(tw_root, "medium", reward=mode)
        _, _, steps = play(env, cooking.task_id, [hermes(c) for c in cooking.walkthrough])
        rewards[mode] = [s[1] for s in steps]
        assert steps[-1][2] and steps[-1][4]["won"]
    dense, sparse = rewards["dense"], rewards["sparse"]
    assert sum(dense) == pytest.approx(1.0)
    assert sum(1 for r in dense if r > 0) == cooking.max_score  # one point per scoring step
    assert all(r == pytest.approx(1 / cooking.max_score) for r in dense if r)
    assert sparse == [0.0] * (len(sparse) - 1) + [1.0]


def test_losing_ends_the_episode(tw_root):
    # Cooking: eating an ingredient the recipe needs loses the game.
    env = make(tw_root, "medium", reward="sparse")
    cooking = next(g for g in env.unwrapped.games if g.task_type == "cooking")
    upto = next(i for i, c in enumerate(cooking.walkthrough) if c.startswith("take "))
    item = cooking.walkthrough[upto][len("take "):].split(" from ")[0]
    commands = [hermes(c) for c in cooking.walkthrough[: upto + 1]] + [hermes(f"eat {item}")]
    _, _, steps = play(env, cooking.task_id, commands)
    obs, reward, terminated, truncated, info = steps[-1]
    assert terminated and info["lost"] and not info["won"] and reward == 0.0
    assert "You lost" in obs[0].content and env.unwrapped.outcome() == 0.0


def test_turn_limit_truncates(tw_root):
    env = make(tw_root)
    _, _, steps = play(env, env.unwrapped.task_ids[0], [hermes("look")] * 50)
    assert len(steps) == SUITES["easy"].max_turns
    assert steps[-1][3] and not steps[-1][2] and not steps[-1][4]["won"]


def test_gymnasium_env_checker(tw_root):
    env = make(tw_root)
    check_env(env.unwrapped, skip_render_check=False)
    check_env(make(tw_root, render_mode="ansi").unwrapped, skip_render_check=False)


def test_text_format_takes_plain_commands(tw_root):
    env = make(tw_root, tool_format="text", scripted_hints=True)
    task_id = env.unwrapped.task_ids[1]
    obs, info = env.reset(seed=0, options={"task_id": task_id})
    assert "one game command per turn" in obs[0].content
    assert info["oracle_action"] == env.unwrapped.walkthrough(task_id)[0]
    assert info["admissible_actions"] and all("<" not in a for a in info["admissible_actions"])
    obs, info, steps = play(env, task_id, env.unwrapped.walkthrough(task_id))
    assert steps[-1][4]["won"] and steps[-1][1] == 1.0
    assert steps[0][0][0].role == "user"


def test_malformed_actions_are_error_observations(tw_root):
    env = make(tw_root, invalid_action_penalty=-0.1)
    task_id = env.unwrapped.task_ids[0]
    env.reset(seed=0, options={"task_id": task_id})
    bad = [
        "go north",  # no tool call at all
        '<tool_call>{"name": "act", "arguments": {"command": "look"</tool_call>',  # broken JSON
        '<tool_call>{"name": "shell", "arguments": {"command": "ls"}}</tool_call>',  # unknown tool
        '<tool_call>{"name": "act", "arguments": {"command": 5}}</tool_call>',  # wrong type
        '<tool_call>{"name": "act", "arguments": {}}</tool_call>',  # missing argument
        hermes("   "),  # empty command
        hermes("x" * 500),  # too long for a game command
        hermes("restart"),  # game-system verbs are refused
        hermes("look. quit"),
        hermes("tw-trace-actions"),
        hermes("\\help"),  # the interpreter's own commands loop forever inside Jericho
        hermes("look \\_ restart"),  # an escaped return would queue "restart" as the next input
    ]
    for action in bad:
        obs, reward, terminated, truncated, info = env.step(action)
        assert info["action_valid"] is False, action
        assert reward == pytest.approx(-0.1) and not terminated
        assert obs and obs[0].content.startswith("Error:"), (action, obs)
        assert info["state_key"] == env.unwrapped.state_key()
    # The game's own "not understood" replies are observations, and count as invalid actions.
    for cmd in ("xyzzy", "__import__('os').system('echo hi')", "go up", "take the moon"):
        obs, _, _, _, info = env.step(hermes(cmd))
        assert info["action_valid"] is False and not obs[0].content.startswith("Error:"), obs
        assert any(s in obs[0].content for s in ("not a verb", "can't go", "can't see")), obs
    obs, _, _, _, info = env.step(hermes("look"))
    assert info["action_valid"] is True
    # None of it hurt the game: the walkthrough still wins from here.
    for cmd in env.unwrapped.walkthrough(task_id):
        obs, reward, terminated, truncated, info = env.step(hermes(cmd))
    assert terminated and info["won"]


def test_several_calls_in_one_turn_and_calls_after_the_end(tw_root):
    env = make(tw_root)
    task_id = env.unwrapped.task_ids[1]
    env.reset(seed=0, options={"task_id": task_id})
    utterance = "".join(hermes(c) for c in env.unwrapped.walkthrough(task_id) + ["look"])
    obs, reward, terminated, truncated, info = env.step(utterance)
    assert terminated and info["won"] and reward == 1.0
    assert "*** The End ***" in obs[-2].content and "game is over" in obs[-1].content
    assert info["action_valid"] is False  # the call after the end was refused


def test_admissible_commands_in_observations(tw_root):
    env = make(tw_root, admissible_in_obs=True)
    obs, info = env.reset(seed=0, options={"task_id": env.unwrapped.task_ids[0]})
    assert "Admissible commands:" in obs[1].content and "look" in obs[1].content
    assert "admissible_actions" not in info  # hints are only for scripted agents
    obs = env.step(hermes("inventory"))[0]
    assert "Admissible commands:" in obs[0].content
    plain = make(tw_root)
    plain.reset(seed=0)
    assert plain.unwrapped.admissible_actions() is None
    assert plain.unwrapped.request_infos().admissible_commands is False


def test_oracle_recovers_after_a_detour(tw_root):
    # Off the walkthrough, the oracle falls back to the engine's winning policy from the current state.
    env = make(tw_root, "medium", scripted_hints=True)
    base = env.unwrapped
    cooking = next(t for t in base.task_ids if base.task_type(t) == "cooking")
    obs, info = env.reset(seed=0, options={"task_id": cooking})
    detour = [a for a in info["admissible_actions"] if a.startswith("<") and '"go ' in a and a != info["oracle_action"]]
    assert detour, info["admissible_actions"]
    obs, _, _, _, info = env.step(detour[0])
    assert info["oracle_action"] is not None and not base._on_path
    for _ in range(SUITES["medium"].max_turns):
        obs, reward, terminated, truncated, info = env.step(info["oracle_action"])
        if terminated:
            break
    assert info["won"]


# ----- pure helpers -----------------------------------------------------------------------------
def test_clean_feedback_strips_interpreter_noise():
    raw = (
        "\n\n  ________  __\n |  \\$$$$ |  \\\n \\$$    \\$$\n\nDo the thing. Then win!\n\n-= Attic =-\n"
        "It is dusty.\n\n\n\nThere is an exit to the south.\n\n>" + " " * 60 + "-= Attic =-0/1"
    )
    assert clean_feedback(raw, "Do the thing. Then win!") == (
        "Do the thing. Then win!\n\n-= Attic =-\nIt is dusty.\n\nThere is an exit to the south."
    )
    end = (
        "\nYou take the coin.\n\n\n" + " " * 50 + "*** The End ***\n\nYou scored 1 out of a possible 1.\n\n\n"
        "Would you like to RESTART, RESTORE a saved game, QUIT or UNDO the last command?\n>    -= Attic =-0/4"
    )
    assert clean_feedback(end) == "You take the coin.\n\n*** The End ***\n\nYou scored 1 out of a possible 1."


def test_command_checks():
    assert normalize_command("  Go\tNORTH\x00 ") == "go north"
    assert check_command("take coin") is None
    assert check_command("") and check_command("q") and check_command("take coin then restore")
    assert check_command("y" * 201)
    assert check_command("quilt") is None and check_command("take tw-box") is None
    for escaped in ("\\help", "\\s", "\\t", "\\", "look \\_ restart", "go north\\"):
        assert "backslash" in check_command(normalize_command(escaped)), escaped


def test_a_hung_engine_ends_the_episode_as_truncated(tw_root, monkeypatch):
    # Let the interpreter command "\help" through the checks: Jericho then loops forever. The
    # step returns at the deadline, the episode is cut, and a reset plays on a fresh engine.
    env = make(tw_root, engine_deadline_s=2.0)
    base = env.unwrapped
    task_id = base.task_ids[0]
    env.reset(seed=0, options={"task_id": task_id})
    hung_pid = base._engine.pid
    monkeypatch.setattr(turngym.envs.textworld.env, "check_command", lambda cmd: None)
    obs, reward, terminated, truncated, info = env.step(hermes("\\help"))
    assert truncated and not terminated and reward == 0.0 and info["action_valid"] is False
    assert "deadline" in info["truncated_reason"] and "EngineTimeout" in obs[0].content
    obs, _, _, truncated, info = env.step(hermes("look"))  # the episode is over: nothing runs
    assert truncated and "episode is over" in obs[0].content and base._engine.pid is None
    monkeypatch.undo()
    env.reset(seed=0, options={"task_id": task_id})
    assert base._engine.pid not in (None, hung_pid) and base._engine.restarts == 1
    *_, steps = play(env, task_id, [hermes(c) for c in base.walkthrough(task_id)])
    assert steps[-1][4]["won"] and not any(s[3] for s in steps)


def test_the_engine_can_run_in_process(tw_root):
    env = make(tw_root, engine_deadline_s=None)
    task_id = env.unwrapped.task_ids[0]
    *_, steps = play(env, task_id, [hermes(c) for c in env.unwrapped.walkthrough(task_id)])
    assert steps[-1][4]["won"] and env.unwrapped._engine.restarts == 0
    with pytest.raises(ValueError, match="engine_deadline_s"):
        make(tw_root, engine_deadline_s=0)


def test_message_types(tw_root):
    env = make(tw_root)
    obs, _ = env.reset(seed=0)
    step_obs = env.step(hermes("look"))[0]
    assert all(isinstance(m, Message) for m in obs + step_obs)
    assert step_obs[0].role == "tool" and step_obs[0].name == "act"


def test_a_candidate_textworld_cannot_generate_is_skipped_and_recorded(monkeypatch):
    """Some seeds admit no quest: TextWorld raises QuestGenerationError on every try (medium test
    candidate 44, after about a minute of retries). Such a candidate is skipped, not fatal."""
    import textworld
    import textworld.challenges
    from textworld.generator import QuestGenerationError

    from turngym.envs.textworld.games import _make_game, get_suite

    def no_quest(settings, options):
        raise QuestGenerationError("no quest for this seed")

    challenges = dict(textworld.challenges.CHALLENGES)
    challenges["tw-treasure_hunter"] = (challenges["tw-treasure_hunter"][0], no_quest, *challenges["tw-treasure_hunter"][2:])
    monkeypatch.setattr(textworld.challenges, "CHALLENGES", challenges)
    suite = get_suite("medium")
    c = next(i for i in range(10) if suite.variants[i % len(suite.variants)].challenge == "tw-treasure_hunter")
    assert _make_game(textworld, suite, "medium", "test", c, set()) == {
        "skipped": c, "seed": 21_000_000 + c, "reason": "QuestGenerationError"}
