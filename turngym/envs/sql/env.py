"""``SQLEnv``: answer a question about a database by exploring it and submitting one query.

Tools: ``submit(sql)`` ends the episode and is scored by execution accuracy (see
``turngym.envs.sql.accuracy``); ``execute_sql(sql)`` runs a read-only query and shows a compact
table; ``describe_table(table)`` shows columns and a few rows; ``list_tables()``. Every query
runs on a read-only, time-limited connection (``turngym.envs.sql.sandbox``), so the source
database stays byte-identical whatever the agent sends.

Reward: 1.0 when the submitted query's result equals the gold result by the official Spider
execution rule (columns in any order unless ``strict_columns``; 0.0 otherwise, or the
row-multiset F1 with ``partial_credit=True``); other steps give 0.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

from turngym.envs.base import StepOutcome, TextEnv
from turngym.envs.sql.accuracy import order_matters, results_match, row_f1
from turngym.envs.sql.sandbox import MAX_RESULT_BYTES, ReadOnlyDB, format_table, quote_ident
from turngym.envs.splits import split_of
from turngym.envs.sql.synthetic import SQLTask, build_suite
from turngym.tools.base import Tool
from turngym.types import Message, ToolCall

SYSTEM_PROMPT = (
    "You are an expert SQL analyst working with a SQLite database. Explore it with the tools, "
    "then answer the question by submitting ONE SQL query whose result is the answer. Submitting "
    "ends the episode; the query's result (not its text) is compared with the correct result.\n\n{tools}"
)


GOLD_TIMEOUT_S = 10.0  # gold queries are trusted; a slow machine must not make the oracle fail


def load_tasks(
    suite: str, seed: int = 0, data_dir: str | None = None, max_rows: int = 10_000, max_bytes: int = MAX_RESULT_BYTES
) -> tuple[list[SQLTask], list[tuple[SQLTask, str]]]:
    """The tasks of a suite (``synthetic`` or ``spider``) and, for Spider, the tasks left out
    (failing gold queries, missing tables, gold results over ``max_rows``/``max_bytes``)."""
    if suite == "synthetic":
        return build_suite(seed), []
    if suite == "spider":
        from turngym.data import dataset_path
        from turngym.envs.sql.spider import load_spider

        loaded = load_spider(dataset_path("spider", data_dir), max_rows=max_rows, max_bytes=max_bytes)
        return loaded.tasks, loaded.failed
    raise ValueError(f"unknown SQL suite {suite!r}; choose 'synthetic' or 'spider'")


def _split_key(task: SQLTask, suite: str) -> str:
    # Spider is split by database (cross-database generalisation); the synthetic suite by question.
    return task.db_id if suite == "spider" else task.task_id


class SQLEnv(TextEnv):
    """Text-to-SQL with tools over a read-only SQLite database; reward = execution accuracy."""

    default_tool_format = "xml"

    def __init__(
        self,
        suite: str = "synthetic",
        split: str = "train",
        seed: int = 0,
        data_dir: str | None = None,
        timeout_s: float = 2.0,
        preview_rows: int = 20,
        max_rows: int = 10_000,
        max_bytes: int = MAX_RESULT_BYTES,
        partial_credit: bool = False,
        strict_columns: bool = False,
        show_schema: bool = True,
        **kw: Any,
    ) -> None:
        """Args:
            suite: ``synthetic`` (three bundled databases, generated from ``seed``), ``generated``
                (78 databases in 16 domains, ``turngym.envs.sql.generated``) or ``spider`` (needs the data).
            split: ``train`` / ``test`` (disjoint; Spider is split by database, ``generated`` by
                domain, ``synthetic`` by question) or ``all``.
            seed: Seed of the synthetic databases and questions.
            data_dir: Local data folder for Spider (else ``$TURNGYM_DATA`` or the cache).
            timeout_s: Time limit per query.
            preview_rows: Rows shown by ``execute_sql``.
            max_rows: Largest result ``submit`` accepts, in rows.
            max_bytes: Largest result ``submit`` accepts, in bytes (text/blob lengths, 8 per number).
            partial_credit: Reward a wrong submission with its row F1 instead of 0.
            strict_columns: Require the gold column order (the official metric ignores it).
            show_schema: Put the tables and columns in the opening prompt.
        """
        super().__init__(**kw)
        if split not in ("train", "test", "all"):
            raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}")
        self.suite, self.split = suite, split
        self.timeout_s, self.preview_rows, self.max_rows, self.max_bytes = timeout_s, preview_rows, max_rows, max_bytes
        self.partial_credit, self.show_schema, self.strict_columns = partial_credit, show_schema, strict_columns
        if suite == "generated":  # split by domain; each database is built when first played
            from turngym.envs.sql.generated import GeneratedTasks

            self.tasks, self.failed_gold = GeneratedTasks(split, seed), []
        else:
            tasks, self.failed_gold = load_tasks(suite, seed, data_dir, max_rows, max_bytes)
            fraction = 0.25 if suite == "spider" else 0.2
            keep = [t for t in tasks if split == "all" or split_of(_split_key(t, suite), fraction) == split]
            self.tasks = {t.task_id: t for t in keep}
        self.task_ids = list(self.tasks)
        self._dbs: dict[str, ReadOnlyDB] = {}
        self._gold: dict[str, tuple[list[tuple], bool]] = {}
        self._task: SQLTask | None = None
        self._seen: set[str] = set()
        self._submitted = False
        self._correct = False
        self._f1 = 0.0

    # ----- tools ------------------------------------------------------------------------------
    def _build_tools(self) -> list[Tool]:
        def submit(sql: str) -> str:
            """Submit the final SQL query; its result is your answer. This ends the episode.

            Args:
                sql: one SQLite SELECT query
            """
            cols, rows = self.db.fetch_all(sql)
            self._grade(rows)
            return "Submitted. Your query returned:\n" + format_table(cols, rows[: self.preview_rows], len(rows) > self.preview_rows)

        def execute_sql(sql: str) -> str:
            """Run a read-only SQL query and see (up to 20 rows of) its result.

            Args:
                sql: one SQLite SELECT query
            """
            cols, rows, truncated = self.db.run(sql, limit=self.preview_rows)
            return format_table(cols, rows, truncated)

        def describe_table(table: str) -> str:
            """Show a table's columns with their types, and its first 3 rows.

            Args:
                table: the table name
            """
            cols = self.db.columns(table)
            names, rows, _ = self.db.run(f"SELECT * FROM {quote_ident(table)} LIMIT 3", limit=3)
            head = f"Table {table}: " + ", ".join(f"{c} {t}".strip() for c, t in cols)
            return head + "\nFirst rows:\n" + format_table(names, rows)

        def list_tables() -> str:
            """List the tables of the database with their row counts."""
            out = []
            for t in self.db.tables():
                _, rows, _ = self.db.run(f"SELECT COUNT(*) FROM {quote_ident(t)}")
                out.append(f"{t} ({rows[0][0]} rows)")
            return "Tables: " + ", ".join(out)

        return [Tool.from_function(f, timeout_s=None) for f in (submit, execute_sql, describe_table, list_tables)]

    @property
    def db(self) -> ReadOnlyDB:
        path = self._task.db_path
        if path not in self._dbs:
            self._dbs[path] = ReadOnlyDB(path, timeout_s=self.timeout_s, max_rows=self.max_rows, max_bytes=self.max_bytes)
        return self._dbs[path]

    def _gold_result(self) -> tuple[list[tuple], bool]:
        t = self._task
        if t.task_id not in self._gold:
            _, rows = self.db.fetch_all(t.gold_sql, timeout_s=max(self.timeout_s, GOLD_TIMEOUT_S))
            self._gold[t.task_id] = (rows, order_matters(t.gold_sql))
        return self._gold[t.task_id]

    def _grade(self, rows: list[tuple]) -> None:
        gold, ordered = self._gold_result()
        self._submitted = True
        self._correct = results_match(rows, gold, ordered, strict=self.strict_columns)
        self._f1 = 1.0 if self._correct else row_f1(rows, gold)

    # ----- episode ----------------------------------------------------------------------------
    def _reset_task(self, task_id: str) -> list[Message]:
        if task_id not in self.tasks:
            raise KeyError(f"unknown task {task_id!r} for SQL suite {self.suite!r} split {self.split!r}")
        self._task = self.tasks[task_id]
        self._seen, self._submitted, self._correct, self._f1 = set(), False, False, 0.0
        user = f"Database: {self._task.db_id}\n"
        if self.show_schema:
            user += "Schema:\n" + "\n".join(
                f"  {t}({', '.join(f'{c} {ty}'.strip() for c, ty in self.db.columns(t))})" for t in self.db.tables()
            ) + "\n"
        user += f"Question: {self._task.question}"
        return [Message("system", SYSTEM_PROMPT.format(tools=self.format.render_tools(self.tools.specs))), Message("user", user)]

    def _step_outcome(self, parsed, results) -> StepOutcome:
        for c in parsed.calls:
            args = c.arguments.values() if isinstance(c.arguments, dict) else [c.arguments]
            self._seen.add(f"{c.name}:{' '.join(str(v) for v in args).strip().lower()}")
        if not self._submitted:
            return StepOutcome()
        reward = 1.0 if self._correct else (self._f1 if self.partial_credit else 0.0)
        return StepOutcome(reward=reward, terminated=True, info={"correct": self._correct, "row_f1": self._f1})

    def outcome(self) -> float:
        return 1.0 if self._correct else 0.0

    def state_key(self) -> str:
        # surrogatepass: a call may hold a lone surrogate, and the key must still be computable
        seen = hashlib.sha1("\n".join(sorted(self._seen)).encode("utf-8", "surrogatepass")).hexdigest()[:12]
        return f"{self._task_id}:{'done' if self._submitted else seen}"

    def task_type(self, task_id: str) -> str:
        return self.tasks[task_id].level if task_id in self.tasks else "default"

    def content_keys(self, task_id: str) -> set[str]:
        """What a held-out task may share with no training task (``turngym.bench.heldout``): its
        database's domain and tables (``generated``), its database (Spider), its question (``synthetic``)."""
        if self.suite == "generated":
            from turngym.envs.sql.generated import content_keys

            return content_keys(task_id)
        t = self.tasks[task_id]
        return {f"database:{t.db_id}"} if self.suite == "spider" else {f"question:{t.db_id}:{t.question}"}

    # ----- scripted hints ---------------------------------------------------------------------
    def oracle_action(self) -> str | None:
        if self._task is None or self._submitted:
            return None
        return self.format.render_call(ToolCall("oracle", "submit", {"sql": self._task.gold_sql}))

    def admissible_actions(self) -> list[str] | None:
        """Plausible moves, mostly wrong: exploration calls and a few submissions that are not
        the answer to this question (counts, whole tables, other questions' gold queries)."""
        if self._task is None or self._submitted:
            return None
        tables = self.db.tables()
        rng = random.Random(f"{self._task_id}:{self.turn}")
        same_db = (self.tasks.same_database(self._task) if hasattr(self.tasks, "same_database")
                   else [t for t in self.tasks.values() if t.db_id == self._task.db_id])
        others = [t.gold_sql for t in same_db if t.gold_sql != self._task.gold_sql]
        calls = [ToolCall("r", "submit", {"sql": f"SELECT COUNT(*) FROM {quote_ident(t)}"}) for t in tables]
        calls += [ToolCall("r", "submit", {"sql": f"SELECT * FROM {quote_ident(t)}"}) for t in tables]
        calls += [ToolCall("r", "submit", {"sql": q}) for q in rng.sample(others, min(2, len(others)))]
        if self.format.name != "text":  # the text format can only express the first tool (submit)
            calls += [ToolCall("r", "list_tables", {})]
            calls += [ToolCall("r", "describe_table", {"table": t}) for t in tables]
            calls += [ToolCall("r", "execute_sql", {"sql": f"SELECT * FROM {quote_ident(t)} LIMIT 5"}) for t in tables]
        return [self.format.render_call(c) for c in calls]

    def close(self) -> None:
        for db in self._dbs.values():
            db.close()
        self._dbs.clear()
        super().close()
