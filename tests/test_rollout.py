import dataclasses
import functools
import os
import re
import signal
import threading
import time

import gymnasium as gym
import pytest
from toy_envs import GuessEnv

import turngym
from turngym.agents import OracleAgent, RandomAgent
from turngym.rollout import async_rollout, episode_specs, make_env_factory, rollout
from turngym.rollout.handles import EnvCrashed, LocalEnv, SubprocessEnv, make_handle
from turngym.types import Utterance

GUESS = make_env_factory("tests/Guess-v0", scripted_hints=True)


class SleepGuessEnv(GuessEnv):
    """GuessEnv whose tool waits like I/O (``sleep_s``, or ``{task: seconds}``) before answering.

    ``kill_task``: the tool SIGKILLs its own process on that task (use only in subprocess workers).
    ``hang_task``: the tool sleeps an hour on that task.
    """

    lock, running, peak = threading.Lock(), 0, 0

    def __init__(self, sleep_s: float | dict = 0.0, kill_task: str | None = None, hang_task: str | None = None, **kw):
        self.sleep_s, self.kill_task, self.hang_task = sleep_s, kill_task, hang_task
        super().__init__(**kw)

    def _build_tools(self):
        inner = super()._build_tools()[0]

        def slow_guess(**args):
            s = self.sleep_s.get(self.task_id, 0.0) if isinstance(self.sleep_s, dict) else self.sleep_s
            with SleepGuessEnv.lock:  # count tool calls in progress across in-process envs
                SleepGuessEnv.running += 1
                SleepGuessEnv.peak = max(SleepGuessEnv.peak, SleepGuessEnv.running)
            time.sleep(3600 if self.task_id == self.hang_task else s)
            with SleepGuessEnv.lock:
                SleepGuessEnv.running -= 1
            if self.task_id == self.kill_task:
                os.kill(os.getpid(), signal.SIGKILL)
            return inner.fn(**args)

        return [dataclasses.replace(inner, fn=slow_guess)]


turngym.register("tests/SleepGuess-v0", entry_point=SleepGuessEnv, max_turns=5)

GUESS_CALL = '<tool_call>{{"name": "guess", "arguments": {{"number": {}}}}}</tool_call>'


class BisectAgent:
    """Binary search on the Guess envs: its guess depends only on the conversation (deterministic,
    multi-turn, no hints), so any schedule of ``act`` calls gives the same episodes."""

    env_kwargs: dict = {}

    def __init__(self):
        self.batches: list[list[str]] = []  # the task ids of each act call, in order

    def act(self, conversations, sampling=None):
        self.batches.append([c.state.setdefault("task", c.info.get("task_id")) for c in conversations])
        return [Utterance(GUESS_CALL.format(self._next(c))) for c in conversations]

    @staticmethod
    def _next(conv) -> int:
        lo, hi, last = 1, 8, None
        for m in conv.messages:
            if m.role == "assistant":
                last = int(re.search(r'"number": (\d+)', m.content).group(1))
            elif m.role == "tool" and m.content == "higher":
                lo = last + 1
            elif m.role == "tool" and m.content == "lower":
                hi = last - 1
        return (lo + hi) // 2


def canon(traj) -> dict:
    """A trajectory as a dict without its wall-clock fields (they differ between any two runs)."""
    d = traj.to_dict()
    d["metadata"].pop("wall_s", None)
    for t in d["turns"]:
        t["info"].pop("elapsed_s", None)
    return d


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


# ----- the handle protocol and parallel steps ----------------------------------------------------
SLEEPY = make_env_factory("tests/SleepGuess-v0", sleep_s=0.02, scripted_hints=True)


@pytest.mark.parametrize("kind", ["local", "thread", "subprocess"])
def test_handle_protocol_send_recv_poll(kind):
    h = make_handle(kind, SLEEPY, 5.0)
    try:
        assert h.describe()["tools"][0].name == "guess"
        assert not h.poll()  # nothing sent yet
        h.send("reset", {"seed": 0, "options": {"task_id": "3"}})
        with pytest.raises(RuntimeError, match="pending"):
            h.send("step", "x")
        obs, info = h.recv()
        assert info["task_id"] == "3" and obs[0].content == "Find the number."
        h.send("step", GUESS_CALL.format(3))
        deadline = time.monotonic() + 5
        while not h.poll() and time.monotonic() < deadline:
            time.sleep(0.005)
        assert h.poll()
        obs, reward, term, trunc, info = h.recv()
        assert term and reward == 1.0 and not h.poll()
        with pytest.raises(RuntimeError, match="without a pending"):
            h.recv()
    finally:
        h.close()


def test_unknown_handle_kinds_are_clear_errors():
    with pytest.raises(ValueError, match="workers must be"):
        rollout(OracleAgent(), GUESS, episode_specs(["1"], 1), workers="cluster", progress=False)
    with pytest.raises(ValueError, match="unknown env handle kind"):
        make_handle("cluster", GUESS)


@pytest.mark.parametrize("agent", [lambda: RandomAgent(seed=4), BisectAgent])
def test_parallel_steps_give_the_sequential_trajectories(agent):
    """Inline local handles step one env after another (the old path); threads and subprocess
    workers step them all at once. The episodes must be identical, turn by turn."""
    specs = episode_specs(["1", "2", "3", "4"], 10, seed=3)
    factory = make_env_factory("tests/SleepGuess-v0", sleep_s=0.01, scripted_hints=True)
    ref = [canon(t) for t in rollout(agent(), factory, specs, num_envs=3, workers=False, progress=False)]
    assert sum(len(t["turns"]) for t in ref) > len(specs)  # multi-turn episodes
    for kind in ["thread", True]:
        got = rollout(agent(), factory, specs, num_envs=3, workers=kind, progress=False)
        assert [canon(t) for t in got] == ref


@pytest.mark.parametrize("kind, overlap", [("local", 1), ("thread", 4)])
def test_steps_run_one_at_a_time_inline_and_all_at_once_on_threads(kind, overlap):
    SleepGuessEnv.running = SleepGuessEnv.peak = 0
    factory = make_env_factory("tests/SleepGuess-v0", sleep_s=0.3, scripted_hints=True)
    trajs = rollout(OracleAgent(), factory, episode_specs(["1", "2", "3", "4"], 4), num_envs=4, workers=kind,
                 progress=False)
    assert all(t.success for t in trajs)
    assert SleepGuessEnv.peak == overlap  # tool calls in progress at the same moment


@pytest.mark.parametrize("play", [rollout, async_rollout], ids=["sync", "async"])
def test_worker_killed_mid_episode_truncates_exactly_that_episode(play):
    factory = make_env_factory("tests/SleepGuess-v0", sleep_s=0.01, kill_task="3", scripted_hints=True)
    specs = episode_specs(["1", "2", "3", "4"], 8)
    trajs = play(OracleAgent(), factory, specs, num_envs=3, workers=True, progress=False)
    assert [t.task_id for t in trajs] == [s.task_id for s in specs]
    for t in trajs:
        if t.task_id == "3":
            assert t.truncated and not t.terminated and len(t.turns) == 1
            assert "died" in t.metadata["error"] and "exit code -9" in t.metadata["error"]
            assert t.turns[0].info["error"] == t.metadata["error"]
        else:
            assert t.success and t.terminated and "error" not in t.metadata


@pytest.mark.parametrize("play", [rollout, async_rollout], ids=["sync", "async"])
@pytest.mark.parametrize("kind", ["thread", "subprocess"])
def test_hung_step_past_the_timeout_truncates_and_the_run_goes_on(play, kind):
    factory = make_env_factory("tests/SleepGuess-v0", hang_task="2", scripted_hints=True)
    specs = episode_specs(["1", "2", "3"], 3)
    trajs = play(OracleAgent(), factory, specs, num_envs=3, workers=kind, step_timeout_s=0.5,
                 progress=False)
    assert [t.success for t in trajs] == [True, False, True]
    assert trajs[1].truncated and "within 0.5s" in trajs[1].metadata["error"]


def test_thread_handle_abandons_a_hung_call_and_rebuilds_its_env():
    h = LocalEnv(make_env_factory("tests/SleepGuess-v0", hang_task="2"), timeout_s=0.3, threaded=True)
    first = h.env
    h.reset(seed=0, options={"task_id": "2"})
    with pytest.raises(EnvCrashed, match="within 0.3s"):
        h.step(GUESS_CALL.format(2))
    assert h.env is not first and h.restarts == 1
    h.reset(seed=0, options={"task_id": "1"})
    assert h.step(GUESS_CALL.format(1))[2]


def test_each_turn_records_the_state_its_action_was_taken_from():
    factory = make_env_factory("turngym/Maze-v0", scripted_hints=True)
    trajs = rollout(RandomAgent(seed=1), factory, episode_specs(factory().unwrapped.task_ids[:2], 2), progress=False)
    for t in trajs:
        before = [t.metadata["initial_state_key"]] + [turn.info["state_key"] for turn in t.turns[:-1]]
        assert [turn.info["anchor_state_key"] for turn in t.turns] == before and len(t.turns) > 1


class _CountedGuess(GuessEnv):
    built = 0

    def __init__(self, **kw):
        super().__init__(**kw)
        type(self).built += 1


def _counted_guess(n_tasks: int):
    return gym.wrappers.TimeLimit(_CountedGuess(n_tasks=n_tasks), max_episode_steps=12)


def test_env_pools_keep_envs_open_across_rollouts_and_give_the_same_episodes():
    from turngym.rollout import EnvPools

    factory = functools.partial(_counted_guess, 4)
    _CountedGuess.built = 0
    specs = episode_specs(["1", "2", "3", "4"], 6, seed=3)
    fresh = [rollout(RandomAgent(seed=2), factory, specs, num_envs=3, progress=False) for _ in range(2)]
    assert _CountedGuess.built == 6  # without pools: 3 new envs per rollout
    _CountedGuess.built = 0
    with EnvPools() as pools:
        kept = [rollout(RandomAgent(seed=2), factory, specs, num_envs=3, progress=False, pools=pools) for _ in range(2)]
        assert _CountedGuess.built == 3 and len(pools) == 3  # opened once, played twice
        rollout(RandomAgent(seed=2), factory, specs[:2], num_envs=3, progress=False, pools=pools)
        rollout(RandomAgent(seed=2), functools.partial(_counted_guess, 4), specs, num_envs=4,
                progress=False, pools=pools)  # an equal factory: the same pool, grown by one
        assert _CountedGuess.built == 4 and len(pools) == 4
        rollout(RandomAgent(seed=2), functools.partial(_counted_guess, 5), specs[:1], num_envs=1,
                progress=False, pools=pools)  # another env: a pool of its own
        assert len(pools) == 5
    assert len(pools) == 0
    for a, b in zip(fresh, kept):
        assert [[t.action_text for t in tr.turns] for tr in a] == [[t.action_text for t in tr.turns] for tr in b]
        assert [tr.outcome for tr in a] == [tr.outcome for tr in b]


def test_a_rollout_that_fails_drops_its_pool():
    from turngym.rollout import EnvPools

    class Broken(RandomAgent):
        def act(self, convs, sampling=None):
            raise RuntimeError("policy failed")

    factory = functools.partial(_counted_guess, 4)
    with EnvPools() as pools:
        rollout(RandomAgent(seed=2), factory, episode_specs(["1"], 2), num_envs=2, progress=False, pools=pools)
        with pytest.raises(RuntimeError, match="policy failed"):
            rollout(Broken(seed=2), factory, episode_specs(["1"], 2), num_envs=2, progress=False, pools=pools)
        assert len(pools) == 0  # its handles may hold a call in flight: closed, reopened on the next use


@pytest.mark.parametrize("kind", ["local", "thread", True])
def test_step_time_is_recorded_by_the_rollout_not_in_the_envs_info(kind):
    """The env's info holds no clock (equal seeds and actions give equal infos, as Gymnasium's
    check_env demands); the handle the env runs in times each step into ``Turn.info["elapsed_s"]``."""
    env = turngym.make("tests/SleepGuess-v0", sleep_s=0.05)
    _, info = env.reset(seed=0, options={"task_id": "2"})
    step_info = env.step('<tool_call>{"name": "guess", "arguments": {"number": 1}}</tool_call>')[-1]
    assert "elapsed_s" not in info and "elapsed_s" not in step_info
    factory = make_env_factory("tests/SleepGuess-v0", sleep_s=0.05, scripted_hints=True)
    (traj,) = rollout(OracleAgent(), factory, episode_specs(["2"], 1), workers=kind, progress=False)
    assert traj.turns[0].info["elapsed_s"] >= 0.05  # the tool's sleep is inside the timed step
