import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import turngym
from turngym.envs import MessageSpace, UtteranceSpace
from turngym.types import Message


def test_user_env_registers_in_five_lines(tmp_path, monkeypatch):
    # What the README shows: a module of the user's own, registered by string entry point.
    (tmp_path / "my_envs.py").write_text(
        "import turngym\n"
        "from toy_envs import GuessEnv\n"
        "class MyGuess(GuessEnv):\n"
        '    """My own guessing game."""\n'
        'turngym.register("mine/MyGuess-v1", entry_point="my_envs:MyGuess", max_turns=3)\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import my_envs  # noqa: F401

    assert turngym.list_envs("mine") == {"mine/MyGuess-v1": "My own guessing game."}
    env = gym.make("mine/MyGuess-v1")  # plain Gymnasium finds it too
    obs, info = env.reset(seed=1)
    assert isinstance(obs[0], Message) and info["task_id"] in env.unwrapped.task_ids


def test_make_overrides_and_turn_limit_truncates():
    env = turngym.make("tests/Guess-v0", max_turns=2, n_tasks=2)
    assert env.unwrapped.task_ids == ["1", "2"]
    env.reset(seed=0, options={"task_id": "2"})
    *_, term, trunc, _ = env.step("<tool_call>{\"name\": \"guess\", \"arguments\": {\"number\": 1}}</tool_call>")
    assert (term, trunc) == (False, False)
    *_, term, trunc, _ = env.step("nonsense")
    assert (term, trunc) == (False, True)


def test_unknown_and_unversioned_ids_are_clear_errors():
    with pytest.raises(gym.error.Error, match="Guess"):
        turngym.make("tests/Gues-v0")
    with pytest.raises(gym.error.Error):
        turngym.make("tests/Guess-v7")


def test_spaces_are_type_checks():
    obs_space, act_space = MessageSpace(), UtteranceSpace()
    assert obs_space.contains([Message("user", "any text: é, ☕, {}")]) and not obs_space.contains(["str"])
    assert act_space.contains("<tool_call>{}</tool_call>") and not act_space.contains(3)
    assert obs_space.contains(obs_space.sample()) and act_space.contains(act_space.sample())


def test_gymnasium_env_checker_passes_on_toy_env():
    env = turngym.make("tests/Guess-v0")
    check_env(env.unwrapped, skip_render_check=False)


def test_unknown_task_id_is_a_clear_error():
    env = turngym.make("tests/Guess-v0")
    with pytest.raises(KeyError, match="not in this env's split"):
        env.reset(seed=0, options={"task_id": "99"})


def test_reset_is_deterministic_and_task_option_is_respected():
    env = turngym.make("tests/Guess-v0", n_tasks=8)
    a = [env.reset(seed=s)[1]["task_id"] for s in range(10)]
    b = [env.reset(seed=s)[1]["task_id"] for s in range(10)]
    assert a == b and len(set(a)) > 1
    assert env.reset(seed=0, options={"task_id": "5"})[1]["task_id"] == "5"


def test_step_before_reset_is_an_error():
    env = turngym.make("tests/Guess-v0")
    with pytest.raises(gym.error.ResetNeeded):
        env.step("x")


def test_ansi_render_shows_the_transcript():
    env = turngym.make("tests/Guess-v0", render_mode="ansi")
    env.reset(seed=0, options={"task_id": "3"})
    env.step('<tool_call>{"name": "guess", "arguments": {"number": 3}}</tool_call>')
    text = env.render()
    assert "[system] Find the number." in text and "[tool] correct!" in text
