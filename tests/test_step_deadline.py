"""A deadline on every step of every env: the registry wraps each env in ``StepDeadline``; a step
that runs past it returns at once as truncated, with the reason, and the env is rebuilt."""

from __future__ import annotations

import json
import threading

import gymnasium as gym
import pytest

import turngym
from turngym.envs.deadline import StepDeadline
from turngym.envs.registry import DeadlineEntry

GUESS = '<tool_call>{{"name": "guess", "arguments": {{"number": {}}}}}</tool_call>'


def deadline_wrapper(env) -> StepDeadline:
    found = []
    while isinstance(env, gym.Wrapper):
        if isinstance(env, StepDeadline):
            found.append(env)
        env = env.env
    assert len(found) == 1, found
    return found[0]


def test_every_registered_env_is_behind_a_step_deadline():
    import turngym.envs.wrappers  # noqa: F401  (registers the shaped variants)

    ids = list(turngym.list_envs())
    assert len(ids) > 20
    for env_id in ids:
        assert isinstance(gym.spec(env_id).entry_point, DeadlineEntry), env_id


@pytest.mark.parametrize("env_id, kw", [
    ("tests/Guess-v0", {}), ("turngym/Maze-v0", {}), ("turngym/SQL-synthetic-v1", {}),
    ("turngym/SQL-synthetic-shaped-v1", {}), ("turngym/Search-synthetic-v0", {}),
    ("turngym/SWE-synthetic-v0", {"sandbox": "local", "pool_size": 0}),
])
@pytest.mark.filterwarnings("ignore::turngym.tools.sandbox.local_backend.UnsafeSandboxWarning")
def test_each_family_is_made_with_one_deadline_wrapper(env_id, kw):
    import turngym.envs.wrappers  # noqa: F401

    env = turngym.make(env_id, **kw)
    try:
        assert deadline_wrapper(env).step_deadline_s > 0
    finally:
        env.close()


def test_a_step_past_its_deadline_is_truncated_and_the_env_restarted():
    env = turngym.make("tests/Guess-v0", hang_on=3)  # guessing 3 sleeps for an hour
    wrapper = deadline_wrapper(env)
    wrapper.deadline_s = 0.5
    old = env.unwrapped
    env.reset(seed=0, options={"task_id": "2"})
    obs, reward, term, trunc, info = env.step(GUESS.format(3))  # returns although the step still sleeps
    assert trunc and not term and reward == 0.0
    assert "deadline" in info["truncated_reason"] and "deadline" in obs[0].content
    json.dumps(info)
    assert env.unwrapped is not old and wrapper.restarts == 1
    assert env.unwrapped.spec is not None and env.unwrapped.spec.id == "tests/Guess-v0"
    env.reset(seed=0, options={"task_id": "2"})  # the fresh env plays on
    _, reward, term, *_ = env.step(GUESS.format(2))
    assert term and reward == 1.0
    env.close()


def test_steps_run_on_one_thread_per_env_and_errors_still_raise():
    env = turngym.make("tests/Guess-v0", raise_on=5)
    seen = []
    base = env.unwrapped
    real = base._step_outcome

    def spy(parsed, results):
        seen.append(threading.current_thread())
        return real(parsed, results)

    base._step_outcome = spy
    env.reset(seed=0, options={"task_id": "2"})
    env.step(GUESS.format(1))
    env.step(GUESS.format(4))
    assert len(set(seen)) == 1 and seen[0] is not threading.current_thread()
    with pytest.raises(RuntimeError, match="env bug"):  # an env's own bug is the caller's, as before
        env.step(GUESS.format(5))
    env.close()


def test_the_deadline_comes_from_the_env_or_its_tools():
    from turngym.envs.deadline import DEFAULT_STEP_DEADLINE_S
    from turngym.tools.formats import MAX_CALLS_PER_ACTION

    env = turngym.make("tests/Guess-v0")
    assert deadline_wrapper(env).step_deadline_s == DEFAULT_STEP_DEADLINE_S  # its tool has no timeout
    env.unwrapped.step_deadline_s = 7.0
    assert deadline_wrapper(env).step_deadline_s == 7.0
    search = turngym.make("turngym/Search-synthetic-v0")  # search and open: 30 s each
    assert deadline_wrapper(search).step_deadline_s == DEFAULT_STEP_DEADLINE_S + MAX_CALLS_PER_ACTION * 30.0


def test_a_second_close_returns_at_once_and_closes_the_env_once():
    env = turngym.make("turngym/Maze-v0")
    base, closes = env.unwrapped, []
    real = base.close
    base.close = lambda: (closes.append(threading.current_thread()), real())[1]
    env.reset(seed=0)
    wrapper, submitted = deadline_wrapper(env), []
    submit = wrapper._worker.submit
    wrapper._worker.submit = lambda fn: (submitted.append(fn), submit(fn))[1]
    env.close()
    env.close()  # Gymnasium's env checker closes an env twice
    # one call handed to the worker: a second would wait out the close wait on a worker that had stopped
    assert len(submitted) == 1
    assert len(closes) == 1 and closes[0] is not threading.current_thread()
