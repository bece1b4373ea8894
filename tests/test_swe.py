"""SWE env: patch helpers, the synthetic suite, the tools, grading (and attempts to game it),
the oracle (100%) and random edits (~0%). Runs on the local backend so it needs no engine;
``test_swe_sandboxed.py`` repeats the end-to-end checks in Docker and bubblewrap."""

from __future__ import annotations

import json

import pytest

import turngym
from turngym.agents.scripted import OracleAgent, RandomAgent
from turngym.envs.swe.synthetic import synthetic_task, synthetic_task_ids
from turngym.envs.swe.task import apply_edit, make_edits
from turngym.envs.swe.templates import BUG_KINDS, TEMPLATES
from turngym.rollout import episode_specs, make_env_factory, rollout
from turngym.types import ToolCall

pytestmark = pytest.mark.filterwarnings("ignore::turngym.tools.sandbox.local_backend.UnsafeSandboxWarning")


def apply_all(text, edits):
    for e in edits:
        text, why = apply_edit(text, e.old, e.new)
        assert text is not None, why
    return text


# ----- patches ------------------------------------------------------------------------------
def test_make_edits_hand_worked():
    before = "a\nx = 1\nb\nx = 1\nc\n"
    after = "a\nx = 1\nb\nx = 2\nc\n"
    (e,) = make_edits("f.py", before, after)
    assert (e.old, e.new) == ("b\nx = 1\n", "b\nx = 2\n")  # "x = 1" alone is not unique: one line of context
    assert apply_all(before, [e]) == after


def test_make_edits_insertions_deletions_and_many_hunks():
    before = "def f():\n    return 1\n\n\ndef g():\n    pass\n"
    after = "def f():\n    x = 0\n    return 1\n\n\ndef g():\n    return 2\n"
    edits = make_edits("f.py", before, after)
    assert len(edits) == 2 and all(e.old.strip() for e in edits)
    assert apply_all(before, edits) == after
    assert apply_all("keep\ndrop\n", make_edits("f", "keep\ndrop\n", "keep\n")) == "keep\n"


def test_apply_edit_errors_are_clear():
    assert apply_edit("abc", "zz", "y") == (None, "old_str was not found in the file (it must match exactly, whitespace included)")
    text, why = apply_edit("x\nx\n", "x", "y")
    assert text is None and "occurs 2 times (lines 1, 2)" in why
    assert apply_edit("abc", "", "y")[0] is None


# ----- synthetic suite ----------------------------------------------------------------------
def test_synthetic_suite_is_deterministic_disjoint_and_gold_patch_fixes():
    train, test = synthetic_task_ids("train"), synthetic_task_ids("test")
    assert len(train) == 45 and len(test) == 15 and not set(train) & set(test)
    kinds, names = set(), set()
    for tid in train + test:
        task = synthetic_task(tid)
        assert synthetic_task(tid).files == task.files  # same id, same task
        code = next(p for p in task.source_files if p.endswith(".py") and not p.endswith("__init__.py"))
        fixed = apply_all(task.files[code], task.gold_edits)
        assert fixed != task.files[code]
        kinds.add(task.task_type)
        names.add(task.metadata["function"])
        assert not set(task.hidden_tests) & set(task.files)  # hidden tests are not in the repo
    assert kinds == set(BUG_KINDS) and names == {t.name for t in TEMPLATES}


def test_every_bug_anchor_is_unique_in_its_function():
    import inspect

    for t in TEMPLATES:
        for b in t.bugs:
            assert inspect.getsource(t.fn).count(b.old) == 1, (t.name, b.old)


# ----- the env on the local backend ---------------------------------------------------------
@pytest.fixture
def env():
    e = turngym.make("turngym/SWE-synthetic-v0", split="test", sandbox="local", scripted_hints=True)
    yield e
    e.close()


def call(env, name, **args):
    return env.unwrapped.format.render_call(ToolCall("c", name, args))


def test_tools_view_edit_run_tests_and_signals(env):
    obs, info = env.reset(seed=1, options={"task_id": "synthetic-test-003"})
    u = env.unwrapped
    task = u._task
    code = next(p for p in task.source_files if p.endswith(".py") and "__init__" not in p)
    assert task.statement in obs[1].content
    json.dumps(info)

    obs, _, _, _, info = env.step(call(env, "view_file", path=code, start_line=2, end_line=3))
    assert obs[0].content.startswith(f"{code} (lines 2-3 of") and "    2  " in obs[0].content
    assert info["file_modified"] is False and info["action_valid"]

    obs, _, _, _, info = env.step(call(env, "edit_file", path=code, old_str="no such text", new_str="x"))
    assert "was not found" in obs[0].content and not info["action_valid"] and not info["modified"]
    obs, _, _, _, info = env.step(call(env, "view_file", path="../../etc/passwd"))
    assert "outside the repository" in obs[0].content

    obs, _, _, _, info = env.step(call(env, "run_tests"))
    assert 0.0 <= info["visible_tests_passed"] <= 1.0 and "passed" in obs[0].content + "failed"

    key = info["state_key"]
    obs, _, _, _, info = env.step(call(env, "bash", command="true"))  # the host-side reset digest matches
    assert not info["file_modified"] and not info["modified"] and info["state_key"] == key
    obs, _, _, _, info = env.step(call(env, "bash", command="echo '# note' >> README.md"))
    assert info["file_modified"] and info["modified"] and info["state_key"] != key
    obs, _, _, _, info = env.step(call(env, "bash", command="cat README.md"))
    assert info["file_modified"] is False and info["modified"]
    json.dumps(info)


def test_reset_is_deterministic_and_fresh(env):
    a, _ = env.reset(seed=0, options={"task_id": "synthetic-test-001"})
    env.step(call(env, "bash", command="rm -rf ./*"))
    b, info = env.reset(seed=0, options={"task_id": "synthetic-test-001"})
    assert [m.content.split("(the current directory")[0] for m in a] == [m.content.split("(the current directory")[0] for m in b]
    obs, *_ = env.step(call(env, "bash", command="ls"))
    assert "README.md" in obs[0].content and not info.get("modified")


def submit_unfixed(split, task_ids):
    env = turngym.make("turngym/SWE-synthetic-v0", split=split, sandbox="local")
    try:
        for tid in task_ids:  # the buggy repo must fail: each bug's witness is in the hidden tests
            env.reset(seed=0, options={"task_id": tid})
            _, reward, term, _, info = env.step(call(env, "submit"))
            assert term and reward == 0.0 and info["submitted"] and not info["won"], tid
    finally:
        env.close()


def test_unfixed_repo_fails_hidden_tests():
    submit_unfixed("test", synthetic_task_ids("test")[:5])


@pytest.mark.slow
def test_unfixed_repo_fails_hidden_tests_whole_suite():
    submit_unfixed("test", synthetic_task_ids("test"))
    submit_unfixed("train", synthetic_task_ids("train"))


@pytest.mark.slow
def test_oracle_solves_the_whole_synthetic_train_split():
    ids = synthetic_task_ids("train")
    trajs = rollout(OracleAgent(), make_env_factory("turngym/SWE-synthetic-v0", split="train", sandbox="local",
                                                   scripted_hints=True), episode_specs(ids, len(ids)), num_envs=1,
                    progress=False)
    assert [t.outcome for t in trajs] == [1.0] * len(ids)


# Each would make the hidden tests pass without a fix, if the grader let pytest load it.
_PLUGIN = "def pytest_collection_modifyitems(items):\\n    for i in items: i.runtest = lambda: None\\n"
CHEATS = [
    "printf 'def test_ok():\\n    assert True\\n' > VISIBLE",  # rewrite the visible tests
    f"printf '{_PLUGIN}' > conftest.py; mkdir -p tests && cp conftest.py tests/conftest.py",
    f"printf '{_PLUGIN}' > cheatplugin.py; printf '[pytest]\\naddopts = -p cheatplugin\\n' > pytest.ini",
    f"printf '{_PLUGIN}' > ${{TMPDIR:-/tmp}}/conftest.py",
    "d=$HOME/.local/lib/python3.11/site-packages; mkdir -p $d && cp cheatplugin.py $d/ && "
    "echo 'import os; os.environ[\"PYTEST_PLUGINS\"] = \"cheatplugin\"' > $d/usercustomize.py",
]


def check_cheats_fail(env, task_id="synthetic-test-004"):
    """Plant every cheat, show it fools a naive pytest run of the hidden tests, then submit: 0."""
    u = env.unwrapped
    env.reset(seed=0, options={"task_id": task_id})
    for cheat in CHEATS:
        obs, *_ = env.step(call(env, "bash", command=cheat.replace("VISIBLE", u._task.visible_tests[0])))
        assert obs[0].content.startswith("[exit code 0]"), obs[0].content
    box, (hidden_path, hidden) = u._sb, next(iter(u._task.hidden_tests.items()))
    box.write_file(hidden_path, hidden)
    naive = box.exec(["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", hidden_path])
    assert naive.exit_code == 0 and "passed" in naive.stdout, naive.observation()  # the cheats are real
    box.exec(["rm", hidden_path])
    _, reward, term, _, info = env.step(call(env, "submit"))
    assert term and reward == 0.0 and not info["won"]


def test_gaming_the_grader_does_not_help(env):
    check_cheats_fail(env)


def test_oracle_solves_the_whole_synthetic_test_split():
    trajs = rollout(OracleAgent(), make_env_factory("turngym/SWE-synthetic-v0", split="test", sandbox="local",
                                                   scripted_hints=True),
                    episode_specs(synthetic_task_ids("test"), 15), num_envs=1, progress=False)
    assert [t.outcome for t in trajs] == [1.0] * 15
    assert all(t.turns[-1].info["submitted"] and t.turns[-1].info["modified"] for t in trajs)


def test_random_edits_solve_almost_nothing():
    trajs = rollout(RandomAgent(seed=3), make_env_factory("turngym/SWE-synthetic-v0", split="test", sandbox="local",
                                                         scripted_hints=True, max_turns=8),
                    episode_specs(synthetic_task_ids("test")[:6], 6), num_envs=1, progress=False)
    assert sum(t.outcome for t in trajs) <= 1
    assert any(t.turns[-1].info.get("modified") for t in trajs)  # it did edit: it just never fixed
