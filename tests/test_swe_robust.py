"""The SWE env under sandbox data it cannot trust: whatever the sandbox answers, a step returns
(an error observation, or a truncated episode with its reason); a repo of too many files costs one
clear observation; and the visible-test signal comes from the grader, not from anything the
agent's code prints. Local always; Docker and bwrap skip with the reason when they cannot run."""

from __future__ import annotations


import pytest

import turngym
from test_sandbox import skip_reason
from turngym.tools.sandbox import SandboxError
from turngym.tools.sandbox.base import RawResult
from turngym.types import ToolCall

pytestmark = pytest.mark.filterwarnings("ignore::turngym.tools.sandbox.local_backend.UnsafeSandboxWarning")

TASK = "synthetic-test-002"
BACKENDS = ["local", pytest.param("docker", marks=pytest.mark.docker), "bwrap"]


def env_on(backend: str, **kw):
    if backend != "local" and skip_reason(backend):
        pytest.skip(skip_reason(backend))
    return turngym.make("turngym/SWE-synthetic-v0", split="test", sandbox=backend, pool_size=1, **kw)


def call(env, name, **args):
    return env.unwrapped.format.render_call(ToolCall("c", name, args))


# What reading the sandbox's state can meet: each backend's failure, what a forged answer made
# main's code raise (a JSON list read as a dict), and answers that are not what the command prints.
FAILURES = {
    "the engine failed": SandboxError("docker exec failed: 500 Server Error"),
    "a JSON list read as a dict": TypeError("list indices must be integers or slices, not str"),
    "a channel that closed": EOFError("the sandbox supervisor exited"),
    "a socket error": ConnectionResetError(104, "Connection reset by peer"),
    "a malformed answer": RawResult(125, b"", b"[the sandbox's answer was malformed (a JSON list)]"),
    "output no command printed": RawResult(0, b"A" * 5000, b"", stdout_total=2**40),
    "a digest one character short": RawResult(0, b"0123456789abcdef0123456789abcdef0123456\n", b""),
}


@pytest.mark.parametrize("failure", list(FAILURES))
def test_a_step_never_raises_on_sandbox_data(failure, monkeypatch):
    env = env_on("local")
    try:
        env.reset(seed=0, options={"task_id": TASK})
        box = env.unwrapped._sb

        def broken(*args, **kwargs):
            if isinstance(FAILURES[failure], BaseException):
                raise FAILURES[failure]
            return FAILURES[failure]

        monkeypatch.setattr(box, "_run", broken)
        obs, reward, terminated, truncated, info = env.step(call(env, "bash", command="echo hi"))
        assert truncated and not terminated and reward == 0.0, obs
        assert "could not be read" in info["truncated_reason"] and "episode ends" in obs[-1].content
        assert env.unwrapped._sb is None and box.closed  # the sandbox is gone; the next reset starts a fresh one
        env.reset(seed=0, options={"task_id": TASK})
        obs, _, _, truncated, info = env.step(call(env, "bash", command="echo hi"))
        assert not truncated and "hi" in obs[0].content and not info["file_modified"]
    finally:
        env.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_repo_of_too_many_files_is_one_clear_observation(backend, monkeypatch):
    import turngym.envs.swe.env as swe_env

    monkeypatch.setattr(swe_env, "MAX_REPO_ENTRIES", 2000, raising=False)  # the walk's cap, scaled down with the file count
    env = env_on(backend)
    try:
        env.reset(seed=0, options={"task_id": TASK})
        obs, _, _, truncated, info = env.step(call(env, "bash", command="mkdir many && cd many && seq 1 3000 | xargs touch"))
        assert not truncated and "more than 2,000 files" in obs[-1].content, obs
        assert info["file_modified"] and info["modified"]
        obs, _, _, truncated, info = env.step(call(env, "bash", command="ls | head -3"))
        assert not truncated and "more than 2,000 files" in obs[-1].content
        obs, _, _, _, info = env.step(call(env, "bash", command="rm -rf many"))
        assert not info["modified"] and "files" not in obs[-1].content  # the digest is back to the original
    finally:
        env.close()


# ----- the visible-test signal ---------------------------------------------------------------------
ATEXIT = "\nimport atexit as _a\n_a.register(lambda: print('99 passed'))\n"
CONFTEST = '''
import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
    report.longrepr = None
'''


def _signal(env, **calls) -> float:
    for cmd in calls.get("bash", []):
        env.step(call(env, "bash", command=cmd))
    obs, _, _, _, info = env.step(call(env, "run_tests"))
    return info["visible_tests_passed"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_visible_test_signal_comes_from_the_grader(backend):
    env = env_on(backend)
    try:
        env.reset(seed=0, options={"task_id": TASK})
        task = env.unwrapped._task
        code = task.gold_edits[0].path
        honest = _signal(env)
        assert 0.0 <= honest < 1.0  # the bug fails the statement's example, which the agent was shown
        forged_atexit = _signal(env, bash=[f"cat >> {code} <<'EOF'\n{ATEXIT}\nEOF"])
        forged_hook = _signal(env, bash=[f"cat > conftest.py <<'EOF'\n{CONFTEST}\nEOF",
                                         "mkdir -p tests && cp conftest.py tests/conftest.py"])
        assert forged_atexit == forged_hook == honest, (honest, forged_atexit, forged_hook)
        env.reset(seed=0, options={"task_id": TASK})
        for e in task.gold_edits:
            env.step(call(env, "edit_file", path=e.path, old_str=e.old, new_str=e.new))
        assert _signal(env) == 1.0  # the fix passes every case it was shown
    finally:
        env.close()
