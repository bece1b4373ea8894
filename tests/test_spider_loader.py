"""The Spider loader on data nobody here wrote: a hand-made database in the re-packaged CSV layout
with a ``NULL`` token, a table without CSV, a CSV without table, an oversized gold result and a
failing gold query."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import turngym
from turngym.data import forget_warnings
from turngym.envs.sql.spider import load_spider

SCHEMA = """
CREATE TABLE `zoo`.`keeper` (
  `id` int NOT NULL,
  `name` varchar(20) NOT NULL,
  `city` varchar(20),
  PRIMARY KEY (`id`),
  KEY `name_idx` (`name`)
);
CREATE TABLE `zoo`.`animal` (`id` int NOT NULL, `keeper_id` int, `kind` varchar(20));
CREATE TABLE `zoo`.`audit` (`id` int, `keeper_id` int);
"""
KEEPERS = "id,name,city\n1,Ana,Rome\n2,Bo,NULL\n3,Cy,\n4,Di,Null\n"  # NULL and "" are SQL NULL; "Null" is text
QUESTIONS = [
    ("How many keepers have no city?", "SELECT count(*) FROM keeper WHERE city IS NULL"),
    ("Which keepers are not audited?", "SELECT name FROM keeper WHERE id NOT IN (SELECT keeper_id FROM audit)"),
    ("List every animal.", "SELECT * FROM animal"),
    ("Broken gold.", "SELECT nme FROM keeper"),
    ("Keeper names and cities, by id.", "SELECT name, city FROM keeper ORDER BY id"),
]


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("TURNGYM_CACHE", str(tmp_path_factory.getbasetemp() / "spider-cache"))
    forget_warnings()  # data warnings print once per process; each test starts afresh


@pytest.fixture
def spider_dir(tmp_path) -> Path:
    root = tmp_path / "spider"
    data = root / "databases" / "zoo" / "data"
    data.mkdir(parents=True)
    (root / "databases" / "zoo" / "schema.sql").write_text(SCHEMA)
    (data / "keeper.csv").write_text(KEEPERS)
    (data / "animal.csv").write_text("id,keeper_id,kind\n" + "".join(f"{i},1,k{i}\n" for i in range(30)))
    (data / "ghost.csv").write_text("id\n1\n")  # a CSV whose table the schema lacks
    lines = ["database,question,sql"] + [f'zoo,"{q}","{s}"' for q, s in QUESTIONS]
    (root / "questions.csv").write_text("\n".join(lines) + "\n")
    return root


def _load(spider_dir, caplog, **kw):
    with pytest.warns(UserWarning) as record, caplog.at_level(logging.WARNING, logger="turngym.envs.sql.spider"):
        suite = load_spider(spider_dir, **kw)
    return suite, [str(w.message) for w in record]


def test_null_token_missing_table_and_caps(spider_dir, caplog):
    suite, warned = _load(spider_dir, caplog, max_rows=20)
    assert any("ghost.csv matches no table" in w for w in warned)
    assert any("no data for table(s) audit" in w for w in warned)
    assert suite.missing_tables == {"zoo": ["audit"]}
    reasons = {t.gold_sql: r for t, r in suite.failed}
    assert "audit" in reasons[QUESTIONS[1][1]]  # reads the table that has no CSV (inside a sub-query)
    assert "exceeds the env's caps (20 rows" in reasons[QUESTIONS[2][1]]  # 30 rows > 20
    assert "no such column" in reasons[QUESTIONS[3][1]]
    assert dict(suite.dropped) == {"missing_table": 1, "over_caps": 1, "gold_error": 1}
    assert "3 of 5 tasks left out (gold_error: 1, missing_table: 1, over_caps: 1)" in caplog.text
    assert [t.gold_sql for t in suite.tasks] == [QUESTIONS[0][1], QUESTIONS[4][1]]


def test_null_token_becomes_sql_null_and_the_env_grades_with_it(spider_dir, caplog):
    suite, _ = _load(spider_dir, caplog)  # default caps: the 30-row gold stays
    assert len(suite.tasks) == 3
    env = turngym.make("turngym/SQL-spider-v1", data_dir=str(spider_dir.parent), split="all").unwrapped  # warned above
    count_task = next(t for t in env.task_ids if env.tasks[t].gold_sql == QUESTIONS[0][1])
    env.reset(seed=0, options={"task_id": count_task})
    assert env.db.run(QUESTIONS[0][1])[1] == [(2,)]  # "NULL" and "" only; "Null" is a name of a city
    assert env.db.run("SELECT city FROM keeper ORDER BY id")[1] == [("Rome",), (None,), (None,), ("Null",)]
    _, reward, terminated, _, _ = env.step("<submit>SELECT 2</submit>")
    assert terminated and reward == 1.0
    by_id = next(t for t in env.task_ids if env.tasks[t].gold_sql == QUESTIONS[4][1])
    env.reset(seed=0, options={"task_id": by_id})
    _, reward, *_ = env.step("<submit>SELECT city, name FROM keeper ORDER BY id</submit>")  # columns swapped
    assert reward == 1.0
    env.reset(seed=0, options={"task_id": by_id})
    _, reward, *_ = env.step("<submit>SELECT name, city FROM keeper ORDER BY id DESC</submit>")  # gold has ORDER BY
    assert reward == 0.0


def test_strict_columns_option(spider_dir, caplog):
    _load(spider_dir, caplog)
    env = turngym.make("turngym/SQL-spider-v1", data_dir=str(spider_dir.parent), split="all", strict_columns=True).unwrapped
    by_id = next(t for t in env.task_ids if env.tasks[t].gold_sql == QUESTIONS[4][1])
    env.reset(seed=0, options={"task_id": by_id})
    _, reward, *_ = env.step("<submit>SELECT city, name FROM keeper ORDER BY id</submit>")
    assert reward == 0.0


def test_the_cache_keeps_the_missing_tables(spider_dir, caplog, tmp_path):
    first, _ = _load(spider_dir, caplog, cache=tmp_path / "c")
    forget_warnings()
    again, warned = _load(spider_dir, caplog, cache=tmp_path / "c")  # from the cache: no rebuild
    assert again.missing_tables == first.missing_tables == {"zoo": ["audit"]}
    assert any("audit" in w for w in warned) and not any("ghost" in w for w in warned)
    assert [t.task_id for t in again.tasks] == [t.task_id for t in first.tasks]


def test_a_csv_that_does_not_load_is_a_missing_table(spider_dir, caplog):
    (spider_dir / "databases" / "zoo" / "data" / "animal.csv").write_text("id,no_such_column\n1,2\n")
    suite, warned = _load(spider_dir, caplog)
    assert any("animal.csv did not load" in w for w in warned)
    assert suite.missing_tables == {"zoo": ["animal", "audit"]}
    assert suite.dropped["missing_table"] == 2


def test_data_warnings_print_once_per_process(spider_dir, caplog):
    """Every env loads its data; the warnings about it are printed by the first load only."""
    _, warned = _load(spider_dir, caplog, max_rows=20)
    assert warned and caplog.text.count("tasks left out") == 1
    import warnings

    with warnings.catch_warnings(record=True) as again, caplog.at_level(logging.WARNING, logger="turngym.envs.sql.spider"):
        warnings.simplefilter("always")
        load_spider(spider_dir, max_rows=20)
        load_spider(spider_dir, max_rows=20)
    assert again == [] and caplog.text.count("tasks left out") == 1
