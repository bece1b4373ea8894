"""The bundled synthetic SWE suite: small packages with one seeded, injected bug (no download).

Task ``i`` of a split is drawn from ``random.Random(f"swe-synthetic:{split}:{i}")``: a buggy
function (templates are cycled so every one appears), one of its bugs, one or two correct
companion functions, and package / module names. Expected test values come from calling the
reference functions; the hidden cases hold each template's bug witnesses, random cases, and
``N_EXPOSING`` inputs that neither the statement nor the visible tests show on which the buggy
function is wrong (drawn from their own seeded stream), so a fix that special-cases the
statement's example still fails (``hidden_tests`` renders the same cases as a pytest file, for
reference). The gold patch is the inverse of the injected edit.
"""

from __future__ import annotations

import copy
import inspect
import random

from turngym.envs.swe.task import CaseSuite, SWETask, encoded_calls, make_edits
from turngym.envs.swe.templates import TEMPLATES, Bug, Template

SPLIT_SIZES = {"train": 45, "test": 15}
_PACKAGES = ("toolkit", "utils", "helpers", "mathkit", "textops", "core", "common", "lib")
_MODULES = ("ops", "funcs", "calc", "misc", "tools", "basic")
_README = "# {pkg}\n\nSmall helper functions. Run the tests with `python3 -m pytest tests`.\n"
_CONFTEST = "# The repository root is on sys.path, so tests can import the package.\n"
N_EXPOSING = 3  # hidden inputs, shown nowhere, on which the buggy function is wrong


def synthetic_task_ids(split: str, n_tasks: int | None = None) -> list[str]:
    """Task ids of a split (``train``: 45, ``test``: 15 by default; disjoint seeds)."""
    if split not in SPLIT_SIZES:
        raise ValueError(f"unknown split {split!r}; choose from {', '.join(SPLIT_SIZES)}")
    n = SPLIT_SIZES[split] if n_tasks is None else int(n_tasks)
    return [f"synthetic-{split}-{i:03d}" for i in range(n)]


def synthetic_task(task_id: str) -> SWETask:
    """Generate the task ``synthetic-<split>-<index>`` (deterministic).

    Raises:
        ValueError: Malformed task id.
    """
    try:
        _, split, idx = task_id.split("-")
        index = int(idx)
    except ValueError:
        raise ValueError(f"not a synthetic task id: {task_id!r}") from None
    rng = random.Random(f"swe-synthetic:{split}:{index}")
    buggy = TEMPLATES[(index + (0 if split == "train" else 7)) % len(TEMPLATES)]
    bug = rng.choice(buggy.bugs)
    others = [t for t in TEMPLATES if t is not buggy]
    funcs = [buggy, *rng.sample(others, rng.randint(1, 2))]
    rng.shuffle(funcs)
    pkg, mod = rng.choice(_PACKAGES), rng.choice(_MODULES)

    correct = "\n\n".join(inspect.getsource(t.fn) for t in funcs)
    fn_src = inspect.getsource(buggy.fn)
    if fn_src.count(bug.old) != 1:
        raise AssertionError(f"bug anchor {bug.old!r} is not unique in {buggy.name}")
    buggy_src = correct.replace(fn_src, fn_src.replace(bug.old, bug.new, 1), 1)
    names = ", ".join(t.name for t in funcs)
    header = f'"""Helper functions: {names}."""\n\n\n'
    code_path, visible_path, hidden_path = f"{pkg}/{mod}.py", f"tests/test_{mod}.py", f"tests/test_{mod}_hidden.py"

    visible_cases = {t.name: _cases(t, rng, 2) for t in funcs}
    visible = _test_file(pkg, mod, funcs, visible_cases)
    hidden_cases = {t.name: [*(b.witness for b in t.bugs), *_cases(t, rng, 6)] for t in funcs}
    shown = {(buggy.name, repr(bug.witness))} | {(n, repr(a)) for n, cs in visible_cases.items() for a in cs}
    exposing = _exposing_cases(buggy, bug, random.Random(f"swe-synthetic:{split}:{index}:exposing"),
                               [bug.witness, *visible_cases[buggy.name]])
    hidden_cases[buggy.name] += exposing
    hidden = _test_file(pkg, mod, funcs, hidden_cases)
    example_args = bug.witness
    expected = buggy.fn(*example_args)
    statement = (
        f"`{buggy.name}` in `{code_path}` does not do what its docstring says: "
        f"{inspect.getdoc(buggy.fn).splitlines()[0]}\n"
        f"For example, `{buggy.name}({', '.join(map(repr, example_args))})` should return `{expected!r}`.\n"
        f"Fix the bug. The visible tests are in `{visible_path}` (run them with run_tests); "
        "hidden tests check more cases when you submit."
    )
    files = {
        "README.md": _README.format(pkg=pkg),
        f"{pkg}/__init__.py": "",
        code_path: header + buggy_src,
        visible_path: visible,
        "conftest.py": _CONFTEST,
    }
    return SWETask(
        task_id=task_id, statement=statement, files=files, hidden_tests={hidden_path: hidden},
        gold_edits=make_edits(code_path, header + buggy_src, header + correct),
        test_support=[visible_path, "conftest.py"], visible_tests=[visible_path],
        task_type=bug.kind, metadata={"function": buggy.name, "bug": bug.kind},
        hidden_cases=_case_suite(pkg, mod, funcs, hidden_cases, shown),
    )


def _case_suite(pkg: str, mod: str, funcs: list[Template], cases: dict[str, list[tuple]],
                shown: set[tuple[str, str]]) -> CaseSuite:
    """The hidden tests as cases: one call each; expected values from the reference functions.
    ``shown``: ``(function, repr(args))`` of the calls the agent sees."""
    lines = [f"from {pkg}.{mod} import {', '.join(t.name for t in funcs)}", ""]
    names, expected, seen = [], [], []
    for t in funcs:
        for args in cases[t.name]:
            names.append(f"case_{len(names)}")
            lines += ["", f"def {names[-1]}():", f"    {t.name}(*{args!r})", ""]
            expected.append(encoded_calls([t.fn(*args)]))
            if (t.name, repr(args)) in shown:
                seen.append(names[-1])
    return CaseSuite("\n".join(lines), tuple(names), tuple(t.name for t in funcs), tuple(expected),
                     shown=tuple(seen), cpu_s=(0.0,) * len(names))


def buggy_function(t: Template, bug: Bug):
    """The template's function with ``bug`` injected, as the task's repository holds it."""
    namespace: dict = {}
    exec(compile(inspect.getsource(t.fn).replace(bug.old, bug.new, 1), f"<buggy {t.name}>", "exec"), namespace)
    return namespace[t.name]


def _is_wrong(wrong, right, args: tuple) -> bool:
    try:
        return wrong(*copy.deepcopy(args)) != right(*copy.deepcopy(args))
    except Exception:  # the buggy version crashes where the reference answers
        return True


def _exposing_cases(t: Template, bug: Bug, rng: random.Random, shown: list[tuple]) -> list[tuple]:
    """``N_EXPOSING`` random valid inputs, none of them ``shown``, on which the buggy function is wrong.

    Raises:
        AssertionError: The template's inputs rarely expose this bug (fix the template).
    """
    wrong = buggy_function(t, bug)
    out: list[tuple] = []
    for _ in range(5000):
        for args in t.cases(rng):
            if args not in shown and args not in out and _is_wrong(wrong, t.fn, args):
                out.append(args)
        if len(out) >= N_EXPOSING:
            return out[:N_EXPOSING]
    raise AssertionError(f"{t.name}/{bug.kind}: random inputs expose the bug too rarely")


def _cases(t: Template, rng: random.Random, n: int) -> list[tuple]:
    return [args for _ in range(n) for args in t.cases(rng)][:n]


def _test_file(pkg: str, mod: str, funcs: list[Template], cases: dict[str, list[tuple]]) -> str:
    lines = ["import pytest", "", f"from {pkg}.{mod} import {', '.join(t.name for t in funcs)}", ""]
    for t in funcs:
        rows = "".join(f"    ({args!r}, {t.fn(*args)!r}),\n" for args in cases[t.name])
        lines += [
            "",
            f'@pytest.mark.parametrize("args, expected", [\n{rows}])',
            f"def test_{t.name}(args, expected):",
            f"    assert {t.name}(*args) == expected",
            "",
        ]
    return "\n".join(lines)
