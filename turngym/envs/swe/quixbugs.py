"""QuixBugs as SWE tasks: each Python program with a one-line bug becomes a task.

The repo mirrors QuixBugs' layout (``python_programs/``, ``python_testcases/``,
``json_testcases/``, its ``conftest.py``). The program's pytest file with all its cases is the
hidden test. The visible test is a slice of it: the first JSON cases for data-driven tests, the
first test function otherwise. The corrected program is the oracle patch.

Grading runs the hidden tests as cases (``hidden_cases``): the JSON inputs, or each test function
with its assertions and the values only they use taken out, so the sandbox sees inputs only. The
expected values are what the corrected program returns on the same cases (computed on the host
when the task is built). A case passes when every call returns a value ``==`` to the reference's,
which is at least as strict as the original assertions (a ``defaultdict`` or a named tuple
compares as the plain value it holds). The data comes from ``turngym data download quixbugs``,
``$TURNGYM_DATA/quixbugs`` or an explicit ``data_dir``.

``quixbugs_tasks`` builds a split at once: a program whose tests this conversion does not know,
or whose reference cannot be graded, is left out with one warning naming it, instead of failing
later as an episode. Built tasks are kept for the process, and the reference's results on disk
(keyed by the files' content), so a second env or a second run starts at once.
"""

from __future__ import annotations

import ast
import hashlib
import json
import subprocess
import zlib
from pathlib import Path

from turngym.data import cache_root, warn_once
from turngym.envs.swe.task import CaseSuite, SWETask, make_edits

VISIBLE_JSON_CASES = 2
SPLITS = ("train", "test", "all")
_BUILT: dict[tuple[str, str], SWETask] = {}  # (root, task id) -> task, for this process
# What building a program can fail with: a test shape this conversion does not know, a reference
# that fails or returns what no answer can equal, a file that does not parse or read.
BUILD_ERRORS = (NotImplementedError, RuntimeError, ValueError, SyntaxError, KeyError, OSError,
                subprocess.TimeoutExpired)


def quixbugs_root(data_dir: str | Path | None = None) -> Path:
    """The QuixBugs folder (holding ``python_programs/``).

    Raises:
        turngym.data.DataNotFound: No copy found; the message says how to get one.
    """
    from turngym.data import dataset_path

    return dataset_path("quixbugs", data_dir)


def quixbugs_programs(root: Path) -> list[str]:
    """Programs that have a buggy version, a corrected version and a pytest file."""
    out = []
    for p in sorted((root / "python_programs").glob("*.py")):
        name = p.stem
        if (root / "correct_python_programs" / p.name).exists() and (root / "python_testcases" / f"test_{name}.py").exists():
            out.append(name)
    return out


def quixbugs_task_ids(root: Path, split: str) -> list[str]:
    """Task ids of a split: a fixed hash split of the programs into train / test, or ``all``."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
    names = quixbugs_programs(root)
    if split != "all":  # crc32 of the name: stable across runs and machines, unlike hash()
        names = [n for n in names if (zlib.crc32(n.encode()) % 2 == 1) == (split == "test")]
    return [f"quixbugs-{n}" for n in names]


def quixbugs_tasks(root: Path, split: str, n_tasks: int | None = None) -> dict[str, SWETask]:
    """The tasks of a split (the first ``n_tasks`` programs), built now; a program that cannot be
    built is left out, with one warning naming it and why.

    Raises:
        ValueError: Unknown split.
    """
    ids = quixbugs_task_ids(root, split)
    out = {}
    for tid in ids if n_tasks is None else ids[:n_tasks]:
        try:
            out[tid] = quixbugs_task(root, tid)
        except BUILD_ERRORS as e:
            warn_once(f"QuixBugs: {tid} is left out: it cannot be made into a task ({type(e).__name__}: {str(e)[:300]})")
    return out


def quixbugs_task(root: Path, task_id: str) -> SWETask:
    """Build the task for ``quixbugs-<program>`` (kept for the process once built).

    Raises:
        KeyError: No such program in ``root``.
        NotImplementedError, RuntimeError, ValueError: The program cannot be made into a task
            (see ``BUILD_ERRORS``).
    """
    key = (str(Path(root).resolve()), task_id)
    if key not in _BUILT:
        _BUILT[key] = _build_task(Path(root), task_id)
    return _BUILT[key]


def _build_task(root: Path, task_id: str) -> SWETask:
    name = task_id.removeprefix("quixbugs-")
    if name not in quixbugs_programs(root):
        raise KeyError(f"{task_id!r}: no QuixBugs program {name!r} in {root}")
    buggy = (root / "python_programs" / f"{name}.py").read_text()
    fixed = (root / "correct_python_programs" / f"{name}.py").read_text()
    test_path = f"python_testcases/test_{name}.py"
    test_src = (root / test_path).read_text()
    files = {f"python_programs/{name}.py": buggy, "conftest.py": (root / "conftest.py").read_text()}
    support = ["conftest.py"]
    if "from node import" in test_src or "import node" in test_src:
        node = root / "python_testcases" / "node.py"
        files["node.py"] = (node if node.exists() else root / "python_programs" / "node.py").read_text()
        support.append("node.py")
    hidden = {test_path: test_src}
    json_path = root / "json_testcases" / f"{name}.json"
    if "load_json_testcases" in test_src and json_path.exists():
        loader = "python_testcases/load_testdata.py"
        files[loader] = (root / loader).read_text()
        rows = [ln for ln in json_path.read_text().splitlines() if ln.strip()]
        files[f"json_testcases/{name}.json"] = "\n".join(rows[:VISIBLE_JSON_CASES]) + "\n"
        hidden[f"json_testcases/{name}.json"] = json_path.read_text()
        files[test_path] = test_src
        support += [loader, f"json_testcases/{name}.json"]
    else:
        files[test_path] = first_test_only(test_src)
    support.append(test_path)
    statement = (
        f"The program `python_programs/{name}.py` (from QuixBugs) has a bug: it does not do what its "
        f"documentation says. Find and fix it; the fix is small.\nThe visible tests are in `{test_path}` "
        "(run them with run_tests); hidden tests with more cases run when you submit."
    )
    return SWETask(
        task_id=task_id, statement=statement, files=files, hidden_tests=hidden,
        gold_edits=make_edits(f"python_programs/{name}.py", buggy, fixed),
        test_support=support, visible_tests=[test_path],
        task_type="quixbugs", metadata={"program": name, "cases": _count_cases(json_path)},
        hidden_cases=quixbugs_cases(root, name, test_src, fixed, {p: files[p] for p in ("node.py",) if p in files},
                                    visible=files[test_path] if f"json_testcases/{name}.json" not in files else
                                    files[f"json_testcases/{name}.json"]),
    )


def quixbugs_cases(root: Path, name: str, test_src: str, fixed: str, support: dict[str, str],
                   visible: str = "") -> CaseSuite:
    """The hidden tests of ``name`` as cases, with the corrected program's results as expected values.

    Args:
        visible: What the agent sees of the tests (the visible JSON rows, or the visible test
            file): the cases it shows are marked ``shown``.

    Raises:
        NotImplementedError: The test file has a shape this conversion does not know.
        RuntimeError: The corrected program fails a case.
        ValueError: The corrected program returns a value the grader cannot compare.
    """
    json_path = root / "json_testcases" / f"{name}.json"
    if "load_json_testcases" in test_src:
        module, cases, inputs = _json_cases(name, test_src, json_path)
        shown_inputs = [json.loads(ln)[0] for ln in visible.splitlines() if ln.strip() and json.loads(ln) is not None]
        shown = tuple(c for c, x in zip(cases, inputs) if x in shown_inputs)
    else:
        module, cases = _code_cases(name, test_src)
        shown = tuple(c for c in cases if f"def {c}(" in visible)
    suite = CaseSuite(module, tuple(cases), (name,), support=support)
    expected, cpu_s = _reference(suite, {f"python_programs/{name}.py": fixed})
    return CaseSuite(module, tuple(cases), (name,), expected, support, shown, cpu_s)


def _reference(suite: CaseSuite, files: dict[str, str]) -> tuple[tuple[dict, ...], tuple[float, ...]]:
    """``reference_results``, kept on disk by the content of everything that decides them."""
    from turngym.envs.swe.grading import RUNNER_SOURCE, reference_results

    h = hashlib.sha256()
    for part in (RUNNER_SOURCE, suite.module, json.dumps([suite.cases, suite.targets]), json.dumps(suite.support, sort_keys=True),
                 json.dumps(files, sort_keys=True)):
        h.update(part.encode() + b"\0")
    path = cache_root() / "swe" / "quixbugs" / f"{h.hexdigest()[:32]}.json"
    try:
        cached = json.loads(path.read_text())
        return tuple(cached["expected"]), tuple(cached["cpu_s"])
    except (OSError, ValueError, KeyError):
        pass
    expected, cpu_s = reference_results(suite, files)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{id(suite)}")
        tmp.write_text(json.dumps({"expected": expected, "cpu_s": cpu_s}))
        tmp.replace(path)
    except OSError:
        pass  # a read-only cache only costs the next build its time
    return expected, cpu_s


def _json_cases(name: str, test_src: str, json_path: Path) -> tuple[str, list[str], list]:
    """One case per JSON row, calling ``name(*input)``; the rows the test skips are left out."""
    if f"{name}(*input_data)" not in test_src:
        raise NotImplementedError(f"{name}: the test does not call {name}(*input_data)")
    skips = _skip_conditions(test_src)
    rows = [json.loads(ln) for ln in json_path.read_text().splitlines() if ln.strip()]
    inputs = [row[0] for row in rows if row is not None and not any(_holds(c, row[0], row[1]) for c in skips)]
    lines = ["import json", f"from python_programs.{name} import {name}", "",
             f"_INPUTS = json.loads({json.dumps(inputs)!r})", ""]
    cases = []
    for i in range(len(inputs)):
        cases.append(f"case_{i}")
        lines += ["", f"def case_{i}():", f"    {name}(*_INPUTS[{i}])", ""]
    return "\n".join(lines), cases, inputs


def _skip_conditions(test_src: str) -> list[ast.expr]:
    """The conditions of ``if <condition>: pytest.skip(...)`` in the test."""
    out = []
    for node in ast.walk(ast.parse(test_src)):
        if isinstance(node, ast.If) and node.body and "pytest.skip" in ast.unparse(node.body[0]):
            _holds(node.test, None, None, check_only=True)  # a shape this evaluator does not know fails now
            out.append(node.test)
    return out


_FLAGS = {"pytest.run_slow": False, "pytest.use_correct": False}  # as a plain `pytest` run sets them
_CMP = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b, ast.Lt: lambda a, b: a < b,
        ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b,
        ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}


def _holds(node: ast.expr, input_data, expected, check_only: bool = False):
    """Evaluate a skip condition on one row, without ``eval``: literals, ``input_data`` and
    ``expected``, ``pytest.run_slow`` / ``use_correct`` (False), ``not``/``and``/``or``,
    comparisons, indexing and ``len``. With ``check_only``, only check the shape.

    Raises:
        NotImplementedError: Anything else.
    """
    def ev(n):
        if isinstance(n, ast.Constant):
            return n.value
        if isinstance(n, ast.Name) and n.id in ("input_data", "expected"):
            return None if check_only else (input_data if n.id == "input_data" else expected)
        if isinstance(n, ast.Attribute) and ast.unparse(n) in _FLAGS:
            return _FLAGS[ast.unparse(n)]
        if isinstance(n, (ast.List, ast.Tuple)):
            return [ev(e) for e in n.elts]
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.Not, ast.USub)):
            v = ev(n.operand)
            return None if check_only else (not v if isinstance(n.op, ast.Not) else -v)
        if isinstance(n, ast.BoolOp):
            vals = [ev(v) for v in n.values] if check_only else None
            if check_only:
                return vals
            if isinstance(n.op, ast.And):
                return all(ev(v) for v in n.values)
            return any(ev(v) for v in n.values)
        if isinstance(n, ast.Compare) and all(type(o) in _CMP for o in n.ops):
            left, rights = ev(n.left), [ev(c) for c in n.comparators]
            if check_only:
                return None
            for op, right in zip(n.ops, rights):
                if not _CMP[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(n, ast.Subscript) and not isinstance(n.slice, ast.Slice):
            v, k = ev(n.value), ev(n.slice)
            return None if check_only else v[k]
        if isinstance(n, ast.Call) and ast.unparse(n.func) == "len" and len(n.args) == 1 and not n.keywords:
            v = ev(n.args[0])
            return None if check_only else len(v)
        raise NotImplementedError(f"a skip condition this conversion does not know: {ast.unparse(node)}")

    try:
        return ev(node)
    except (TypeError, IndexError, KeyError):  # the condition does not apply to this row's shape
        return False


def _code_cases(name: str, test_src: str) -> tuple[str, list[str]]:
    """The test module with the candidate imported, and each test function's assertions (and
    the assignments only they read) removed: it builds the inputs and makes the calls."""
    tree = ast.parse(test_src)
    body, cases = [], []
    for node in tree.body:
        if isinstance(node, ast.Import) and [a.name for a in node.names] == ["pytest"]:
            continue
        if isinstance(node, ast.If) and ast.unparse(node.test) == "pytest.use_correct":
            body += node.orelse  # the buggy-program import: the agent's file
            continue
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            if node.decorator_list or node.args.args:
                raise NotImplementedError(f"{name}: test {node.name} takes fixtures or parameters")
            node.body = _without_checks(node.body)
            cases.append(node.name)
        body.append(node)
    tree.body = body
    src = ast.unparse(ast.fix_missing_locations(tree))
    if "pytest" in src or not cases:
        raise NotImplementedError(f"{name}: the test file has a shape this conversion does not know")
    return src + "\n", cases


def _without_checks(stmts: list[ast.stmt]) -> list[ast.stmt]:
    """``stmts`` without docstrings and asserts, then without call-free assignments nothing reads
    (``expected = [...]``): what is left builds inputs and calls."""
    class Strip(ast.NodeTransformer):
        def visit_Assert(self, node):
            return None

    fn = ast.Module(body=[s for s in stmts if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))],
                    type_ignores=[])
    fn = Strip().visit(fn)
    while True:
        read = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        keep = [s for s in fn.body if not (
            isinstance(s, ast.Assign) and all(isinstance(t, ast.Name) and t.id not in read for t in s.targets)
            and not any(isinstance(n, ast.Call) for n in ast.walk(s.value)))]
        if len(keep) == len(fn.body):
            break
        fn.body = keep
    for node in ast.walk(fn):  # a block left empty by the stripping still needs a statement
        for attr in ("body", "orelse"):
            if attr in node._fields and isinstance(getattr(node, attr), list) and not getattr(node, attr) \
                    and not (attr == "orelse" or isinstance(node, ast.Module)):
                setattr(node, attr, [ast.Pass()])
    return fn.body or [ast.Pass()]


def first_test_only(src: str) -> str:
    """``src`` with every top-level ``test*`` function but the first removed."""
    tree = ast.parse(src)
    seen = False
    body = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            if seen:
                continue
            seen = True
        body.append(node)
    tree.body = body
    return ast.unparse(tree) + "\n"


def _count_cases(json_path: Path) -> int | None:
    if not json_path.exists():
        return None
    return sum(1 for ln in json_path.read_text().splitlines() if ln.strip() and json.loads(ln) is not None)
