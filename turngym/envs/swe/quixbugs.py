"""QuixBugs as SWE tasks: each Python program with a one-line bug becomes a task.

The repo mirrors QuixBugs' layout (``python_programs/``, ``python_testcases/``,
``json_testcases/``, its ``conftest.py``). The program's pytest file with all its cases is the
hidden test. The visible test is a slice of it: the first JSON cases for data-driven tests, the
first test function otherwise. The corrected program is the oracle patch.

Grading runs the hidden tests as cases (``hidden_cases``): the JSON inputs, or each test function
with its assertions and the values only they use taken out, so the sandbox sees inputs only. The
expected values are what the corrected program returns on the same cases (computed on the host
when the task is built). A case passes when every call returns a value ``==`` to the reference's,
which is at least as strict as the original assertions. The data comes from
``turngym data download quixbugs``, ``$TURNGYM_DATA/quixbugs`` or an explicit ``data_dir``.
"""

from __future__ import annotations

import ast
import json
import zlib
from pathlib import Path

from turngym.envs.swe.task import CaseSuite, SWETask, make_edits

VISIBLE_JSON_CASES = 2
SPLITS = ("train", "test", "all")


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


def quixbugs_task(root: Path, task_id: str) -> SWETask:
    """Build the task for ``quixbugs-<program>``.

    Raises:
        KeyError: No such program in ``root``.
    """
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
        hidden_cases=quixbugs_cases(root, name, test_src, fixed, {p: files[p] for p in ("node.py",) if p in files}),
    )


def quixbugs_cases(root: Path, name: str, test_src: str, fixed: str, support: dict[str, str]) -> CaseSuite:
    """The hidden tests of ``name`` as cases, with the corrected program's results as expected values.

    Raises:
        NotImplementedError: The test file has a shape this conversion does not know.
        RuntimeError: The corrected program fails a case.
    """
    from turngym.envs.swe.grading import reference_results

    json_path = root / "json_testcases" / f"{name}.json"
    if "load_json_testcases" in test_src:
        module, cases = _json_cases(name, test_src, json_path)
    else:
        module, cases = _code_cases(name, test_src)
    suite = CaseSuite(module, tuple(cases), (name,), support=support)
    expected = reference_results(suite, {f"python_programs/{name}.py": fixed})
    return CaseSuite(module, tuple(cases), (name,), expected, support)


def _json_cases(name: str, test_src: str, json_path: Path) -> tuple[str, list[str]]:
    """One case per JSON row, calling ``name(*input)``; the rows the test skips are left out."""
    if f"{name}(*input_data)" not in test_src:
        raise NotImplementedError(f"{name}: the test does not call {name}(*input_data)")
    skipped = _skipped_inputs(test_src)
    rows = [json.loads(ln) for ln in json_path.read_text().splitlines() if ln.strip()]
    inputs = [row[0] for row in rows if row is not None and row[0] not in skipped]
    lines = ["import json", f"from python_programs.{name} import {name}", "",
             f"_INPUTS = json.loads({json.dumps(inputs)!r})", ""]
    cases = []
    for i in range(len(inputs)):
        cases.append(f"case_{i}")
        lines += ["", f"def case_{i}():", f"    {name}(*_INPUTS[{i}])", ""]
    return "\n".join(lines), cases


def _skipped_inputs(test_src: str) -> list:
    """Inputs the test skips with ``if input_data == <literal>: pytest.skip(...)``."""
    out = []
    for node in ast.walk(ast.parse(test_src)):
        if isinstance(node, ast.If) and "pytest.skip" in ast.unparse(node.body[0]):
            t = node.test
            if not (isinstance(t, ast.Compare) and isinstance(t.left, ast.Name) and t.left.id == "input_data"
                    and len(t.ops) == 1 and isinstance(t.ops[0], ast.Eq)):
                raise NotImplementedError(f"a skip condition this conversion does not know: {ast.unparse(t)}")
            out.append(ast.literal_eval(t.comparators[0]))
    return out


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
