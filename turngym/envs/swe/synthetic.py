"""The bundled synthetic SWE suite: small packages with one seeded, injected bug (no download).

Task ``i`` of a split is drawn from ``random.Random(f"swe-synthetic:{split}:{i}")``: a buggy
function (templates are cycled so every one appears), one of its bugs, one or two correct
companion functions, and package / module names. Expected test values come from calling the
reference functions; the hidden cases hold each template's bug witnesses, so they always catch
the bug, plus random cases (``hidden_tests`` renders the same cases as a pytest file, for
reference). The gold patch is the inverse of the injected edit.
"""

from __future__ import annotations

import inspect
import random

from turngym.envs.swe.task import CaseSuite, SWETask, encoded_calls, make_edits
from turngym.envs.swe.templates import TEMPLATES, Template

SPLIT_SIZES = {"train": 45, "test": 15}
_PACKAGES = ("toolkit", "utils", "helpers", "mathkit", "textops", "core", "common", "lib")
_MODULES = ("ops", "funcs", "calc", "misc", "tools", "basic")
_README = "# {pkg}\n\nSmall helper functions. Run the tests with `python3 -m pytest tests`.\n"
_CONFTEST = "# The repository root is on sys.path, so tests can import the package.\n"


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

    visible = _test_file(pkg, mod, funcs, {t.name: _cases(t, rng, 2) for t in funcs})
    hidden_cases = {t.name: [*(b.witness for b in t.bugs), *_cases(t, rng, 6)] for t in funcs}
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
        hidden_cases=_case_suite(pkg, mod, funcs, hidden_cases),
    )


def _case_suite(pkg: str, mod: str, funcs: list[Template], cases: dict[str, list[tuple]]) -> CaseSuite:
    """The hidden tests as cases: one call each; expected values from the reference functions."""
    lines = [f"from {pkg}.{mod} import {', '.join(t.name for t in funcs)}", ""]
    names, expected = [], []
    for t in funcs:
        for args in cases[t.name]:
            names.append(f"case_{len(names)}")
            lines += ["", f"def {names[-1]}():", f"    {t.name}(*{args!r})", ""]
            expected.append(encoded_calls([t.fn(*args)]))
    return CaseSuite("\n".join(lines), tuple(names), tuple(t.name for t in funcs), tuple(expected))


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
