"""The generated SQL suite (``turngym/SQL-synthetic-v2``): its size, held-out databases that share
no schema or contents with training, question kinds that each have one informative answer, and
the property over every task: the gold query earns full reward and an empty answer earns none."""

from __future__ import annotations

import random
import sqlite3
from collections import Counter
from pathlib import Path

import pytest

import turngym
from turngym.envs.sql.domains import TEST_DOMAINS, TEST_SYLLABLES, TRAIN_DOMAINS, TRAIN_SYLLABLES
from turngym.envs.sql.generated import INSTANCES, GeneratedTasks, database_tasks, oracle_replies, task_ids
from turngym.envs.sql.questions import KINDS
from turngym.types import ToolCall

ENV = "turngym/SQL-synthetic-v2"


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("TURNGYM_CACHE", str(tmp_path_factory.getbasetemp() / "sql-cache"))


def _databases(split: str) -> dict[str, str]:
    """db id -> its file, every database of the split built."""
    return {t.db_id: t.db_path for t in GeneratedTasks(split).values()}


def _read(path: str) -> tuple[dict[str, list[str]], set[str]]:
    """A database file's tables (-> columns) and every text value it holds."""
    conn = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        schema = {t: [r[1] for r in conn.execute(f"PRAGMA table_info({t})")] for t in tables}
        texts = {v for t in tables for row in conn.execute(f"SELECT * FROM {t}") for v in row if isinstance(v, str)}
    finally:
        conn.close()
    return schema, texts


# ----- size and order -------------------------------------------------------------------------------
def test_split_sizes_and_ids():
    train, test = task_ids("train"), task_ids("test")
    assert len(train) == len(TRAIN_DOMAINS) * INSTANCES["train"] * len(KINDS) == 1200
    assert len(test) == len(TEST_DOMAINS) * INSTANCES["test"] * len(KINDS) == 360
    assert len(set(train)) == len(train) and len(set(test)) == len(test) and not set(train) & set(test)
    assert task_ids("all") == train + test and task_ids("train") == train  # a fixed order
    env = turngym.make(ENV, split="test").unwrapped
    assert env.task_ids == test and len(turngym.make(ENV, split="train").unwrapped.task_ids) == 1200


def test_the_first_tasks_of_a_split_spread_over_domains_and_kinds():
    first = task_ids("test")[:128]  # what a 128-episode held-out evaluation plays
    domains = Counter(t.split("-")[0] for t in first)
    assert set(domains) == {d.name for d in TEST_DOMAINS} and max(domains.values()) - min(domains.values()) <= 1
    assert len({t.split("-")[2] for t in first}) == len(KINDS)


# ----- held out in content --------------------------------------------------------------------------
def test_held_out_databases_share_no_table_column_value_or_name_with_training():
    train = [_read(p) for p in _databases("train").values()]
    test = [_read(p) for p in _databases("test").values()]
    assert len(train) == 60 and len(test) == 18
    tables = lambda dbs: {t for schema, _ in dbs for t in schema}  # noqa: E731
    columns = lambda dbs: {c for schema, _ in dbs for cols in schema.values() for c in cols}  # noqa: E731
    values = lambda dbs: set().union(*(texts for _, texts in dbs))  # noqa: E731
    assert not tables(train) & tables(test)
    assert columns(train) & columns(test) == {"id", "name"}
    assert values(train) and values(test) and not values(train) & values(test)
    assert not set("".join(TRAIN_SYLLABLES)) & set("qxyz") and all(set(s) & set("qxyz") for s in TEST_SYLLABLES)


def test_content_keys_name_the_domain_and_tables():
    env = turngym.make(ENV, split="test").unwrapped
    assert env.content_keys("apiary-01-top_n") == {"domain:apiary", "table:apiaries", "table:hives",
                                                   "table:inspections"}


# ----- questions -------------------------------------------------------------------------------------
def test_every_database_asks_every_kind_and_the_kinds_cover_sql():
    tasks = database_tasks("library-00")
    assert sorted(t.kind for t in tasks.values()) == sorted(KINDS)
    assert Counter(t.level for t in tasks.values()) == {"easy": 6, "medium": 8, "hard": 6}
    sql = " ".join(t.gold_sql for t in tasks.values())
    for clause in ("JOIN", "LEFT JOIN", "GROUP BY", "HAVING", "ORDER BY", "LIMIT", "IS NULL", "COALESCE", "NOT IN",
                   "(SELECT AVG", "COUNT(DISTINCT", "SUM(", "AVG(", "BETWEEN"):
        assert clause in sql, clause
    assert "MAX(" in sql or "MIN(" in sql
    three = [t for t in tasks.values() if t.gold_sql.count(" JOIN ") == 2]
    assert three and all("\n" not in t.gold_sql for t in tasks.values())  # one line: the text format reads one


def test_generation_is_deterministic_and_the_seed_changes_the_data(tmp_path):
    a = database_tasks("cinema-02", seed=0, folder=tmp_path / "a")
    b = database_tasks("cinema-02", seed=0, folder=tmp_path / "b")
    c = database_tasks("cinema-02", seed=1, folder=tmp_path / "c")
    assert [(t.question, t.gold_sql) for t in a.values()] == [(t.question, t.gold_sql) for t in b.values()]
    assert Path(next(iter(a.values())).db_path).read_bytes() == Path(next(iter(b.values())).db_path).read_bytes()
    assert _read(next(iter(a.values())).db_path)[1] != _read(next(iter(c.values())).db_path)[1]


def test_a_task_builds_only_its_own_database(tmp_path):
    tasks = GeneratedTasks("test", folder=tmp_path)
    tasks["vineyard-02-having"]
    assert [p.name.rsplit("-", 1)[0] for p in tmp_path.iterdir()] == ["vineyard-02"]
    with pytest.raises(KeyError):
        tasks["library-00-having"]  # a training task is not in the test split


def test_oracle_replies_are_recorded_for_every_task():
    replies = oracle_replies("test", tool_format="xml")
    assert list(replies) == task_ids("test")
    assert all(r.startswith("<submit>SELECT ") and r.endswith("</submit>") for r in replies.values())
    longest = max(replies.values(), key=len)
    assert len(longest) < 260, longest  # short enough for a 128-token reply cap (see docs/task_suites.md)


# ----- the property over every task --------------------------------------------------------------------
EMPTY_ANSWERS = ["SELECT 1 WHERE 0", "SELECT NULL", "SELECT 0"]


def _check_tasks(split: str, ids: list[str]) -> None:
    """The gold query earns 1.0; an empty result, a NULL and a lone 0 earn 0.0; a reply without
    a submission ends nothing and earns nothing."""
    env = turngym.make(ENV, split=split)
    u = env.unwrapped
    try:
        for tid in ids:
            env.reset(seed=0, options={"task_id": tid})
            _, reward, term, _, info = env.step(u.oracle_action())
            assert term and reward == 1.0 and info["correct"], (tid, u.tasks[tid].gold_sql)
            for sql in EMPTY_ANSWERS:
                env.reset(seed=0, options={"task_id": tid})
                _, reward, term, _, info = env.step(u.format.render_call(ToolCall("x", "submit", {"sql": sql})))
                assert term and reward == 0.0 and not info["correct"], (tid, sql)
            env.reset(seed=0, options={"task_id": tid})
            _, reward, term, _, _ = env.step("I am not sure.")
            assert not term and reward == 0.0
    finally:
        env.close()


def test_gold_earns_full_reward_and_empty_answers_none_on_a_sample():
    rng = random.Random(0)
    for split in ("train", "test"):
        by_kind: dict[str, list[str]] = {}
        for tid in task_ids(split):
            by_kind.setdefault(tid.split("-")[2], []).append(tid)
        _check_tasks(split, [rng.choice(ids) for ids in by_kind.values()])


@pytest.mark.slow
@pytest.mark.parametrize("split", ["train", "test"])
def test_gold_earns_full_reward_and_empty_answers_none_on_every_task(split):
    _check_tasks(split, task_ids(split))


@pytest.mark.parametrize("fmt", ["hermes", "text"])
def test_the_oracle_solves_tasks_in_every_format(fmt):
    from turngym.agents.scripted import OracleAgent
    from turngym.rollout import episode_specs, make_env_factory, rollout

    ids, agent = task_ids("test")[:20], OracleAgent()
    trajs = rollout(agent, make_env_factory(ENV, **agent.env_kwargs, split="test", tool_format=fmt),
                    episode_specs(ids, len(ids)), progress=False)
    assert [t.outcome for t in trajs] == [1.0] * len(ids)
