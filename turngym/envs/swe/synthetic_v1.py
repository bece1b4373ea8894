"""The generated SWE suite behind ``turngym/SWE-synthetic-v1``: parametrised bug templates, held out
by template and by package.

Task ``swe-<split>-<index>`` is drawn from ``random.Random(f"swe-synthetic-v1:{split}:{index}")``:
its split's templates are cycled (so the first tasks of a split cover every template), then one of
the template's bugs, a rendering (function name, argument names, constants such as thresholds,
record keys or fill characters), one or two correct companion functions from the same split's
templates, and package and module names from the split's own pools. Training tasks use
``TRAIN_TEMPLATES`` and ``TRAIN_PACKAGES``, held-out tasks ``HELDOUT_TEMPLATES`` and
``HELDOUT_PACKAGES``: no held-out task shares a template, a function name or a package with a
training task.

As in v0 (``synthetic.py``): the statement quotes the docstring and one input the buggy function
gets wrong; the visible tests show two random cases per function; the hidden cases add random
cases and ``N_EXPOSING`` more inputs the buggy function gets wrong that nothing shows, so a fix
that special-cases what the agent saw still fails. Expected values come from running the rendered
reference here; the gold patch undoes the injected edit. A task is built on first use (a few ms).
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from typing import Any

from turngym.envs.swe.env import SWEEnv
from turngym.envs.swe.param_templates import PBug, PTemplate, Rendered, exposing_inputs, render
from turngym.envs.swe.synthetic import _CONFTEST, _README, _case_suite, _test_file
from turngym.envs.swe.task import SWETask, make_edits
from turngym.envs.swe.templates_heldout import HELDOUT_TEMPLATES
from turngym.envs.swe.templates_train import TRAIN_TEMPLATES

SPLIT_SIZES = {"train": 600, "test": 144}
TEMPLATES = {"train": TRAIN_TEMPLATES, "test": HELDOUT_TEMPLATES}
TRAIN_PACKAGES = ("toolkit", "utils", "helpers", "mathkit", "textops", "core", "common", "basics", "smalllib", "misclib")
HELDOUT_PACKAGES = ("quarry", "lattice", "beacon", "cobalt", "tundra", "marlin")
PACKAGES = {"train": TRAIN_PACKAGES, "test": HELDOUT_PACKAGES}
MODULES = {"train": ("ops", "funcs", "calc", "misc", "tools", "basic"), "test": ("kernel", "routines", "procs", "steps")}
N_VISIBLE, N_HIDDEN_RANDOM, N_EXPOSING = 2, 6, 3


def task_ids(split: str, n_tasks: int | None = None) -> list[str]:
    """Task ids of a split (``train``: 600, ``test``: 144 by default; any ``n_tasks`` works).

    Raises:
        ValueError: Unknown split.
    """
    if split not in SPLIT_SIZES:
        raise ValueError(f"unknown split {split!r}; choose from {', '.join(SPLIT_SIZES)}")
    n = SPLIT_SIZES[split] if n_tasks is None else int(n_tasks)
    return [f"swe-{split}-{i:04d}" for i in range(n)]


@dataclass(frozen=True)
class Plan:
    """What a task is made of, drawn from its id: cheap (nothing is run)."""

    task_id: str
    buggy: Rendered
    bug: PBug
    funcs: tuple[Rendered, ...]  # in module order, the buggy one among them
    package: str
    module: str


@functools.lru_cache(maxsize=4096)
def plan(task_id: str) -> Plan:
    """The task's template, bug, renderings and names.

    Raises:
        ValueError: Malformed task id.
    """
    try:
        prefix, split, idx = task_id.split("-")
        index = int(idx)
        templates = TEMPLATES[split]
        if prefix != "swe":
            raise KeyError(prefix)
    except (ValueError, KeyError):
        raise ValueError(f"not a SWE-synthetic-v1 task id: {task_id!r}") from None
    rng = random.Random(f"swe-synthetic-v1:{split}:{index}")
    t: PTemplate = templates[index % len(templates)]
    bug = rng.choice(t.bugs)
    buggy = render(t, rng)
    funcs = [buggy]
    for other in rng.sample([o for o in templates if o is not t], rng.randint(1, 2)):
        funcs.append(render(other, rng, {f.name for f in funcs}))
    rng.shuffle(funcs)
    return Plan(task_id, buggy, bug, tuple(funcs), rng.choice(PACKAGES[split]), rng.choice(MODULES[split]))


def content_keys(task_id: str) -> set[str]:
    """What a held-out task may share with no training task: its templates (the buggy function's and
    its companions') and its package."""
    p = plan(task_id)
    return {f"template:{f.template.key}" for f in p.funcs} | {f"package:{p.package}"}


class _Func:
    """A rendering as v0's test writers want it: a ``name`` and a callable ``fn``."""

    def __init__(self, r: Rendered) -> None:
        self.name, self.fn = r.name, r.function()


def build_task(task_id: str) -> SWETask:
    """Generate the task ``swe-<split>-<index>`` (deterministic)."""
    p = plan(task_id)
    split = task_id.split("-")[1]
    rng = random.Random(f"swe-synthetic-v1:{split}:{task_id}:cases")
    sources = [p.buggy.bugged(p.bug) if f is p.buggy else f.source for f in p.funcs]
    header = f'"""Helper functions: {", ".join(f.name for f in p.funcs)}."""\n\n\n'
    correct = header + "\n\n".join(f.source for f in p.funcs)
    buggy_src = header + "\n\n".join(sources)
    pkg, mod = p.package, p.module
    code_path, visible_path, hidden_path = f"{pkg}/{mod}.py", f"tests/test_{mod}.py", f"tests/test_{mod}_hidden.py"

    (example,) = exposing_inputs(p.buggy, p.bug, random.Random(f"swe-synthetic-v1:{task_id}:example"), 1, [])
    visible_cases = {f.name: _distinct(f, rng, N_VISIBLE) for f in p.funcs}
    hidden_cases = {f.name: _distinct(f, rng, N_HIDDEN_RANDOM) for f in p.funcs}
    shown = [example, *visible_cases[p.buggy.name]]
    hidden_cases[p.buggy.name] = [example, *hidden_cases[p.buggy.name],
                                  *exposing_inputs(p.buggy, p.bug, rng, N_EXPOSING, shown + hidden_cases[p.buggy.name])]
    funcs = [_Func(f) for f in p.funcs]
    shown_keys = {(p.buggy.name, repr(example))} | {(n, repr(a)) for n, cs in visible_cases.items() for a in cs}
    right = funcs[p.funcs.index(p.buggy)].fn
    statement = (
        f"`{p.buggy.name}` in `{code_path}` does not do what its docstring says: "
        f"{p.buggy.doc}\n"
        f"For example, `{p.buggy.name}({', '.join(map(repr, example))})` should return `{right(*example)!r}`.\n"
        f"Fix the bug. The visible tests are in `{visible_path}` (run them with run_tests); "
        "hidden tests check more cases when you submit."
    )
    files = {"README.md": _README.format(pkg=pkg), f"{pkg}/__init__.py": "", code_path: buggy_src,
             visible_path: _test_file(pkg, mod, funcs, visible_cases), "conftest.py": _CONFTEST}
    return SWETask(
        task_id=task_id, statement=statement, files=files,
        hidden_tests={hidden_path: _test_file(pkg, mod, funcs, hidden_cases)},
        gold_edits=make_edits(code_path, buggy_src, correct), test_support=[visible_path, "conftest.py"],
        visible_tests=[visible_path], task_type=p.bug.kind,
        metadata={"function": p.buggy.name, "template": p.buggy.template.key, "bug": p.bug.kind, "package": pkg,
                  "example": list(example)},
        hidden_cases=_case_suite(pkg, mod, funcs, hidden_cases, shown_keys),
    )


def _distinct(r: Rendered, rng: random.Random, n: int) -> list[tuple]:
    """``n`` random valid inputs, distinct where the template allows (a few draws at most)."""
    out: list[tuple] = []
    for _ in range(20 * n):
        args = r.sample(rng)
        if args not in out:
            out.append(args)
            if len(out) == n:
                break
    return out


class SyntheticSWEEnv(SWEEnv):
    """``SWEEnv`` over the generated v1 suite (parametrised templates, held out by template and package).

    Args:
        split: ``train`` (600 tasks) or ``test`` (144).
        n_tasks: Tasks in the split (any number; the templates cycle).
        **kw: ``SWEEnv`` arguments (``sandbox``, ``pool_size``, timeouts, ``tool_format``, ...).
    """

    def __init__(self, split: str = "train", n_tasks: int | None = None, **kw: Any) -> None:
        ids = task_ids(split, n_tasks)  # validates the split before a sandbox provider is made
        super().__init__(suite="synthetic", split=split, n_tasks=0, **kw)
        self.suite = "synthetic-v1"
        self._tasks = {t: functools.partial(build_task, t) for t in ids}
        self.task_ids = list(self._tasks)

    def content_keys(self, task_id: str) -> set[str]:
        """What a held-out task may share with no training task (``turngym.bench.heldout``)."""
        return content_keys(task_id)


def oracle_replies(split: str = "train", tool_format: str = "hermes", n_tasks: int | None = None) -> dict[str, list[str]]:
    """Each task's oracle replies as a policy would write them, in order: one ``edit_file`` call per
    gold edit, then ``submit``. A reply cap shorter than the longest of these cuts some edits."""
    from turngym.tools.formats import get_format
    from turngym.types import ToolCall

    fmt = get_format(tool_format)
    out = {}
    for tid in task_ids(split, n_tasks):
        edits = [{"path": e.path, "old_str": e.old, "new_str": e.new} for e in build_task(tid).gold_edits]
        out[tid] = [fmt.render_call(ToolCall("oracle", "edit_file", e)) for e in edits]
        out[tid].append(fmt.render_call(ToolCall("oracle", "submit", {})))
    return out
