"""The generated SWE suite (``turngym/SWE-synthetic-v1``): its size, held-out tasks that share no
template, function or package with training, many tasks per template, and the property over every
task: the gold patch earns full reward in the sandbox, submitting the unfixed repo earns none, and
the buggy code fails a hidden case that neither the statement nor the visible tests show."""

from __future__ import annotations

import random
from collections import Counter

import pytest

import turngym
from turngym.envs.swe import grading
from turngym.envs.swe.param_templates import BUG_KINDS, exposing_inputs, render
from turngym.envs.swe.synthetic_v1 import (
    HELDOUT_PACKAGES,
    MODULES,
    TEMPLATES,
    TRAIN_PACKAGES,
    build_task,
    content_keys,
    oracle_replies,
    plan,
    task_ids,
)
from turngym.types import ToolCall

pytestmark = pytest.mark.filterwarnings("ignore::turngym.tools.sandbox.local_backend.UnsafeSandboxWarning")
ENV = "turngym/SWE-synthetic-v1"


def buggy_sources(task) -> dict[str, str]:
    return {p: task.files[p] for p in task.source_files}


# ----- size, determinism, variety ---------------------------------------------------------------------
def test_split_sizes_and_ids():
    train, test = task_ids("train"), task_ids("test")
    assert len(train) == 600 and len(test) == 144 and not set(train) & set(test)
    assert task_ids("test", 3) == ["swe-test-0000", "swe-test-0001", "swe-test-0002"]
    env = turngym.make(ENV, split="test", sandbox="local", pool_size=0)
    try:
        assert env.unwrapped.task_ids == test
    finally:
        env.close()
    with pytest.raises(ValueError, match="unknown split"):
        task_ids("validation")


def test_tasks_are_deterministic_and_distinct():
    for split in ("train", "test"):
        tasks = [build_task(t) for t in task_ids(split)]
        assert len({t.statement for t in tasks}) == len(tasks)  # no task repeats another of its split
        assert len({tuple(sorted(t.files.items())) for t in tasks}) == len(tasks)
    again = build_task("swe-train-0123")
    assert again.files == build_task("swe-train-0123").files and again.hidden_cases == build_task("swe-train-0123").hidden_cases


def test_many_tasks_per_template_each_rendered_differently():
    for split in ("train", "test"):
        plans = [plan(t) for t in task_ids(split)]
        per_template = Counter(p.buggy.template.key for p in plans)
        assert set(per_template) == {t.key for t in TEMPLATES[split]}
        assert min(per_template.values()) >= 12
        # names, argument names and constants vary: few tasks repeat another's buggy function and bug
        assert len({(p.buggy.source, p.bug.kind) for p in plans}) >= 0.9 * len(plans)
        first = {p.buggy.template.key for p in plans[:len(TEMPLATES[split])]}
        assert first == {t.key for t in TEMPLATES[split]}  # the first tasks cover every template
    kinds = Counter(build_task(t).task_type for t in task_ids("test"))
    assert set(kinds) == set(BUG_KINDS)


def test_every_bug_of_every_template_renders_and_is_exposed():
    """Any rendering (``n_tasks`` past the defaults too): each bug's anchor is unique, the bug
    terminates, and four inputs it gets wrong are found quickly."""
    for split, templates in TEMPLATES.items():
        for t in templates:
            for seed in range(15):
                r = render(t, random.Random(f"{t.key}:{seed}"))
                for bug in t.bugs:
                    assert len(exposing_inputs(r, bug, random.Random(seed), 4, [], tries=2000)) == 4, (t.key, bug)


# ----- held out in content ------------------------------------------------------------------------------
def test_held_out_tasks_share_no_template_function_or_package_with_training():
    train = {t: plan(t) for t in task_ids("train")}
    test = {t: plan(t) for t in task_ids("test")}
    assert not {t.key for t in TEMPLATES["train"]} & {t.key for t in TEMPLATES["test"]}
    names = lambda split: {n for t in TEMPLATES[split] for n in t.names}  # noqa: E731
    assert not names("train") & names("test")
    assert not set(TRAIN_PACKAGES) & set(HELDOUT_PACKAGES) and not set(MODULES["train"]) & set(MODULES["test"])
    used = lambda plans, attr: {getattr(p, attr) for p in plans.values()}  # noqa: E731
    assert used(train, "package") == set(TRAIN_PACKAGES) and used(test, "package") == set(HELDOUT_PACKAGES)
    funcs = lambda plans: {(f.template.key, f.name) for p in plans.values() for f in p.funcs}  # noqa: E731
    assert not {k for k, _ in funcs(train)} & {k for k, _ in funcs(test)}
    assert not {n for _, n in funcs(train)} & {n for _, n in funcs(test)}
    train_keys = set().union(*(content_keys(t) for t in train))
    assert all(not content_keys(t) & train_keys for t in test)


# ----- the property over every task ---------------------------------------------------------------------
def _check_grading(task_id: str) -> None:
    """On the host: the gold patch passes every hidden case; the buggy code fails one the agent never
    saw; the statement's example is a hidden case, marked shown."""
    task = build_task(task_id)
    suite = task.hidden_cases
    assert suite.shown and len(suite.shown) < len(suite.cases)
    caught, why = grading.hidden_cases_catch_the_bug(suite, buggy_sources(task))
    assert caught, f"{task_id}: {why}"
    code = task.gold_edits[0].path
    fixed = task.files[code]
    for e in task.gold_edits:
        fixed = fixed.replace(e.old, e.new, 1)
    report, _ = grading.run_on_host(suite, {**buggy_sources(task), code: fixed}, grading.case_limits(suite, 10.0))
    passed, summary = grading.judge(suite, report)
    assert passed, f"{task_id}: the gold patch fails: {summary}"


def _check_env(split: str, ids: list[str]) -> None:
    """In the sandbox: the oracle's patch earns 1.0; submitting the unfixed repo earns 0.0; replies
    without a tool call end nothing and earn nothing."""
    env = turngym.make(ENV, split=split, sandbox="local", pool_size=0, scripted_hints=True)
    u = env.unwrapped
    try:
        for tid in ids:
            env.reset(seed=0, options={"task_id": tid})
            reward, term = 0.0, False
            for _ in range(len(u._task.gold_edits) + 1):
                _, reward, term, _, info = env.step(u.oracle_action())
            assert term and reward == 1.0 and info["won"], (tid, u._grade_report)
            env.reset(seed=0, options={"task_id": tid})
            _, reward, term, _, _ = env.step("I will look at it later.")
            assert not term and reward == 0.0
            _, reward, term, _, info = env.step(u.format.render_call(ToolCall("c", "submit", {})))
            assert term and reward == 0.0 and not info["won"], tid
    finally:
        env.close()


def _sample(split: str, k: int) -> list[str]:
    return random.Random(split).sample(task_ids(split), k)


def test_the_property_on_a_sample():
    for split in ("train", "test"):
        for tid in _sample(split, 3):
            _check_grading(tid)
        _check_env(split, _sample(split, 2))


@pytest.mark.slow
@pytest.mark.parametrize("split", ["train", "test"])
def test_the_property_on_every_task(split):
    for tid in task_ids(split):
        _check_grading(tid)
    _check_env(split, task_ids(split))


def special_case_patch(task) -> str:
    """Python appended to the buggy source: answer the statement's example, else run the bug."""
    name, example = task.metadata["function"], task.metadata["example"]
    expected = task.statement.split("should return `", 1)[1].split("`.\n", 1)[0]
    return (f"\n_buggy_{name} = {name}\n\ndef {name}(*args):\n    if list(args) == {example!r}:\n"
            f"        return {expected}\n    return _buggy_{name}(*args)\n")


@pytest.mark.parametrize("task_id", ["swe-test-0000", "swe-test-0007", "swe-train-0001", "swe-train-0042"])
def test_special_casing_the_example_scores_zero(task_id):
    env = turngym.make(ENV, split=task_id.split("-")[1], sandbox="local", pool_size=0)
    try:
        env.reset(seed=0, options={"task_id": task_id})
        u = env.unwrapped
        code, fmt = u._task.gold_edits[0].path, u.format
        patch = special_case_patch(u._task)
        obs, *_ = env.step(fmt.render_call(ToolCall("c", "bash", {"command": f"cat >> {code} <<'EOF'\n{patch}\nEOF"})))
        assert obs[0].content.startswith("[exit code 0]"), obs[0].content
        obs, *_ = env.step(fmt.render_call(ToolCall("c", "bash", {"command": f"python3 -c 'from {code[:-3].replace('/', '.')} import *'"})))
        assert obs[0].content.startswith("[exit code 0]"), obs[0].content  # the patch is valid Python
        _, reward, term, _, info = env.step(fmt.render_call(ToolCall("c", "submit", {})))
        assert term and reward == 0.0, info
    finally:
        env.close()


def test_content_keys_through_the_env():
    env = turngym.make(ENV, split="test", sandbox="local", pool_size=0)
    try:
        keys = env.unwrapped.content_keys("swe-test-0005")
    finally:
        env.close()
    p = plan("swe-test-0005")
    assert keys == {f"template:{f.template.key}" for f in p.funcs} | {f"package:{p.package}"}
    assert f"template:{p.buggy.template.key}" in keys


def test_oracle_replies_are_recorded_for_every_task():
    replies = oracle_replies("test", tool_format="hermes")
    assert list(replies) == task_ids("test")
    assert all(r[-1] == '<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call>' for r in replies.values())
    assert all(len(r) >= 2 and '"name": "edit_file"' in r[0] for r in replies.values())
    assert max(len(x) for r in replies.values() for x in r) < 700  # see docs/task_suites.md for tokens
