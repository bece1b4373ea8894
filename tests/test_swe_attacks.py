"""SWE attacks inside real sandboxes (Docker and bubblewrap): the agent cannot read the hidden
tests, cannot mine git history for the fix, cannot game the grader (planted plugins, a
background process that rewrites the grading files), and the oracle still solves its tasks.
The reward-hacking suite at the end runs one payload per class (``swe_attack_payloads.py``) on
Docker, bubblewrap and local grading. Skips with the reason when a backend cannot run here."""

from __future__ import annotations

import pytest

import swe_attack_payloads as P
import turngym
from test_sandbox import skip_reason
from test_swe import call, check_cheats_fail

pytestmark = pytest.mark.filterwarnings("ignore::turngym.tools.sandbox.local_backend.UnsafeSandboxWarning")

TASK = "synthetic-test-002"


@pytest.fixture(scope="module", params=[pytest.param("docker", marks=pytest.mark.docker), "bwrap"])
def env(request):
    reason = skip_reason(request.param)
    if reason:
        pytest.skip(reason)
    e = turngym.make("turngym/SWE-synthetic-v0", split="test", sandbox=request.param, scripted_hints=True,
                     pool_size=1)
    yield e
    e.close()


def test_hidden_tests_are_nowhere_in_the_sandbox(env):
    env.reset(seed=0, options={"task_id": TASK})
    task = env.unwrapped._task
    (hidden_path,) = task.hidden_tests
    marker = hidden_path.rsplit("/", 1)[-1]  # the hidden file's name appears in no repo file
    assert not any(marker in text for text in task.files.values())
    env.step(call(env, "run_tests"))  # running the visible tests does not bring them in either
    cmd = (f"find / -xdev -name '*hidden*' 2>/dev/null; "
           f"grep -rIl --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev '{marker}' / 2>/dev/null; echo searched")
    obs, *_ = env.step(call(env, "bash", command=cmd))
    out = obs[0].content
    assert out.rstrip().endswith("searched"), out
    assert marker not in out and "hidden" not in out.replace("hidden tests", "")


def test_no_git_history_to_mine(env):
    env.reset(seed=0, options={"task_id": TASK})
    obs, *_ = env.step(call(env, "bash", command="git log --all -p"))
    assert "not a git repository" in obs[0].content
    obs, *_ = env.step(call(env, "bash", command="find / -xdev \\( -name .git -o -name '*.orig' -o -name '*.rej' "
                                                  "-o -name '*.patch' \\) -print 2>/dev/null | grep -v '^/usr' ; echo end"))
    assert obs[0].content.split("\n", 1)[1].strip() == "end", obs[0].content


def test_planted_cheats_do_not_pass_the_grader(env):
    check_cheats_fail(env)


TAMPER = """while :; do for d in /tmp/grade.*; do if [ -d "$d" ]; then mkdir -p "$d/tests"
printf 'def test_x():\\n    pass\\n' > "$d/HIDDEN"; fi; done; done
"""


def launch_tamperer(env, hidden_path):
    """A setsid'd loop (outside every process group the exec kills) that keeps overwriting the
    hidden tests in any grading dir with a test that passes."""
    env.unwrapped._sb.write_file("/tmp/tamper.sh", TAMPER.replace("HIDDEN", hidden_path))
    obs, *_ = env.step(call(env, "bash", command="setsid nohup sh /tmp/tamper.sh >/dev/null 2>&1 & sleep 0.5; echo launched"))
    assert obs[0].content == "[exit code 0]\nlaunched", obs[0].content
    obs, *_ = env.step(call(env, "bash", command="ps -eo args"))
    assert "sh /tmp/tamper.sh" in obs[0].content  # it outlived the command that started it


def test_background_tamperer_is_killed_before_grading(env):
    env.reset(seed=0, options={"task_id": TASK})
    (hidden_path,) = env.unwrapped._task.hidden_tests
    launch_tamperer(env, hidden_path)
    _, reward, term, _, info = env.step(call(env, "submit"))
    assert term and reward == 0.0 and not info["won"]


def test_oracle_solves_in_the_sandbox(env):
    for tid in ("synthetic-test-000", "synthetic-test-005"):
        _, info = env.reset(seed=0, options={"task_id": tid})
        for _ in range(10):
            _, reward, term, _, info = env.step(info["oracle_action"])
            if term:
                break
        assert term and reward == 1.0 and info["won"] and info["modified"]


# ----- the reward-hacking suite: one case per class, on every backend -------------------------
# Each payload (tests/swe_attack_payloads.py) is run with the bash tool on an unfixed repo, then
# the agent submits. Every one must score 0; the oracle must still score 1.
BACKENDS = [pytest.param("docker", marks=pytest.mark.docker), "bwrap", "local"]
ATTACKS = {**P.FRAMEWORK, **P.PLANTED, "daemon": P.DAEMON, "ptrace_pid1": P.PTRACE_PID1}


@pytest.fixture(scope="module", params=BACKENDS)
def any_env(request):
    if request.param != "local":
        reason = skip_reason(request.param)
        if reason:
            pytest.skip(reason)
    e = turngym.make("turngym/SWE-synthetic-v0", split="test", sandbox=request.param, scripted_hints=True,
                     pool_size=1)
    yield e
    e.close()


def code_file(task) -> str:
    return next(p for p in task.source_files if p.endswith(".py") and not p.endswith("__init__.py"))


def attack_and_submit(env, payload: str, task_id: str) -> tuple[float, str]:
    """Reset to an unfixed task, run ``payload`` with the bash tool, submit; the reward and the
    payload's output."""
    env.reset(seed=0, options={"task_id": task_id})
    u = env.unwrapped
    script = payload.replace("CODE", code_file(u._task))
    obs, *_ = env.step(call(env, "bash", command=script))
    out = obs[0].content
    assert "planted" in out, out  # the payload ran to its end
    pids = [int(w) for w in out.split("daemon pid ", 1)[1].split()[:1]] if "daemon pid " in out else []
    try:
        _, reward, term, _, info = env.step(call(env, "submit"))
    finally:
        if u._sb is not None and u._sb.backend == "local":
            _kill(pids)  # a local daemon is a host process: stop it by its pid
    assert term and info["submitted"]
    return reward, out


def _kill(pids):
    import os
    import signal

    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_attack_scores_zero(any_env, attack):
    backend = any_env.unwrapped._provider.requested
    if attack == "ptrace_pid1" and backend == "local":
        pytest.skip("local runs the agent as the host user with no isolation: PID 1 is the host's init")
    reward, out = attack_and_submit(any_env, ATTACKS[attack], TASK)
    assert reward == 0.0, out


def test_ptrace_of_pid1_is_denied(any_env):
    backend = any_env.unwrapped._provider.requested
    if backend == "local":
        pytest.skip("local runs the agent as the host user with no isolation: PID 1 is the host's init")
    _, out = attack_and_submit(any_env, P.PTRACE_PID1, TASK)
    assert "ptrace attach to PID 1 failed" in out and "Operation not permitted" in out, out


@pytest.mark.parametrize("attack", ["pytest_patch", "eq_object", "forged_result_lines", "os_exit_at_import"])
def test_attacks_score_zero_on_quixbugs(attack, shared_data):
    root = shared_data / "quixbugs"
    if not (root / "python_programs").is_dir():
        pytest.skip(f"no QuixBugs copy in {shared_data}")
    backend = next((b for b in ("docker", "bwrap") if skip_reason(b) is None), "local")
    env = turngym.make("turngym/SWE-quixbugs-v0", split="all", data_dir=str(shared_data), sandbox=backend,
                       scripted_hints=True, test_timeout_s=3)
    try:
        for tid in ("quixbugs-gcd", "quixbugs-detect_cycle", "quixbugs-hanoi"):
            reward, out = attack_and_submit(env, P.FRAMEWORK[attack], tid)
            assert reward == 0.0, (tid, out)
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.parametrize("suite", ["synthetic", "quixbugs"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_oracle_scores_one_on_every_task(backend, suite, request):
    """The gold patch earns 1.0 on all 15 synthetic test tasks and all 20 QuixBugs programs."""
    from turngym.agents.scripted import OracleAgent
    from turngym.rollout import episode_specs, make_env_factory, rollout

    if backend != "local" and skip_reason(backend):
        pytest.skip(skip_reason(backend))
    kwargs = dict(sandbox=backend, scripted_hints=True, pool_size=1)
    if suite == "quixbugs":
        data = request.getfixturevalue("shared_data")
        if not (data / "quixbugs" / "python_programs").is_dir():
            pytest.skip(f"no QuixBugs copy in {data}")
        kwargs.update(split="all", data_dir=str(data))  # levenshtein's reference needs ~4 CPU s on one case
    else:
        kwargs.update(split="test")
    env = turngym.make(f"turngym/SWE-{suite}-v0", **kwargs)
    ids = list(env.unwrapped.task_ids)
    env.close()
    assert len(ids) == (15 if suite == "synthetic" else 20)
    trajs = rollout(OracleAgent(), make_env_factory(f"turngym/SWE-{suite}-v0", **kwargs), episode_specs(ids, len(ids)),
                    num_envs=1, progress=False)
    assert {t.task_id: t.outcome for t in trajs} == {t: 1.0 for t in ids}
