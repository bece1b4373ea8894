"""SQL sandbox against hostile queries: invalid Unicode, long single opcodes, denied functions and
statements, huge results. (The Spider loader's hostile data is in test_spider_loader.py.)"""

from __future__ import annotations

import json
import sqlite3
import threading

import pytest

import turngym
from turngym.envs.sql import sandbox
from turngym.envs.sql.sandbox import (
    ALLOWED_FUNCTIONS,
    MAX_VALUE_BYTES,
    ReadOnlyDB,
    SQLError,
    check_printf_sizes,
)


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("TURNGYM_CACHE", str(tmp_path_factory.getbasetemp() / "sql-cache"))


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "t.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript("CREATE TABLE t1(x, y); INSERT INTO t1 VALUES (1, 'a'), (2, 'b'); CREATE TABLE t2(y);")
    conn.commit()
    conn.close()
    d = ReadOnlyDB(path, timeout_s=0.5)
    yield d
    d.close()


def _shop_env(fmt="hermes"):
    env = turngym.make("turngym/SQL-synthetic-v1", split="all", tool_format=fmt, timeout_s=0.5).unwrapped
    env.reset(seed=0, options={"task_id": next(t for t in env.task_ids if t.startswith("shop-"))})
    return env


def _hermes(name, args) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}, ensure_ascii=True) + "</tool_call>"


# ----- invalid Unicode ---------------------------------------------------------------------------
@pytest.mark.parametrize("tool", ["execute_sql", "submit", "describe_table"])
def test_lone_surrogate_is_an_error_observation_and_the_episode_goes_on(tool):
    env = _shop_env()
    key = "table" if tool == "describe_table" else "sql"
    # ensure_ascii writes the lone surrogate as the JSON escape \ud800, which json.loads accepts
    obs, reward, terminated, _, info = env.step(_hermes(tool, {key: "SELECT '\ud800'"}))
    assert info["action_valid"] is False and not terminated and reward == 0.0
    assert "Unicode" in obs[0].content
    obs[0].content.encode("utf-8")  # the observation itself is valid UTF-8
    assert isinstance(info["state_key"], str)
    obs, _, _, _, info = env.step(_hermes("list_tables", {}))
    assert "customers (60 rows)" in obs[0].content and info["action_valid"] is True


def test_lone_surrogate_in_raw_xml_text_never_raises():
    env = _shop_env("xml")
    obs, _, terminated, _, info = env.step("<execute_sql>SELECT '\ud800'</execute_sql>")
    assert info["action_valid"] is False and not terminated
    obs, *_ = env.step("<execute_sql>SELECT COUNT(*) FROM customers</execute_sql>")
    assert "60" in obs[0].content


def test_stored_text_that_is_not_utf8_is_read_not_fatal(tmp_path):
    path = tmp_path / "bad.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t(x TEXT)")
    conn.execute("INSERT INTO t VALUES (CAST(x'41ff42' AS TEXT))")  # "A", an invalid byte, "B"
    conn.commit()
    conn.close()
    assert ReadOnlyDB(path).run("SELECT x FROM t")[1] == [("AB",)]


def test_query_text_over_the_cap_is_an_error(db):
    with pytest.raises(SQLError, match="limit is"):
        db.run("SELECT '" + "x" * (sandbox.MAX_SQL_BYTES + 1) + "'")


# ----- the wall-clock watchdog -----------------------------------------------------------------------
def test_watchdog_returns_on_time_from_an_opcode_that_ignores_interrupt(db, monkeypatch):
    # A Python function is one opcode that never sees sqlite3_interrupt(); it blocks until the
    # test releases it, so the query can only return before that if the watchdog abandons it.
    monkeypatch.setattr(sandbox, "ALLOWED_FUNCTIONS", ALLOWED_FUNCTIONS | {"block"})
    gate = threading.Event()
    db.conn.create_function("block", 0, lambda: int(gate.wait(60)))
    with pytest.raises(SQLError, match="timed out"):
        db.run("SELECT block()")
    assert not gate.is_set()  # the statement is still running: the caller got its answer anyway
    assert db.run("SELECT COUNT(*) FROM t1")[1] == [(2,)]  # a fresh connection serves the next query
    stuck = list(db._stuck)
    assert len(stuck) == 1
    gate.set()
    stuck[0].join(timeout=30)  # a hang guard, not a timing assertion
    assert not stuck[0].is_alive()


def test_too_many_stuck_statements_refuse_new_queries_until_they_end(db, monkeypatch):
    monkeypatch.setattr(sandbox, "ALLOWED_FUNCTIONS", ALLOWED_FUNCTIONS | {"block"})
    gate = threading.Event()
    for _ in range(sandbox.MAX_STUCK):
        db.conn.create_function("block", 0, lambda: int(gate.wait(60)))
        with pytest.raises(SQLError, match="timed out"):
            db.run("SELECT block()")
    with pytest.raises(SQLError, match="still stopping"):
        db.run("SELECT 1")
    gate.set()
    for t in list(db._stuck):
        t.join(timeout=30)
    assert db.run("SELECT 1")[1] == [(1,)]


def test_huge_printf_width_is_refused_and_normal_printf_works(db):
    for sql in ("SELECT printf('%.*c', 2000000000, 'x')", "SELECT printf('%2000000000c', 'x')",
                "SELECT format('%.*c', 2000000000, 'x')", "SELECT length(printf('%.*c', x * 1000000, 'x')) FROM t1"):
        with pytest.raises(SQLError, match="widths and precisions add up to"):
            db.run(sql)
    _, rows, _ = db.run("SELECT printf('%5.2f|%-4s|%d%%|%.*c|%s', 3.14159, 'ab', 7, 3, 'x', NULL)")
    assert rows == [(" 3.14|ab  |7%|xxx|",)]
    assert db.run("SELECT format('%03d', x) FROM t1")[1] == [("001",), ("002",)]


def test_check_printf_sizes_by_hand():
    check_printf_sizes("%d %*d %.*f", (1, 5, 2, 3, 1.5))  # widths 5 and precision 3: fine
    check_printf_sizes("%50000c%.50000c", ("a", "b"))  # 50,000 + 50,000 = the limit exactly
    with pytest.raises(ValueError, match="add up to 100001, over the limit"):
        check_printf_sizes("%50000c%.50000c%1d", ("a", "b", 1))  # one more: the sum is what counts
    check_printf_sizes("%%%n%d", (MAX_VALUE_BYTES + 1,))  # %% and %n take no argument; %d's value is no width
    with pytest.raises(ValueError, match="over the limit"):
        check_printf_sizes("%%%.*c", (MAX_VALUE_BYTES + 1, "x"))  # after %%, the * reads the first argument
    with pytest.raises(ValueError):
        check_printf_sizes("%s%-*d", ("a", -(MAX_VALUE_BYTES + 1), 1))  # a negative * width is left-justified
    with pytest.raises(ValueError):
        check_printf_sizes(f"%.{MAX_VALUE_BYTES + 1}f", (1.0,))


def test_check_trim_work_by_hand():
    check_trim_work = sandbox.check_trim_work
    check_trim_work("a" * 20_000, "b" * 100)  # 20,000 x 100 = 2,000,000: the limit exactly
    check_trim_work(None, "x" * 10**6)  # NULL trims to NULL at no cost
    check_trim_work(12345, "5")  # a number is trimmed as its short text
    with pytest.raises(ValueError, match="20001 characters by a set of 100 is over"):
        check_trim_work(b"a" * 20_001, b"b" * 100)


def test_trim_with_a_character_set_still_works(db):
    _, rows, _ = db.run("SELECT ltrim('xyhixy', 'yx'), rtrim('xyhixy', 'yx'), trim('xyhixy', 'yx'), trim('  a  '), "
                        "trim(NULL, 'x'), ltrim(x'01014142', x'01')")
    assert rows == [("hixy", "xyhi", "hi", "a", None, "AB")]


def test_quadratic_string_functions_stay_bounded_by_the_value_cap(db):
    with pytest.raises(SQLError, match="too big"):
        db.run(f"SELECT zeroblob({MAX_VALUE_BYTES + 1})")
    # the largest haystack and needle the cap allows: instr answers (it is O(n*m) in one opcode)
    sql = (f"WITH s(h, n) AS (SELECT printf('%.*c', {MAX_VALUE_BYTES - 1}, 'a'), printf('%.*c', {MAX_VALUE_BYTES // 2}, 'a') || 'b') "
           "SELECT instr(h, n) FROM s")
    assert ReadOnlyDB(db.path, timeout_s=30).run(sql)[1] == [(0,)]


# ----- denied functions and statements -------------------------------------------------------------
@pytest.mark.parametrize("sql", [
    "SELECT fts3_tokenizer('simple')",
    "SELECT fts3_tokenizer('evil', x'0000000000000000')",
    "SELECT load_extension('/tmp/evil.so')",
    "SELECT fts5(NULL)",
    "SELECT rtreenode(2, x'00')",
    "SELECT sqlite_log(1, 'x')",
    "SELECT highlight(t1, 0, '[', ']') FROM t1",
    "SELECT COUNT(*) FROM pragma_function_list",
    "ATTACH DATABASE ':memory:' AS m",
    "PRAGMA query_only = OFF",
    "PRAGMA writable_schema = ON",
    "PRAGMA temp_store = MEMORY",
])
def test_dangerous_functions_and_pragmas_are_denied(db, sql):
    with pytest.raises(SQLError, match="not authorized|no such"):
        db.run(sql)


def test_every_function_of_this_sqlite_is_allowed_or_deliberately_denied():
    denied = {"fts3_tokenizer", "fts5", "fts5_source_id", "bm25", "highlight", "snippet", "offsets", "matchinfo",
              "match", "optimize", "load_extension", "rtreecheck", "rtreedepth", "rtreenode", "sqlite_log",
              "sqlite_compileoption_get", "sqlite_compileoption_used", "sqlite_source_id"}
    names = {r[0].lower() for r in sqlite3.connect(":memory:").execute("PRAGMA function_list")}
    unknown = names - ALLOWED_FUNCTIONS - denied
    assert not unknown, f"functions neither allowed nor denied on purpose: {sorted(unknown)}"
    assert not (ALLOWED_FUNCTIONS & denied)


def test_core_functions_still_work(db):
    sql = ("SELECT upper(y), abs(-x), round(x / 3.0, 2), coalesce(NULL, y), json_extract('{\"a\": [1, 2]}', '$.a[1]'), "
           "date('2020-01-31', '+1 day'), row_number() OVER (ORDER BY x DESC), sqrt(x * 4.0) FROM t1 ORDER BY x")
    assert db.run(sql)[1] == [("A", 1, 0.33, "a", 2, "2020-02-01", 2, 2.0), ("B", 2, 0.67, "b", 2, "2020-02-01", 1, 2.8284271247461903)]


def test_tables_read_comes_from_the_authorizer(db):
    assert db.tables_read("SELECT x FROM t1 WHERE y NOT IN (SELECT y FROM T2)") == {"t1", "t2"}
    assert db.tables_read("SELECT x FROM t1 WHERE y NOT IN (SELECT y FROM T2)") == {"t1", "t2"}  # memoized
    assert db.tables_read("SELECT 1") == set()
    with pytest.raises(SQLError):
        db.tables_read("SELECT * FROM nope")


# ----- result caps ------------------------------------------------------------------------------------
_BLOBS = "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c LIMIT {n}) SELECT zeroblob({size}) FROM c"


def test_byte_cap_refuses_a_huge_result_without_holding_it(tmp_path, db):
    small = ReadOnlyDB(db.path, timeout_s=5, max_rows=10_000, max_bytes=1_000_000)
    sql = _BLOBS.format(n=1000, size=99_000)  # 99 MB in all
    with pytest.raises(SQLError, match="larger than 1,000,000 bytes"):
        small.fetch_all(sql)
    _, rows, truncated = small.run(sql)
    assert truncated and len(rows) == 1_000_000 // 99_000  # the rows that fit, no more
    _, rows, truncated = small.run(_BLOBS.format(n=10, size=99_000))
    assert not truncated and len(rows) == 10


def test_submit_of_a_huge_result_is_an_error_observation():
    env = turngym.make("turngym/SQL-synthetic-v1", split="all", max_bytes=500_000).unwrapped
    env.reset(seed=0, options={"task_id": env.task_ids[0]})
    obs, reward, terminated, _, info = env.step(f"<submit>{_BLOBS.format(n=1000, size=99_000)}</submit>")
    assert "larger than 500,000 bytes" in obs[0].content and not terminated and info["action_valid"] is False
    _, reward, terminated, _, _ = env.step(f"<submit>{env.tasks[env.task_id].gold_sql}</submit>")
    assert terminated and reward == 1.0


# ----- an abandoned statement stops; temporary storage is capped ---------------------------------
def _cpu_after_return(db, sql: str, timeout_s: float = 0.3) -> float:
    """CPU seconds this process spends after ``sql`` returned its error, until every statement it
    abandoned has ended (a hang guard of 30 s, not a timing assertion)."""
    import time

    with pytest.raises(SQLError):
        db.run(sql, timeout_s=timeout_s)
    c0 = time.process_time()
    for t in list(db._stuck):
        t.join(timeout=30)
    time.sleep(0.2)  # a statement still running would go on burning here
    return time.process_time() - c0


@pytest.mark.parametrize("sql", [
    # The widest character class SQLite allows, on the longest value: one opcode of ~5e9 steps.
    "SELECT printf('%.*c', 99000, 'a') GLOB '*[" + "b" * 49_980 + "]*'",
    "SELECT printf('%.*c', 99000, 'a') LIKE '" + "%a" * 24_000 + "b'",
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 3000) "
    "SELECT count(*) FROM c a, c b, c d WHERE a.x + b.x = d.x",
    # One printf call of 12,000 specifiers, each under the per-value cap: 6 s of CPU in one opcode.
    "SELECT printf('" + "%.99999c" * 12_000 + "')",
    # A two-argument trim compares every character of the value with every one of the set: 2.8 s.
    "SELECT ltrim(printf('%.*c', 99000, 'a'), printf('%.*c', 8000, 'b') || 'a')",
])
def test_an_abandoned_statement_stops_burning_cpu(db, sql):
    assert _cpu_after_return(db, sql) < 0.5


def _peak_temp_while(fn) -> int:
    import time

    peak, stop = [0], threading.Event()

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], sandbox.temp_bytes())
            time.sleep(0.001)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        fn()
    finally:
        stop.set()
        t.join()
    return peak[0]


_ROWS = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 100000000) "


@pytest.mark.parametrize("sql", [
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION SELECT x + 1 FROM c WHERE x < 100000000) "
    "SELECT count(*) FROM (SELECT DISTINCT x, zeroblob(2000) FROM c)",
    _ROWS + "SELECT x FROM c ORDER BY randomblob(3000)",
    # Rows of 99 KB write fast: counted every 100,000 opcodes, these peaked at 390-450 MB.
    _ROWS + "SELECT length(b) FROM (SELECT x, randomblob(99000) AS b FROM c) ORDER BY b",
    _ROWS + "SELECT count(*) FROM (SELECT DISTINCT zeroblob(99000) || x FROM c)",
    "WITH RECURSIVE c(x, b) AS (SELECT 1, randomblob(99000) UNION SELECT x + 1, randomblob(99000) FROM c "
    "WHERE x < 100000000) SELECT count(*) FROM c",
])
def test_temporary_storage_is_capped(tmp_path, sql):
    path = tmp_path / "t.sqlite"
    sqlite3.connect(path).close()
    d = ReadOnlyDB(path, timeout_s=20.0)  # long enough that only the storage cap can stop it
    try:
        def run():
            with pytest.raises(SQLError, match="temporary storage"):
                d.run(sql)

        peak = _peak_temp_while(run)
        assert peak < sandbox.MAX_TEMP_BYTES, f"temporary files peaked at {peak / 2**20:.0f} MB"
        assert d.run("SELECT 1")[1] == [(1,)]  # and the connection serves the next query
    finally:
        d.close()


def test_tool_arguments_that_are_not_plain_json_are_error_observations():
    """An in-process caller can hand a Message any Python object; the step answers with an error,
    and its info stays JSON."""
    from turngym.types import Message, ToolCall

    env = _shop_env("openai")
    for args in ({"sql": _deep(990)}, {"sql": 10 ** 5000}, {"sql": object()}, {"sql": ("SELECT 1",)}):
        obs, _, _, _, info = env.step(Message("assistant", "", tool_calls=[ToolCall("c", "execute_sql", args)]))
        assert obs[0].content.startswith("Error:") and not info["action_valid"], obs[0].content
        json.dumps(info)
    big = [ToolCall(f"c{i}", "execute_sql", {"sql": "SELECT 1 -- " + "x" * (10 * 2**20)}) for i in range(8)]
    obs, _, _, _, info = env.step(Message("assistant", "", tool_calls=big))
    assert "longer than 16384" in obs[0].content and info["tool_calls"] == [], obs[0].content
    assert len(json.dumps(info)) < 10_000
    ok = env.step(Message("assistant", "", tool_calls=[ToolCall("c", "execute_sql", {"sql": "SELECT 1"})]))
    assert ok[4]["action_valid"] and ok[0][0].content.startswith("1")


def _deep(n: int):
    v: list = []
    for _ in range(n):
        v = [v]
    return v
