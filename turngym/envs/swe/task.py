"""An SWE task (a repo at a buggy state, visible tests, hidden cases, a gold patch) and str-replace edits."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from turngym.envs.swe import case_runner


@dataclass(frozen=True)
class Edit:
    """One ``edit_file`` call: replace the unique occurrence of ``old`` in ``path`` with ``new``."""

    path: str
    old: str
    new: str


@dataclass(frozen=True)
class CaseSuite:
    """A task's hidden tests as cases: inputs and calls in ``module``, expected values on the host.

    Args:
        module: Python source run (in a child, per case) in the grading sandbox's repo root. It
            imports the code under test and defines one function per case; it holds inputs only.
        cases: The case functions, in order.
        targets: Names in ``module`` (the functions under test) whose every return is recorded.
        expected: Per case, the encoded calls of the reference solution (``case_runner``'s
            ``{"calls": [...], "objs": [...]}``). Never leaves the host.
        support: Files the module needs besides the agent's (path -> original text).
        shown: The cases whose inputs the agent can see (the statement's example, the visible
            tests). The buggy code must fail some other case: special-casing what the agent was
            shown must not earn the reward (``hidden_cases_catch_the_bug`` checks it).
        cpu_s: Per case, the CPU seconds the reference solution took (empty: unknown); the
            grader's per-case limits are derived from it.
    """

    module: str
    cases: tuple[str, ...]
    targets: tuple[str, ...]
    expected: tuple[dict, ...] = ()
    support: dict[str, str] = field(default_factory=dict)
    shown: tuple[str, ...] = ()
    cpu_s: tuple[float, ...] = ()

    def only(self, names: list[str] | tuple[str, ...]) -> CaseSuite:
        """The same suite restricted to the cases ``names`` (in this suite's order)."""
        keep = [i for i, c in enumerate(self.cases) if c in set(names)]
        pick = (lambda xs: tuple(xs[i] for i in keep) if xs else ())
        return CaseSuite(self.module, pick(self.cases), self.targets, pick(self.expected), dict(self.support),
                         tuple(c for c in self.shown if c in set(names)), pick(self.cpu_s))


def encoded_calls(values: list) -> dict:
    """The record ``case_runner`` makes of a case whose target calls returned ``values``."""
    enc = case_runner.Encoder()
    return {"calls": [enc.encode(v) for v in values], "objs": enc.objs}


@dataclass
class SWETask:
    """A bug-fixing task.

    Args:
        task_id: Unique within its suite.
        statement: The problem statement shown to the agent.
        files: The repository at its buggy state (path -> text), visible tests included.
        hidden_tests: The hidden tests as pytest files (path -> text), for reference: they never
            enter a sandbox; grading runs ``hidden_cases``.
        gold_edits: Edits that turn the buggy repo into the fixed one (the oracle patch).
        test_support: Paths in ``files`` that belong to the tests (visible tests, conftest,
            fixtures); they are not the agent's, so grading never copies them.
        visible_tests: Test paths ``run_tests`` runs.
        task_type: Group name for reports (bug kind, suite).
        hidden_cases: The hidden tests as cases (inputs in the sandbox, expected values on the host).
    """

    task_id: str
    statement: str
    files: dict[str, str]
    hidden_tests: dict[str, str]
    gold_edits: list[Edit]
    test_support: list[str]
    visible_tests: list[str]
    task_type: str = "default"
    metadata: dict = field(default_factory=dict)
    hidden_cases: CaseSuite | None = None

    @property
    def source_files(self) -> list[str]:
        """The files the agent is meant to fix (everything that is not test support): the
        allow-list of files grading copies out of the agent's sandbox."""
        support = set(self.test_support)
        return sorted(p for p in self.files if p not in support)


def make_edits(path: str, before: str, after: str, context: int = 0) -> list[Edit]:
    """Str-replace edits that turn ``before`` into ``after``, applied in order.

    Each edit's ``old`` is non-empty and occurs exactly once in the text it is applied to
    (context lines are added until it does), so ``edit_file`` can apply it as it stands.

    Args:
        path: The file the edits apply to.
        context: Extra unchanged lines to include on each side of every change.

    Raises:
        ValueError: No unique anchor exists (the file is made of identical lines).
    """
    a, b = before.splitlines(keepends=True), after.splitlines(keepends=True)
    cur = list(a)
    offset = 0
    edits = []
    ops = [op for op in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes() if op[0] != "equal"]
    for _, i1, i2, j1, j2 in ops:
        p, q = i1 + offset, i2 + offset  # this change's lines in the current text
        new = list(b[j1:j2])
        for _ in range(context):
            p, q, new = _grow(cur, p, q, new)
        while not _unique(cur, p, q):
            if p == 0 and q == len(cur):
                raise ValueError(f"{path}: no unique anchor for an edit")
            p, q, new = _grow(cur, p, q, new)
        edits.append(Edit(path, "".join(cur[p:q]), "".join(new)))
        cur[p:q] = new
        offset += (j2 - j1) - (i2 - i1)
    if "".join(cur) != after:
        raise AssertionError(f"{path}: edits do not reproduce the target text")
    return edits


def _grow(cur: list[str], p: int, q: int, new: list[str]) -> tuple[int, int, list[str]]:
    """Add one unchanged line of context, above if possible, else below."""
    if p > 0:
        return p - 1, q, [cur[p - 1], *new]
    if q < len(cur):
        return p, q + 1, [*new, cur[q]]
    return p, q, new


def _unique(cur: list[str], p: int, q: int) -> bool:
    old = "".join(cur[p:q])
    return bool(old.strip()) and "".join(cur).count(old) == 1


def apply_edit(text: str, old: str, new: str) -> tuple[str | None, str]:
    """Apply one str-replace edit; returns ``(new_text, "")`` or ``(None, reason)``."""
    if not old:
        return None, "old_str is empty; quote the exact text to replace"
    n = text.count(old)
    if n == 0:
        return None, "old_str was not found in the file (it must match exactly, whitespace included)"
    if n > 1:
        lines = [text[: m].count("\n") + 1 for m in _find_all(text, old)]
        return None, f"old_str occurs {n} times (lines {', '.join(map(str, lines[:10]))}); include more context"
    return text.replace(old, new, 1), ""


def _find_all(text: str, sub: str) -> list[int]:
    out, i = [], text.find(sub)
    while i != -1:
        out.append(i)
        i = text.find(sub, i + 1)
    return out
