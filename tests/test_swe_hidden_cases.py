"""Hidden cases an agent cannot special-case: on every task, the buggy code fails a hidden case
whose inputs neither the statement nor the visible tests show (a property over the whole
generated task list, and over QuixBugs when its data is here). A fix that only answers the
statement's example scores 0."""

from __future__ import annotations

import pytest

import turngym
from turngym.envs.swe import grading
from turngym.envs.swe.synthetic import _exposing_cases, synthetic_task, synthetic_task_ids
from turngym.envs.swe.templates import TEMPLATES, template
from turngym.types import ToolCall

pytestmark = pytest.mark.filterwarnings("ignore::turngym.tools.sandbox.local_backend.UnsafeSandboxWarning")

ALL_SYNTHETIC = synthetic_task_ids("train") + synthetic_task_ids("test")
# These five were won on the unfixed code by special-casing the statement's example.
ONCE_WINNABLE = ["synthetic-train-008", "synthetic-train-032", "synthetic-train-038", "synthetic-test-001",
                 "synthetic-test-005"]


def buggy_sources(task) -> dict[str, str]:
    return {p: task.files[p] for p in task.source_files}


@pytest.mark.parametrize("task_id", ALL_SYNTHETIC)
def test_every_synthetic_task_has_an_unshown_case_the_bug_fails(task_id):
    task = synthetic_task(task_id)
    suite = task.hidden_cases
    assert suite.shown, "the statement's example is a hidden case, and is marked shown"
    caught, why = grading.hidden_cases_catch_the_bug(suite, buggy_sources(task))
    assert caught, f"{task_id}: {why}"


def test_every_template_bug_can_be_exposed_off_the_examples():
    """Any task id (``n_tasks`` past the defaults too) draws from these: each bug of each template
    has random inputs, other than its witness, that the buggy function gets wrong."""
    import random

    for t in TEMPLATES:
        for bug in t.bugs:
            assert len(_exposing_cases(t, bug, random.Random(0), [bug.witness])) == 3, (t.name, bug.kind)


def special_case_patch(task) -> str:
    """Python appended to the buggy source: answer the statement's example, else run the bug."""
    name = task.metadata["function"]
    t = template(name)
    bug = next(b for b in t.bugs if f"`{name}({', '.join(map(repr, b.witness))})`" in task.statement)
    return (f"\n_buggy_{name} = {name}\n\ndef {name}(*args):\n    if list(args) == {list(bug.witness)!r}:\n"
            f"        return {t.fn(*bug.witness)!r}\n    return _buggy_{name}(*args)\n")


@pytest.mark.parametrize("task_id", ONCE_WINNABLE)
def test_special_casing_the_example_scores_zero(task_id):
    env = turngym.make("turngym/SWE-synthetic-v0", split=task_id.split("-")[1], sandbox="local", pool_size=0)
    try:
        env.reset(seed=0, options={"task_id": task_id})
        u = env.unwrapped
        code = u._task.gold_edits[0].path
        patch = special_case_patch(u._task)
        fmt = u.format
        obs, *_ = env.step(fmt.render_call(ToolCall("c", "bash", {"command": f"cat >> {code} <<'EOF'\n{patch}\nEOF"})))
        assert obs[0].content.startswith("[exit code 0]"), obs[0].content
        _, reward, term, _, info = env.step(fmt.render_call(ToolCall("c", "submit", {})))
        assert term and reward == 0.0, info
    finally:
        env.close()


def test_quixbugs_hidden_cases_catch_every_bug(shared_data):
    from turngym.envs.swe.quixbugs import quixbugs_tasks

    root = shared_data / "quixbugs"
    if not (root / "python_programs").is_dir():
        pytest.skip(f"no QuixBugs copy in {shared_data}")
    tasks = quixbugs_tasks(root, "all")
    assert len(tasks) == 20
    for tid, task in tasks.items():
        caught, why = grading.hidden_cases_catch_the_bug(task.hidden_cases, buggy_sources(task), cap_s=2.0)
        assert caught, f"{tid}: {why}"
