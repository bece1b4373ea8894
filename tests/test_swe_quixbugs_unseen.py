"""QuixBugs-shaped data no run has seen, made here (no third-party code): a JSON test with an
``if not pytest.run_slow and ...`` skip, a program that returns a ``defaultdict``, and a test
shape the conversion does not know. The first two build and play; the third leaves the task list
with one warning naming it."""

from __future__ import annotations

import json
import textwrap
import warnings

import pytest

import turngym
from turngym.agents.scripted import OracleAgent
from turngym.data import forget_warnings
from turngym.envs.swe import grading
from turngym.envs.swe.quixbugs import quixbugs_tasks
from turngym.rollout import episode_specs, make_env_factory, rollout

pytestmark = pytest.mark.filterwarnings("ignore::turngym.tools.sandbox.local_backend.UnsafeSandboxWarning")

CONFTEST = """import pytest


def pytest_addoption(parser):
    parser.addoption("--correct", action="store_true")
    parser.addoption("--runslow", action="store_true")


def pytest_configure(config):
    pytest.use_correct = config.getoption("--correct")
    pytest.run_slow = config.getoption("--runslow")
"""
LOADER = """import json
from pathlib import Path


def load_json_testcases(name):
    with open(Path(__file__).parent / ".." / f"json_testcases/{name}.json") as f:
        return [json.loads(line) for line in f]
"""
PACK = """def pack(capacity, items):
    best = [0] * (capacity + 1)
    for weight, value in items:
        for c in range(capacity, weight - 1, -1):
            best[c] = max(best[c], best[c - weight] + value)
    return best[{last}]
"""
PACK_TEST = """import pytest
from load_testdata import load_json_testcases

if pytest.use_correct:
    from correct_python_programs.pack import pack
else:
    from python_programs.pack import pack

testdata = load_json_testcases(pack.__name__)


@pytest.mark.parametrize("input_data,expected", testdata)
def test_pack(input_data, expected):
    if not pytest.run_slow and (input_data[0] == 100000 and len(input_data[1]) == 3):
        pytest.skip("Takes too long")
    assert pack(*input_data) == expected
"""
PACK_ROWS = [[[10, [[5, 10], [4, 40], [6, 30], [3, 50]]], 90], [[4, [[2, 3], [2, 4]]], 7],
             [[100000, [[1, 1], [2, 2], [3, 3]]], 6], [[7, [[3, 4], [4, 5], [2, 3]]], 9], [[0, [[1, 1]]], 0],
             [[9, [[9, 10], [8, 9], [1, 2]]], 11]]
HOPS = """from collections import defaultdict


def hops(n, edges):
    dist = defaultdict(lambda: float("inf"))
    for i in range(n):
        dist[i, i] = 0
    for (u, v), w in edges.items():
        dist[u, v] = w
    for k in range(n):
        for i in range(n):
            for j in range(n):
                dist[i, j] = min(dist[i, j], dist[i, k] + dist[{kj}])
    return dist
"""
HOPS_TEST = """import pytest

if pytest.use_correct:
    from correct_python_programs.hops import hops
else:
    from python_programs.hops import hops


def test1():
    \"\"\"A path of three.\"\"\"
    result = hops(3, {(0, 1): 1, (1, 2): 2})
    assert result[0, 2] == 3


def test2():
    \"\"\"A shortcut that is longer.\"\"\"
    edges = {(0, 1): 4, (1, 2): 1, (0, 2): 9, (2, 3): 1}
    result = hops(4, edges)
    expected = {(0, 3): 6}
    assert result[0, 3] == expected[(0, 3)]


def test3():
    result = hops(3, {(0, 1): 1, (1, 2): 1, (0, 2): 5})
    assert dict(result)[0, 2] == 2
"""
ODD_TEST = """import pytest
from python_programs.odd import odd


def test_odd(tmp_path):
    assert odd(3)
"""


def make_root(tmp_path):
    root = tmp_path / "quixbugs"
    for d in ("python_programs", "correct_python_programs", "python_testcases", "json_testcases"):
        (root / d).mkdir(parents=True)
    (root / "conftest.py").write_text(CONFTEST)
    (root / "python_testcases" / "load_testdata.py").write_text(LOADER)
    files = {
        "python_programs/pack.py": PACK.format(last="capacity - 1"),  # the bug: one short
        "correct_python_programs/pack.py": PACK.format(last="capacity"),
        "python_testcases/test_pack.py": PACK_TEST,
        "json_testcases/pack.json": "\n".join(json.dumps(r) for r in PACK_ROWS) + "\n",
        "python_programs/hops.py": HOPS.format(kj="j, k"),  # the bug: the second leg runs backwards
        "correct_python_programs/hops.py": HOPS.format(kj="k, j"),
        "python_testcases/test_hops.py": HOPS_TEST,
        "python_programs/odd.py": "def odd(n):\n    return n % 2 == 0\n",
        "correct_python_programs/odd.py": "def odd(n):\n    return n % 2 == 1\n",
        "python_testcases/test_odd.py": ODD_TEST,
    }
    for path, text in files.items():
        (root / path).write_text(textwrap.dedent(text))
    return root


def test_unseen_programs_build_or_leave_with_one_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("TURNGYM_CACHE", str(tmp_path / "cache"))
    forget_warnings()
    root = make_root(tmp_path)
    with pytest.warns(UserWarning, match="quixbugs-odd is left out") as record:
        tasks = quixbugs_tasks(root, "all")
    assert len([w for w in record if "left out" in str(w.message)]) == 1
    assert sorted(tasks) == ["quixbugs-hops", "quixbugs-pack"]
    pack = tasks["quixbugs-pack"].hidden_cases
    assert len(pack.cases) == len(PACK_ROWS) - 1  # the slow row is skipped, as a plain pytest run skips it
    assert "100000" not in pack.module and pack.shown == ("case_0", "case_1")  # the two visible rows
    hops = tasks["quixbugs-hops"].hidden_cases
    assert hops.cases == ("test1", "test2", "test3") and hops.shown == ("test1",)
    grading.check_gradable(hops.expected[0])  # a defaultdict is compared as the dict it holds
    for task in tasks.values():
        caught, why = grading.hidden_cases_catch_the_bug(task.hidden_cases, {p: task.files[p] for p in task.source_files})
        assert caught, why
    with warnings.catch_warnings(record=True) as again:  # a second env in this process: no new warning
        warnings.simplefilter("always")
        assert sorted(quixbugs_tasks(root, "all")) == sorted(tasks)
    assert again == []


def test_unseen_programs_play_as_episodes(tmp_path, monkeypatch):
    monkeypatch.setenv("TURNGYM_CACHE", str(tmp_path / "cache"))
    root = make_root(tmp_path)
    kw = dict(split="all", data_dir=str(root.parent), sandbox="local", scripted_hints=True, pool_size=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = turngym.make("turngym/SWE-quixbugs-v0", **kw)
    ids = list(env.unwrapped.task_ids)
    env.close()
    assert ids == ["quixbugs-hops", "quixbugs-pack"]  # the one that cannot be built is not an episode
    trajs = rollout(OracleAgent(), make_env_factory("turngym/SWE-quixbugs-v0", **kw), episode_specs(ids, len(ids)),
                    num_envs=1, progress=False)
    assert {t.task_id: t.outcome for t in trajs} == {t: 1.0 for t in ids}
