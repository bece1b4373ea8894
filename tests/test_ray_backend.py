"""The Ray backend on a local 2-CPU Ray: env actors (crash, kill, hang), rollout workers, weight sync.

One ``ray.init`` is shared by the module (it takes several seconds). Workers find ``toy_envs`` (and
this module, for the tiny-policy factory) through ``PYTHONPATH`` set in the runtime env.
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason='Ray is not installed (pip install "turngym[ray]")')

from turngym.agents import make_agent  # noqa: E402
from turngym.agents.base import SamplingParams  # noqa: E402
from turngym.rollout import episode_specs, make_env_factory, rollout  # noqa: E402
from turngym.rollout.handles import EnvCrashed, describe_env  # noqa: E402
from turngym.rollout.ray_env import RayEnv  # noqa: E402
from turngym.rollout.ray_pool import RayRolloutPool, ray_rollout, shard_contiguous  # noqa: E402
from turngym.types import ToolCall  # noqa: E402

TESTS = Path(__file__).resolve().parent
GUESS = "toy_envs:tests/Guess-v0"  # "module:id": the actor imports toy_envs, which registers the env


@pytest.fixture(scope="module")
def ray_local():
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield ray
    ray.shutdown()


def _guess(env, n: int) -> str:
    return env.unwrapped.format.render_call(ToolCall("c", "guess", {"number": n}))


def _strip_times(x):
    """Drop wall-clock fields, which differ between any two runs."""
    if isinstance(x, dict):
        return {k: _strip_times(v) for k, v in x.items() if k not in ("elapsed_s", "wall_s")}
    if isinstance(x, (list, tuple)):
        return [_strip_times(v) for v in x]
    return x


def test_shard_contiguous_covers_in_order():
    items = list(range(11))
    parts = shard_contiguous(items, 4)
    assert [len(p) for p in parts] == [3, 3, 3, 2]
    assert sum(parts, []) == items
    assert shard_contiguous([1], 3) == [[1]]


def test_ray_env_matches_local_env(ray_local):
    make = make_env_factory(GUESS, scripted_hints=True)
    local, remote = make(), RayEnv(make, timeout_s=30)
    try:
        assert remote.describe() == describe_env(local)
        for seed, task in [(0, "3"), (5, "1")]:
            obs_l, info_l = local.reset(seed=seed, options={"task_id": task})
            obs_r, info_r = remote.reset(seed=seed, options={"task_id": task})
            assert obs_r == obs_l and _strip_times(info_r) == _strip_times(info_l)
            for n in (2, int(task)):
                out_l = local.step(_guess(local, n))
                remote.send("step", _guess(local, n))  # the non-blocking path
                deadline = time.monotonic() + 30
                while not remote.poll() and time.monotonic() < deadline:
                    time.sleep(0.01)
                out_r = remote.recv()
                assert _strip_times(list(out_r)) == _strip_times(list(out_l))
        assert out_r[2] is True and out_r[1] == 1.0  # the last step solved the task
    finally:
        remote.close()
        local.close()


def _wait_until_dead(actor, limit_s: float = 30.0) -> None:
    """Block until a killed actor refuses calls.

    ``ray.kill`` only asks the cluster to kill the actor; a call sent right after it can still reach
    the live actor and succeed, so the test waits for the death it means to exercise.
    """
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.ping.remote(), timeout=5)
        except ray.exceptions.RayActorError:
            return
        except ray.exceptions.GetTimeoutError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"the killed actor still answered after {limit_s:g}s")


def test_killed_actor_raises_env_crashed_then_recovers(ray_local):
    make = make_env_factory(GUESS)
    env, probe = RayEnv(make, timeout_s=30), make()
    try:
        env.reset(seed=0, options={"task_id": "2"})
        ray.kill(env.actor)  # the actor dies mid-episode
        _wait_until_dead(env.actor)
        with pytest.raises(EnvCrashed, match="died"):
            env.step(_guess(probe, 1))
        assert env.restarts == 1
        env.reset(seed=0, options={"task_id": "2"})
        _, reward, terminated, _, _ = env.step(_guess(probe, 2))
        assert terminated and reward == 1.0
    finally:
        env.close()
        probe.close()


def test_hang_and_env_error_raise_env_crashed(ray_local):
    make = make_env_factory(GUESS, hang_on=7, raise_on=5)
    env, probe = RayEnv(make, timeout_s=2), make_env_factory(GUESS)()
    try:
        env.reset(seed=0, options={"task_id": "3"})
        with pytest.raises(EnvCrashed, match="env raised"):
            env.step(_guess(probe, 5))
        env.reset(seed=0, options={"task_id": "3"})
        with pytest.raises(EnvCrashed, match="did not answer 'step' within 2s"):
            env.step(_guess(probe, 7))  # it gave up on the hung step rather than waiting for it
        assert env.restarts == 2
        obs, _ = env.reset(seed=0, options={"task_id": "3"})
        assert obs[-1].content == "Guess a number from 1 to 8."
        assert env.step(_guess(probe, 3))[2] is True
    finally:
        env.close()
        probe.close()


def test_ray_rollout_oracle_matches_local_rollout(ray_local):
    specs = episode_specs(["1", "2", "3", "4"], 10, seed=3)
    trajs = ray_rollout("oracle", GUESS, specs, env_kwargs={"scripted_hints": True}, num_workers=2,
                        num_envs=3, num_cpus_per_worker=0.5, rollout_kwargs={"workers": "thread"})
    local = rollout(make_agent("oracle"), make_env_factory(GUESS, scripted_hints=True), specs, num_envs=3,
                    progress=False, metadata={"policy_version": 0})
    assert [t.task_id for t in trajs] == [s.task_id for s in specs]
    assert [t.metadata["seed"] for t in trajs] == [s.seed for s in specs]
    assert all(t.success for t in trajs)
    assert [_strip_times(t.to_dict()) for t in trajs] == [_strip_times(t.to_dict()) for t in local]


def _tiny_policy(seed: int):
    """A picklable policy factory for the workers: the unit-test tiny Llama in an HFPolicy."""
    from fixtures_model import build_tiny_model

    from turngym.agents.default_model import load_default_tokenizer
    from turngym.agents.hf import HFPolicy

    tok = load_default_tokenizer()
    return HFPolicy(build_tiny_model(tok, seed=seed), tok)


def test_pool_set_weights_changes_outputs_and_version(ray_local, tiny_tokenizer):
    from fixtures_model import build_tiny_model

    specs = episode_specs(["1", "2"], 2)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
    new = build_tiny_model(tiny_tokenizer, seed=1)
    with RayRolloutPool(functools.partial(_tiny_policy, 0), GUESS, env_kwargs={"max_turns": 2}, num_workers=1,
                        num_envs=2, num_cpus_per_worker=0.5) as pool:
        before = pool.run(specs, greedy)
        assert pool.set_weights(new.state_dict(), version=7) == 7
        after = pool.run(specs, greedy)
    ids = lambda trajs: [tr.record.ids for tr in trajs]  # noqa: E731
    assert [t.metadata["policy_version"] for t in before + after] == [0, 0, 7, 7]
    assert all(tr.turns and tr.action_ids(0) for tr in before + after)
    assert ids(before) != ids(after)
    from turngym.agents.hf import HFPolicy

    local = rollout(HFPolicy(new, tiny_tokenizer), make_env_factory(GUESS, max_turns=2), specs, sampling=greedy,
                    num_envs=2, progress=False)
    assert ids(after) == ids(local)  # the worker now acts exactly as the new weights do here


def test_rollout_with_ray_env_workers_marks_crashed_episode_truncated(ray_local):
    specs = episode_specs(["1", "2", "3"], 3)
    trajs = rollout(make_agent("oracle"), make_env_factory(GUESS, scripted_hints=True, crash_on=2), specs,
                    num_envs=2, workers="ray", step_timeout_s=30, progress=False)
    assert [t.task_id for t in trajs] == ["1", "2", "3"]
    assert [t.success for t in trajs] == [True, False, True]
    assert trajs[1].truncated and "died" in trajs[1].metadata["error"]  # SystemExit killed its actor
