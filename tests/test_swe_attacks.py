"""SWE attacks inside real sandboxes (Docker and bubblewrap): the agent cannot read the hidden
tests, cannot mine git history for the fix, cannot game the grader (planted plugins, a
background process that rewrites the grading files), and the oracle still solves its tasks.
Skips with the reason when a backend cannot run here."""

from __future__ import annotations

import pytest

import turngym
from test_sandbox import skip_reason
from test_swe import call, check_cheats_fail

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
