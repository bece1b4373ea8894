"""Async rollout and the streaming AsyncCollector: same episodes as sync mode, no barrier, bounded
staleness, policy versions recorded, errors surface in the trainer, close() never hangs."""

from __future__ import annotations

import itertools
import json
import threading
import time

import pytest
import torch
from test_rollout import BisectAgent, canon

from turngym.agents import OracleAgent
from turngym.agents.base import SamplingParams
from turngym.agents.hf import HFPolicy
from turngym.rollout import episode_specs, make_env_factory, rollout
from turngym.rollout.async_rollout import AsyncCollector, async_rollout
from turngym.types import Utterance

# Task 1's tool is slow, so in async mode other episodes finish out of spec order.
UNEVEN = make_env_factory("tests/SleepGuess-v0", sleep_s={"1": 0.06, "2": 0.01, "3": 0.03, "4": 0.0},
                          scripted_hints=True)


def wait_until(pred, timeout_s: float = 60.0) -> None:
    """Poll ``pred``; the deadline only turns a hang into a failure (it bounds no speed)."""
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not reached within {timeout_s} s (a hang, not a slow machine)")
        time.sleep(0.01)


@pytest.mark.parametrize("workers", [False, "thread", True])
@pytest.mark.parametrize("agent", [OracleAgent, BisectAgent])
def test_async_returns_every_spec_once_in_order_with_sync_results(workers, agent):
    specs = episode_specs(["1", "2", "3", "4", "3"], 9, seed=2)
    ref = [canon(t) for t in rollout(agent(), UNEVEN, specs, num_envs=3, progress=False)]
    got = async_rollout(agent(), UNEVEN, specs, num_envs=3, workers=workers, progress=False)
    assert [canon(t) for t in got] == ref
    piped = async_rollout(agent(), UNEVEN, specs, num_envs=3, workers=workers, max_batch=1, progress=False)
    assert [canon(t) for t in piped] == ref
    assert async_rollout(agent(), UNEVEN, [], progress=False) == []


def test_async_acts_on_ready_episodes_without_waiting_for_slow_steps():
    """Sync: every act call holds every live episode. Async: while task 1's 0.4 s step runs, the
    policy keeps acting for task 3 alone."""
    env = make_env_factory("tests/SleepGuess-v0", sleep_s={"1": 0.4, "3": 0.0})
    specs = episode_specs(["1", "3"], 2)  # bisection takes 3 turns on both (4, 2, 1 and 4, 2, 3)
    sync, asyn = BisectAgent(), BisectAgent()
    rollout(sync, env, specs, num_envs=2, progress=False)
    async_rollout(asyn, env, specs, num_envs=2, progress=False)
    assert sync.batches == [["1", "3"]] * 3
    assert asyn.batches == [["1", "3"], ["3"], ["3"], ["1"], ["1"]]


def test_max_batch_pipelines_episodes_of_equal_latency():
    """Equal 0.1 s steps keep 4 episodes in lock-step; max_batch=2 splits them into two groups that
    take turns: one generates while the other's tools run."""
    env = make_env_factory("tests/SleepGuess-v0", sleep_s=0.1)
    specs = episode_specs(["1", "3", "1", "3"], 4)
    lockstep, piped = BisectAgent(), BisectAgent()
    ref = [canon(t) for t in async_rollout(lockstep, env, specs, num_envs=4, progress=False)]
    got = [canon(t) for t in async_rollout(piped, env, specs, num_envs=4, max_batch=2, progress=False)]
    assert got == ref
    assert sum(map(len, lockstep.batches)) == sum(map(len, piped.batches)) == 12
    assert max(map(len, lockstep.batches)) > 2  # answers that arrive together are generated for together
    assert max(map(len, piped.batches)) == 2 and len(piped.batches) >= 6
    with pytest.raises(ValueError, match="max_batch"):
        async_rollout(piped, env, specs, max_batch=0, progress=False)


class Counting:
    """Oracle that counts act calls, checks it holds the weights lock, and can raise on call N."""

    env_kwargs = {"scripted_hints": True}

    def __init__(self, lock=None, fail_on: int | None = None, delay_s: float = 0.0):
        self.lock, self.fail_on, self.delay_s, self.calls = lock, fail_on, delay_s, 0
        self.unlocked_calls = 0

    def act(self, conversations, sampling=None):
        self.calls += 1
        if self.lock is not None and not self.lock.locked():
            self.unlocked_calls += 1
        if self.calls == self.fail_on:
            raise ValueError("policy broke on purpose")
        time.sleep(self.delay_s)
        return [Utterance(c.info["oracle_action"]) for c in conversations]


SPECS = episode_specs(["1", "2", "3", "4"], 4)
FAST = make_env_factory("tests/SleepGuess-v0", sleep_s=0.01, scripted_hints=True)


def test_collector_streams_versioned_trajectories_and_holds_the_lock_while_acting():
    lock = threading.Lock()
    policy = BisectAgent()
    seen = []
    with AsyncCollector(policy, FAST, itertools.cycle(SPECS), batch_size=3, max_staleness=1, num_envs=3,
                        lock=lock) as col:
        for v in range(1, 5):
            batch = col.get()
            assert len(batch) == 3
            for t in batch:  # what the trainer sees is never more than max_staleness behind
                assert col.version - t.metadata["policy_version"] <= 1
            seen += batch
            with col.weights_lock():
                assert lock.locked()
                col.set_version(v)
        stats = col.stats
    assert stats["consumed"] == 12 and stats["version"] == 4
    for t in seen:
        versions = [turn.info["policy_version"] for turn in t.turns]
        assert t.metadata["policy_versions"] == versions == sorted(versions)
        assert t.metadata["policy_version"] == min(versions)
        assert t.success
        json.dumps(t.to_dict())  # versions are plain ints: the trajectory still serialises
    assert len({t.metadata["policy_version"] for t in seen}) > 1  # later batches come from newer versions


def test_collector_acts_only_under_the_weights_lock_and_yields_to_the_trainer():
    lock = threading.Lock()
    policy = Counting(lock=lock, delay_s=0.01)
    with AsyncCollector(policy, FAST, itertools.cycle(SPECS), batch_size=2, max_staleness=3, num_envs=2,
                        lock=lock) as col:
        col.get()
        with col.weights_lock():
            before = policy.calls
            time.sleep(0.3)  # the producer has ready episodes, but must not generate now
            assert policy.calls == before
            col.set_version(1)
        col.get()  # may come straight from the queue, so wait for generation itself to resume
        wait_until(lambda: policy.calls > before)
    assert policy.unlocked_calls == 0


def test_producer_blocks_at_the_staleness_bound():
    """max_staleness=0, batch 2: at version 0 the producer starts exactly 2 episodes, then waits."""
    with AsyncCollector(OracleAgent(), FAST, itertools.cycle(SPECS), batch_size=2, max_staleness=0,
                        num_envs=4) as col:
        wait_until(lambda: col.stats["produced"] == 2)
        time.sleep(0.3)
        assert col.stats["started"] == 2 and col.stats["queued"] == 2
        assert [t.metadata["policy_version"] for t in col.get()] == [0, 0]
        time.sleep(0.2)
        assert col.stats["started"] == 2  # consuming is not enough: the weights must move on
        with col.weights_lock():
            col.set_version(1)
        batch = col.get()
        assert [t.metadata["policy_version"] for t in batch] == [1, 1]
        assert col.stats["started"] == 4


def test_stale_trajectories_are_dropped_and_replaced():
    with AsyncCollector(OracleAgent(), FAST, itertools.cycle(SPECS), batch_size=2, max_staleness=0,
                        num_envs=2) as col:
        wait_until(lambda: col.stats["produced"] == 2)
        with col.weights_lock():
            col.set_version(1)  # the two queued version-0 trajectories are now one version stale
        batch = col.get()
        assert [t.metadata["policy_version"] for t in batch] == [1, 1]
        assert col.stats["dropped_stale"] == 2
        # Version 1 admits 4 live episodes: 2 were started at set_version, 2 more replace the drops.
        wait_until(lambda: col.stats["started"] == 6)
        time.sleep(0.2)
        assert col.stats["started"] == 6


def test_get_times_out_without_losing_trajectories():
    with AsyncCollector(OracleAgent(), FAST, itertools.cycle(SPECS), batch_size=2, max_staleness=0,
                        num_envs=2) as col:
        with pytest.raises(TimeoutError, match="of 3"):
            col.get(3, timeout=0.5)  # only 2 can ever exist at version 0
        assert len(col.get(2)) == 2


def test_finite_specs_end_the_stream():
    with AsyncCollector(OracleAgent(), FAST, SPECS, batch_size=3, max_staleness=5, num_envs=2) as col:
        first, rest = col.get(), col.get()
    assert len(first) == 3 and len(rest) == 1
    assert sorted(t.task_id for t in first + rest) == ["1", "2", "3", "4"]


def test_producer_errors_are_raised_in_get():
    with AsyncCollector(Counting(fail_on=3), FAST, itertools.cycle(SPECS), batch_size=50, num_envs=2) as col:
        with pytest.raises(ValueError, match="broke on purpose"):
            col.get()
        with pytest.raises(ValueError, match="broke on purpose"):
            col.get(1)  # and keeps being raised


def test_bad_arguments_and_misuse_are_clear_errors():
    with pytest.raises(ValueError, match="max_staleness"):
        AsyncCollector(OracleAgent(), FAST, SPECS, max_staleness=-1)
    with pytest.raises(ValueError, match="batch_size"):
        AsyncCollector(OracleAgent(), FAST, SPECS, batch_size=0)
    col = AsyncCollector(OracleAgent(), FAST, SPECS)
    with pytest.raises(RuntimeError, match="start"):
        col.get()
    with col:
        with pytest.raises(ValueError, match="went back"):
            col.set_version(-1)
        with pytest.raises(RuntimeError, match="already started"):
            col.start()


@pytest.mark.parametrize("workers", [False, True])
def test_close_returns_promptly_even_with_a_hung_step_in_flight(workers):
    hang = make_env_factory("tests/SleepGuess-v0", hang_task="2", scripted_hints=True)
    col = AsyncCollector(OracleAgent(), hang, itertools.cycle(SPECS), batch_size=2, max_staleness=1,
                         num_envs=2, workers=workers, step_timeout_s=120).start()
    col.get(1)  # task 1 done; task 2's step now hangs in its env
    time.sleep(0.2)
    col.close(timeout_s=30)
    assert not col._thread.is_alive()  # it did not wait out the hour-long step
    col.close()  # idempotent


def test_collector_with_a_real_lm_records_tokens_and_versions(tiny_model):
    """The tiny Llama plays Guess through the collector while the 'trainer' changes its weights."""
    policy = HFPolicy(tiny_model.model, tiny_model.tokenizer)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=6, seed=0)
    env = make_env_factory("tests/SleepGuess-v0", sleep_s=0.02, max_turns=2)
    head = tiny_model.model.lm_head.weight
    saved = head.detach().clone()
    try:
        with AsyncCollector(policy, env, itertools.cycle(SPECS), batch_size=2, max_staleness=1, num_envs=2,
                            sampling=sampling) as col:
            batches = []
            for v in range(1, 3):
                batches.append(col.get())
                with col.weights_lock(), torch.no_grad():
                    head.add_(0.01)  # stands in for optimizer.step()
                    col.set_version(v)
            batches.append(col.get())
    finally:
        with torch.no_grad():
            head.copy_(saved)
    trajs = [t for b in batches for t in b]
    assert len(trajs) == 6
    for t in trajs:
        assert len(t.turns) == 2 and t.truncated  # the random model does not find the number in 2 turns
        for k, turn in enumerate(t.turns):
            assert t.prompt_ids(k) and len(t.action_ids(k)) == len(t.action_logprobs(k)) > 0
            assert isinstance(turn.info["policy_version"], int)
    assert max(t.metadata["policy_version"] for t in batches[-1]) >= 1
