import pytest

from turngym.agents import OracleAgent, RandomAgent
from turngym.trainers.rollout import episode_specs, make_env_factory, rollout
from turngym.trainers.workers import EnvCrashed, SubprocessEnv
from turngym.types import Utterance

GUESS = make_env_factory("tests/Guess-v0", scripted_hints=True)


class Fixed:
    """Plays a fixed guess; used to drive envs into crash or hang states."""

    env_kwargs: dict = {}

    def __init__(self, number):
        self.number = number

    def act(self, conversations, sampling=None):
        return [Utterance(f'<tool_call>{{"name": "guess", "arguments": {{"number": {self.number}}}}}</tool_call>')
                for _ in conversations]


@pytest.mark.parametrize("workers", [False, True])
def test_oracle_solves_everything_and_results_keep_order(workers):
    specs = episode_specs(["1", "2", "3", "4"], 10)
    trajs = rollout(OracleAgent(), GUESS, specs, num_envs=3, workers=workers, progress=False)
    assert [t.task_id for t in trajs] == [s.task_id for s in specs]
    assert all(t.success and t.terminated and not t.truncated for t in trajs)
    assert trajs[0].turns[0].tool_calls[0].name == "guess"
    assert trajs[0].initial_observation[0].content == "Find the number."


def test_random_agent_is_worse_than_oracle_and_truncates():
    trajs = rollout(RandomAgent(seed=1), GUESS, episode_specs(["1", "2", "3", "4"], 40), progress=False)
    rate = sum(t.success for t in trajs) / len(trajs)
    assert rate < 0.9 and any(t.truncated for t in trajs)


def test_group_specs_replay_the_same_task_and_seed():
    specs = episode_specs(["a", "b"], 2, seed=5, group_size=3)
    assert [(s.task_id, s.seed) for s in specs] == [("a", 5)] * 3 + [("b", 6)] * 3


def test_crashed_worker_is_restarted_and_episode_marked_truncated():
    factory = make_env_factory("tests/Guess-v0", crash_on=2)
    trajs = rollout(Fixed(2), factory, episode_specs(["3", "4"], 3), workers=True, num_envs=2, progress=False)
    assert len(trajs) == 3
    assert all(t.truncated and not t.terminated and "died" in t.metadata["error"] for t in trajs)


def test_hung_worker_times_out_and_the_next_episode_still_runs():
    factory = make_env_factory("tests/Guess-v0", hang_on=1)
    h = SubprocessEnv(factory, timeout_s=1.0)
    try:
        h.reset(seed=0, options={"task_id": "2"})
        first_pid = h.pid
        with pytest.raises(EnvCrashed, match="within 1s"):
            h.step('<tool_call>{"name": "guess", "arguments": {"number": 1}}</tool_call>')
        assert h.restarts == 1 and h.pid != first_pid
        h.reset(seed=0, options={"task_id": "2"})
        obs, reward, term, trunc, info = h.step('<tool_call>{"name": "guess", "arguments": {"number": 2}}</tool_call>')
        assert term and reward == 1.0
    finally:
        h.close()


def test_local_env_exception_truncates_instead_of_crashing_the_run():
    factory = make_env_factory("tests/Guess-v0", raise_on=2)
    trajs = rollout(Fixed(2), factory, episode_specs(["3", "4"], 2), workers=False, progress=False)
    assert all(t.truncated and "RuntimeError: env bug" in t.metadata["error"] for t in trajs)
    # the rebuilt env still plays
    assert rollout(Fixed(3), factory, episode_specs(["3"], 1), progress=False)[0].success
