"""SWE grading pieces: the runner's encoding, the host's decoding and verdict, the report parser
(forged, repeated or unterminated reports), a grade in a fresh local sandbox, and QuixBugs' hidden
tests turned into cases (inputs only in the sandbox; the corrected program gives the expected
values, and they agree with the dataset's)."""

from __future__ import annotations

import ast
import collections
import json

import pytest

from turngym.envs.swe import grading
from turngym.envs.swe.case_runner import Encoder
from turngym.envs.swe.task import CaseSuite, encoded_calls
from turngym.tools.sandbox import make_sandbox

pytestmark = pytest.mark.filterwarnings("ignore::turngym.tools.sandbox.local_backend.UnsafeSandboxWarning")


class Node:
    def __init__(self, value, successor=None):
        self.value, self.successor = value, successor


class FakeInt(int):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


class LyingList(list):
    def __iter__(self):
        return iter([42])


class Slotted:
    __slots__ = ("x",)


def test_encoder_hand_worked():
    enc = Encoder()
    assert enc.encode([1, (2.5, "a"), None, True]) == {"list": [1, {"tuple": [{"float": "2.5"}, "a"]}, None, True]}
    assert enc.encode({"k": {3, 1}}) == {"dict": [["k", {"set": [1, 3]}]]}
    assert enc.encode(float("inf")) == {"float": "inf"}
    # A builtin's subclass is its builtin value, read with the builtin's methods: its own __eq__
    # and __iter__ decide nothing.
    assert enc.encode(FakeInt(3)) == 3
    assert enc.encode(LyingList([1, 2])) == {"list": [1, 2]}
    assert enc.encode(collections.defaultdict(int, {"a": 1})) == {"dict": [["a", 1]]}
    assert enc.encode(collections.namedtuple("P", "x y")(1, 2)) == {"tuple": [1, 2]}
    assert enc.encode(Slotted()) == {"other": "Slotted"}
    a = Node(1)
    b = Node(2, a)
    a.successor = b  # a cycle keeps its shape: refs by first encounter
    assert enc.encode(a) == {"ref": 0}
    assert enc.objs == [{"cls": "Node", "attrs": [["value", 1], ["successor", {"ref": 1}]]},
                        {"cls": "Node", "attrs": [["value", 2], ["successor", {"ref": 0}]]}]


def test_decode_compares_like_python_eq():
    def same(x, y):
        return grading.decode(encoded_calls([x])) == grading.decode(encoded_calls([y]))

    assert same(1, 1.0) and same({"a": 1, "b": 2}, {"b": 2, "a": 1}) and same(True, 1)
    assert not same([1, 2], (1, 2)) and not same([1, 2], [2, 1]) and not same("1", 1)
    assert same(FakeInt(5), 5) and not same(FakeInt(5), 6) and not same(None, False)  # its __eq__ gains nothing
    assert same(collections.defaultdict(list, {1: [2]}), {1: [2]})
    assert not same(Slotted(), Slotted())  # an unreadable value equals nothing, not even itself
    with pytest.raises(ValueError, match="cannot compare"):
        grading.check_gradable(encoded_calls([Slotted()]))
    with pytest.raises(ValueError):
        grading.decode({"calls": [{"nonsense": 1}]})


SUITE = CaseSuite("", ("case_0", "case_1"), ("f",), (encoded_calls([3]), encoded_calls([[1, 2]])))


def line(nonce, obj):
    return f"{nonce} {json.dumps(obj)}"


def ok(i, value):
    return {"case": i, "status": "ok", "result": encoded_calls([value])}


def test_every_synthetic_expected_value_is_gradable():
    from turngym.envs.swe.synthetic import synthetic_task, synthetic_task_ids

    for tid in synthetic_task_ids("train") + synthetic_task_ids("test"):
        suite = synthetic_task(tid).hidden_cases
        assert len(suite.expected) == len(suite.cases) >= 8
        for case, record in zip(suite.cases, suite.expected):
            grading.check_gradable(record, case)


def test_report_parsing_and_verdict():
    n = "ab" * 16
    good = "\n".join([line(n, ok(0, 3)), "noise the agent printed", line(n, ok(1, [1, 2])), line(n, {"done": True})])
    assert grading.judge(SUITE, grading.parse_report(good, n, 2)) == (True, "2/2 hidden cases passed")
    wrong = good.replace("[1, 2]", "[2, 1]")
    passed, summary = grading.judge(SUITE, grading.parse_report(wrong, n, 2))
    assert not passed and summary == "1/2 hidden cases passed; first failure: case 2: returned a different value"
    # Another nonce, a case reported twice, or no done line: the report counts for nothing.
    assert grading.parse_report(good.replace(n, "cd" * 16), n, 2) == [None, None]
    twice = "\n".join([line(n, ok(0, 3)), line(n, ok(0, 3)), line(n, ok(1, [1, 2])), line(n, {"done": True})])
    assert grading.parse_report(twice, n, 2) == [None, None]
    assert grading.parse_report(good.rsplit("\n", 1)[0], n, 2) == [None, None]
    timeout = "\n".join([line(n, ok(0, 3)), line(n, {"case": 1, "status": "timeout", "error": "x"}),
                         line(n, {"done": True})])
    assert grading.judge(SUITE, grading.parse_report(timeout, n, 2))[1].endswith("case 2: timeout")


CASES = CaseSuite(
    "from pkg.mod import f\n\ndef case_0():\n    f(2)\n\ndef case_1():\n    f(5)\n", ("case_0", "case_1"), ("f",),
    (encoded_calls([4]), encoded_calls([25])))
PRINTS = "import sys\nprint('x', file=sys.stderr)\n"


@pytest.mark.parametrize("body, passes, why", [
    ("def f(x):\n    print('noise')\n    return x * x\n", True, ""),
    ("def f(x):\n    return x + x\n", False, "case 2: returned a different value"),
    ("def f(x):\n    raise KeyError(x)\n", False, "case 1: error: KeyError"),
    ("def f(x):\n    while True:\n        pass\n", False, "case 1: timeout"),
    ("import os\nos._exit(0)\ndef f(x):\n    return x * x\n", False, "case 1: error: the case exited without"),
])
def test_grade_in_a_fresh_local_sandbox(body, passes, why):
    with make_sandbox("local") as box:
        ok_, summary = grading.grade_in_fresh_sandbox(box, CASES, {"pkg/__init__.py": "", "pkg/mod.py": body}, 1.0, 30)
    assert ok_ is passes and why in summary, summary


def test_collect_sources_takes_only_the_allow_list():
    with make_sandbox("local") as box:
        box.put_files({"pkg/mod.py": "x = 1\n", "conftest.py": "evil", "pkg/sitecustomize.py": "evil"})
        box.exec("ln -s /etc/hostname pkg/link.py")
        assert grading.collect_sources(box, ["pkg/mod.py", "pkg/missing.py"]) == {"pkg/mod.py": "x = 1\n"}


# ----- QuixBugs as cases --------------------------------------------------------------------
@pytest.fixture
def qb(shared_data):
    root = shared_data / "quixbugs"
    if not (root / "python_programs").is_dir():
        pytest.skip(f"no QuixBugs copy in {shared_data}")
    return root


def _asserted_literals(test_src: str) -> set[str]:
    """Literal values the test asserts against: in asserts, or assigned to a name an assert reads."""
    tree = ast.parse(test_src)
    asserts = [n for n in ast.walk(tree) if isinstance(n, ast.Assert)]
    names = {n.id for a in asserts for n in ast.walk(a) if isinstance(n, ast.Name)}
    exprs = [n for a in asserts for n in ast.walk(a) if isinstance(n, ast.expr)]
    exprs += [n.value for n in ast.walk(tree) if isinstance(n, ast.Assign) and len(n.targets) == 1
              and isinstance(n.targets[0], ast.Name) and n.targets[0].id in names]
    out = set()
    for e in exprs:
        try:
            ast.literal_eval(e)
        except ValueError:
            continue
        out.add(ast.unparse(e))
    return out


def _json_inputs(module: str) -> list:
    """The inputs a JSON task's case module loads (``_INPUTS = json.loads('...')``)."""
    for node in ast.parse(module).body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "_INPUTS":
            return json.loads(ast.literal_eval(node.value.args[0]))
    raise AssertionError("no _INPUTS in the case module")


def test_quixbugs_cases_hold_inputs_only_and_agree_with_the_dataset(qb):
    from turngym.envs.swe.quixbugs import quixbugs_task, quixbugs_task_ids

    for tid in quixbugs_task_ids(qb, "all"):
        task = quixbugs_task(qb, tid)
        name = tid.removeprefix("quixbugs-")
        suite, test_src = task.hidden_cases, (qb / "python_testcases" / f"test_{name}.py").read_text()
        assert len(suite.expected) == len(suite.cases) > 0 and "assert" not in suite.module
        json_path = qb / "json_testcases" / f"{name}.json"
        if "load_json_testcases" in test_src:
            rows = [json.loads(ln) for ln in json_path.read_text().splitlines() if ln.strip()]
            inputs = _json_inputs(suite.module)
            kept = [r for r in rows if r[0] in inputs]
            assert inputs == [r[0] for r in kept] and len(kept) == len(suite.cases) >= len(rows) - 1  # one skip
            for (_, want), exp in zip(kept, suite.expected):  # the corrected program returns the dataset's answers
                (got,), _ = grading.decode(exp)
                assert json.loads(json.dumps(got)) == want, (tid, got, want)
        else:
            lits = _asserted_literals(test_src)
            assert name != "shortest_paths" or len([x for x in lits if len(x) > 20]) == 2  # it sees them
            for lit in lits:  # no asserted value reaches the sandbox
                assert len(lit) < 3 or lit not in suite.module, (tid, lit)


def test_a_noisy_fix_still_passes():
    """Megabytes on stdout/stderr from the agent's code are cut from the log, not from the results."""
    body = "import sys\ndef f(x):\n    print('y' * 3_000_000)\n    sys.stderr.write('z' * 3_000_000)\n    return x * x\n"
    with make_sandbox("local") as box:
        ok_, summary = grading.grade_in_fresh_sandbox(box, CASES, {"pkg/__init__.py": "", "pkg/mod.py": body}, 5.0, 60)
    assert ok_, summary
