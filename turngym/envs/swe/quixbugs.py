"""QuixBugs as SWE tasks: each Python program with a one-line bug becomes a task.

The repo mirrors QuixBugs' layout (``python_programs/``, ``python_testcases/``,
``json_testcases/``, its ``conftest.py``). The program's pytest file with all its cases is the
hidden test. The visible test is a slice of it: the first JSON cases for data-driven tests, the
first test function otherwise. The corrected program is the oracle patch. The data comes from
``turngym data download quixbugs``, ``$TURNGYM_DATA/quixbugs`` or an explicit ``data_dir``.
"""

from __future__ import annotations

import ast
import json
import zlib
from pathlib import Path

from turngym.envs.swe.task import SWETask, make_edits

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
        test_support=support, visible_tests=[test_path], graded_tests=[test_path],
        task_type="quixbugs", metadata={"program": name, "cases": _count_cases(json_path)},
    )


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
