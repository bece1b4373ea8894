"""SQL envs: execution accuracy, sandbox isolation, oracle vs random, Spider loader."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

import turngym
from turngym.agents.scripted import OracleAgent, RandomAgent
from turngym.envs.sql.accuracy import results_match, row_f1
from turngym.envs.sql.sandbox import ReadOnlyDB, SQLError
from turngym.envs.sql.synthetic import build_suite
from turngym.rollout import episode_specs, make_env_factory, rollout


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("TURNGYM_CACHE", str(tmp_path_factory.getbasetemp() / "sql-cache"))


def _sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# ----- execution accuracy (the official evaluator's cases are in test_sql_accuracy.py) -------------
def test_results_match_rule():
    assert results_match([(1,), (2,), (2,)], [(2,), (1,), (2,)], ordered=False)
    assert not results_match([(1,), (2,)], [(1,), (2,), (2,)], ordered=False)  # multiset, not set
    assert not results_match([(2,), (1,)], [(1,), (2,)], ordered=True)
    assert results_match([(3, 0.5)], [(3.0, 0.5)], ordered=True)  # 3 == 3.0, as in Python
    assert not results_match([(3, 0.1 + 0.2)], [(3, 0.3)], ordered=True)  # no rounding (official rule)
    assert results_match([(1, 2)], [(2, 1)], ordered=False)  # column order is ignored by default...
    assert not results_match([(1, 2)], [(2, 1)], ordered=False, strict=True)  # ...but not when strict


def test_row_f1_by_hand():
    # pred {a, a, b}, gold {a, b, c}: overlap 2 -> P = 2/3, R = 2/3, F1 = 2/3
    assert row_f1([("a",), ("a",), ("b",)], [("a",), ("b",), ("c",)]) == pytest.approx(2 / 3)
    assert row_f1([], []) == 1.0 and row_f1([(1,)], [(2,)]) == 0.0


# ----- isolation -------------------------------------------------------------------------------
ATTACKS = [
    "DROP TABLE customers",
    "ATTACH DATABASE 'evil.db' AS evil",
    "PRAGMA writable_schema = ON",
    "DELETE FROM customers",
    "UPDATE products SET price = 0",
    "INSERT INTO customers VALUES (999, 'x', 'y', 2000)",
    "CREATE TABLE t(x)",
    "PRAGMA journal_mode = WAL",
    "VACUUM",
    "SELECT 1; DELETE FROM customers",
]


def _shop_env(**kw):
    env = turngym.make("turngym/SQL-synthetic-v1", split="all", **kw).unwrapped
    task = next(t for t in env.task_ids if t.startswith("shop-"))
    env.reset(seed=0, options={"task_id": task})
    return env


@pytest.mark.parametrize("tool", ["execute_sql", "submit"])
def test_attacks_leave_source_db_byte_identical(tool):
    env = _shop_env(timeout_s=0.3)
    path = env.tasks[env.task_id].db_path
    before = _sha(path)
    for sql in ATTACKS:
        obs, reward, terminated, _, info = env.step(f"<{tool}>{sql}</{tool}>")
        assert info["action_valid"] is False and not terminated and reward == 0.0
        assert obs[0].content.startswith("Error"), (sql, obs[0].content)
    obs, *_ = env.step("<execute_sql>SELECT COUNT(*) FROM customers</execute_sql>")
    assert "60" in obs[0].content  # nothing was deleted
    assert _sha(path) == before
    assert not (Path(path).parent / "evil.db").exists()


def test_endless_recursive_cte_times_out_with_error_observation():
    env = _shop_env(timeout_s=0.3)
    path = env.tasks[env.task_id].db_path
    before = _sha(path)
    endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT COUNT(*) FROM c"
    obs, reward, terminated, _, info = env.step(f"<execute_sql>{endless}</execute_sql>")
    assert "timed out" in obs[0].content and info["action_valid"] is False and not terminated
    # an endless stream of rows is cut by the row cap instead of running forever
    obs, *_ = env.step("<execute_sql>WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c</execute_sql>")
    assert "more rows were cut" in obs[0].content
    obs, *_ = env.step(f"<submit>{endless}</submit>")
    assert "timed out" in obs[0].content
    assert _sha(path) == before


def test_read_only_db_denies_writes_directly(tmp_path):
    tasks = build_suite(0, folder=tmp_path)
    db = ReadOnlyDB(tasks[0].db_path, timeout_s=0.5)
    with pytest.raises(SQLError, match="read-only"):
        db.run("DELETE FROM customers")
    assert db.run("PRAGMA table_info(customers)")[1][0][1] == "id"  # read-only pragmas work


# ----- the env -----------------------------------------------------------------------------------
def test_tools_and_json_info():
    env = _shop_env()
    obs, *_ = env.step("<list_tables></list_tables>")
    assert "customers (60 rows)" in obs[0].content
    obs, _, _, _, info = env.step("<describe_table>products</describe_table>")
    assert "price REAL" in obs[0].content and "First rows" in obs[0].content
    json.dumps(info)
    obs, _, _, _, info = env.step("<describe_table>nope</describe_table>")
    assert "no table named" in obs[0].content and info["action_valid"] is False


def test_reset_is_deterministic_and_splits_are_disjoint():
    tr = turngym.make("turngym/SQL-synthetic-v1", split="train").unwrapped
    te = turngym.make("turngym/SQL-synthetic-v1", split="test").unwrapped
    assert tr.task_ids and te.task_ids and not set(tr.task_ids) & set(te.task_ids)
    a, _ = tr.reset(seed=3)
    b, _ = tr.reset(seed=3)
    assert [m.content for m in a] == [m.content for m in b]
    assert {tr.task_type(t) for t in tr.task_ids} == {"easy", "medium", "hard"}


def test_partial_credit_and_wrong_answer():
    env = turngym.make("turngym/SQL-synthetic-v1", split="all", partial_credit=True).unwrapped
    task = next(t for t in env.tasks.values() if t.gold_sql.startswith("SELECT name FROM products WHERE category"))
    env.reset(seed=0, options={"task_id": task.task_id})
    n = len(env.db.fetch_all(task.gold_sql)[1])
    assert n >= 2
    _, reward, terminated, _, info = env.step(f"<submit>{task.gold_sql} LIMIT 1</submit>")
    # one of n gold rows: P = 1, R = 1/n, F1 = 2/(n+1)
    assert terminated and info["correct"] is False and env.outcome() == 0.0
    assert reward == pytest.approx(2 / (n + 1))
    env.reset(seed=0, options={"task_id": task.task_id})
    _, reward, terminated, _, info = env.step(f"<submit>{task.gold_sql}</submit>")
    assert terminated and reward == 1.0 and info["correct"] and env.outcome() == 1.0
    env.reset(seed=0, options={"task_id": task.task_id})
    _, reward, terminated, _, info = env.step("<submit>SELECT nme FROM products</submit>")
    assert not terminated and info["action_valid"] is False  # a failing query is not a submission


def _success(env_id, agent, ids, **kw):
    trajs = rollout(agent, make_env_factory(env_id, **agent.env_kwargs, **kw), episode_specs(ids, len(ids)), progress=False)
    return sum(t.outcome for t in trajs) / len(trajs)


@pytest.mark.parametrize("fmt", ["xml", "hermes", "openai", "text"])
def test_oracle_solves_synthetic_suite_and_random_does_not(fmt):
    ids = turngym.make("turngym/SQL-synthetic-v1", split="all").unwrapped.task_ids
    assert len(ids) >= 60
    oracle = _success("turngym/SQL-synthetic-v1", OracleAgent(), ids, split="all", tool_format=fmt)
    rand = _success("turngym/SQL-synthetic-v1", RandomAgent(seed=1), ids, split="all", tool_format=fmt)
    assert oracle >= 0.99
    assert rand <= 0.3 and rand < oracle - 0.5


# ----- Spider ------------------------------------------------------------------------------------
@pytest.mark.data
def test_spider_builds_all_databases_and_oracle_is_perfect(shared_data):
    from turngym.envs.sql.spider import load_spider

    suite = load_spider(shared_data / "spider")
    assert len(suite.databases) == 12 and all(Path(p).is_file() for p in suite.databases.values())
    print(f"spider: {len(suite.tasks)} gold queries run, {len(suite.failed)} fail")
    for task, err in suite.failed:
        print(f"  failing gold {task.task_id}: {err}: {task.gold_sql}")
    assert len(suite.tasks) + len(suite.failed) == 623
    env_kw = {"data_dir": str(shared_data), "split": "all"}
    ids = turngym.make("turngym/SQL-spider-v1", **env_kw).unwrapped.task_ids
    assert len(ids) == len(suite.tasks)
    assert _success("turngym/SQL-spider-v1", OracleAgent(), ids, **env_kw) == 1.0


@pytest.mark.data
def test_spider_split_is_by_database(shared_data):
    tr = turngym.make("turngym/SQL-spider-v1", data_dir=str(shared_data), split="train").unwrapped
    te = turngym.make("turngym/SQL-spider-v1", data_dir=str(shared_data), split="test").unwrapped
    dbs = lambda e: {e.tasks[t].db_id for t in e.task_ids}  # noqa: E731
    assert dbs(tr) and dbs(te) and not dbs(tr) & dbs(te)
    assert len(dbs(tr) | dbs(te)) == 12
