"""A read-only, time-limited SQLite connection for untrusted queries.

The agent's SQL runs on a connection that cannot change anything:

- the file is opened with ``mode=ro`` (URI) and ``PRAGMA query_only=ON``;
- an authorizer allows only reading (``SELECT``, column reads, functions, recursive CTEs) and a
  few read-only ``PRAGMA``s; ``ATTACH``, ``DETACH``, DDL, DML, transactions and every other
  ``PRAGMA`` (``writable_schema``, ``journal_mode``, ...) are denied;
- a progress handler aborts a statement after ``timeout_s`` (endless recursive CTEs, huge joins);
- results are capped at ``max_rows`` rows and values at ``SQLITE_LIMIT_LENGTH`` bytes.

The source database file is therefore never written, which the isolation tests check by hash.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

READ_ONLY_PRAGMAS = frozenset({"table_info", "table_xinfo", "index_list", "index_info", "foreign_key_list"})
_ALLOWED_ACTIONS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE})
_DENIED_FUNCTIONS = frozenset({"load_extension", "readfile", "writefile", "edit"})
_PROGRESS_EVERY = 5_000  # VM instructions between deadline checks
MAX_VALUE_BYTES = 1_000_000


class SQLError(Exception):
    """The query failed: syntax, denied operation, timeout or too many rows. Shown to the agent."""


def _authorize(action: int, arg1, arg2, dbname, source) -> int:
    if action in _ALLOWED_ACTIONS:
        if action == sqlite3.SQLITE_FUNCTION and str(arg2).lower() in _DENIED_FUNCTIONS:
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_PRAGMA and str(arg1).lower() in READ_ONLY_PRAGMAS:
        return sqlite3.SQLITE_OK
    return sqlite3.SQLITE_DENY


class ReadOnlyDB:
    """One read-only connection to a SQLite file.

    Args:
        path: The database file (never modified).
        timeout_s: Wall-clock limit per statement.
        max_rows: Rows returned by ``query`` beyond this raise (``fetch_all``) or are cut (``preview``).
    """

    def __init__(self, path: str | Path, timeout_s: float = 2.0, max_rows: int = 10_000) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no database file at {self.path}")
        self.timeout_s = timeout_s
        self.max_rows = max_rows
        uri = f"{self.path.resolve().as_uri()}?mode=ro"
        self.conn = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)
        self.conn.execute("PRAGMA query_only=ON")
        self.conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
        self.conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        self.conn.set_authorizer(_authorize)
        self._deadline = 0.0
        self.conn.set_progress_handler(self._over_time, _PROGRESS_EVERY)

    def _over_time(self) -> int:
        return 1 if time.monotonic() > self._deadline else 0

    def run(self, sql: str, limit: int | None = None) -> tuple[list[str], list[tuple], bool]:
        """Run one statement.

        Args:
            sql: A single read-only statement.
            limit: Keep at most this many rows (default ``max_rows``); more sets ``truncated``.

        Returns:
            ``(columns, rows, truncated)``.

        Raises:
            SQLError: any failure, with a message fit for the agent.
        """
        limit = self.max_rows if limit is None else limit
        if not sql.strip():
            raise SQLError("the query is empty")
        self._deadline = time.monotonic() + self.timeout_s
        try:
            cur = self.conn.execute(sql)
            rows = cur.fetchmany(limit + 1)
            cols = [d[0] for d in cur.description or []]
            cur.close()
        except sqlite3.Warning as e:  # e.g. "You can only execute one statement at a time."
            raise SQLError(str(e)) from None
        except sqlite3.DatabaseError as e:
            msg = str(e)
            if time.monotonic() > self._deadline or msg == "interrupted":
                raise SQLError(f"query timed out after {self.timeout_s:g}s and was stopped") from None
            if "not authorized" in msg or "authorization denied" in msg or "prohibited" in msg:
                msg += " (this database is read-only: only SELECT queries are allowed)"
            raise SQLError(msg) from None
        except (ValueError, OverflowError, MemoryError) as e:
            raise SQLError(f"{type(e).__name__}: {e}") from None
        return cols, rows[:limit], len(rows) > limit

    def fetch_all(self, sql: str) -> tuple[list[str], list[tuple]]:
        """All rows of a query, or ``SQLError`` when there are more than ``max_rows``."""
        cols, rows, truncated = self.run(sql)
        if truncated:
            raise SQLError(f"the result has more than {self.max_rows} rows; refine the query")
        return cols, rows

    def tables(self) -> list[str]:
        _, rows = self.fetch_all("SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' ORDER BY name")
        return [r[0] for r in rows]

    def columns(self, table: str) -> list[tuple[str, str]]:
        """``(name, declared type)`` of ``table``'s columns (``SQLError`` if no such table)."""
        if table not in self.tables():
            raise SQLError(f"no table named {table!r}; tables: {', '.join(self.tables())}")
        _, rows = self.fetch_all(f"PRAGMA table_info({quote_ident(table)})")
        return [(r[1], r[2] or "") for r in rows]

    def close(self) -> None:
        self.conn.close()


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def format_table(cols: list[str], rows: list[tuple], truncated: bool = False, max_cell: int = 60) -> str:
    """A compact text table: a header line, one line per row, ``|`` between cells."""

    def cell(v) -> str:
        if v is None:
            return "NULL"
        if isinstance(v, float):
            v = round(v, 6)
        if isinstance(v, bytes):
            return f"<{len(v)} bytes>"
        s = str(v).replace("\n", " ")
        return s if len(s) <= max_cell else s[: max_cell - 3] + "..."

    lines = [" | ".join(cols)] + [" | ".join(cell(v) for v in r) for r in rows]
    tail = f"({len(rows)} row{'s' if len(rows) != 1 else ''}"
    tail += ", more rows were cut; add a LIMIT or aggregate)" if truncated else ")"
    return "\n".join(lines + [tail])
