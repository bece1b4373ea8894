"""A read-only, time- and size-limited SQLite connection for untrusted queries.

The agent's SQL runs on a connection that cannot change anything or leave its budget:

- the file is opened with ``mode=ro`` (URI) and ``PRAGMA query_only=ON``;
- an authorizer allows only reading (``SELECT``, column reads, recursive CTEs), a few read-only
  ``PRAGMA``s and an allowlist of core SQL functions. ``ATTACH``, ``DETACH``, DDL, DML,
  transactions, every other ``PRAGMA`` (``writable_schema``, ``journal_mode``, ...) and every
  other function (``load_extension``, ``fts3_tokenizer``, ``fts5``, ``rtree*``, ...) are denied;
- a watchdog enforces ``timeout_s`` in wall-clock time: the statement runs on a worker thread,
  the caller waits, then calls ``interrupt()``. SQLite only notices an interrupt between VM
  opcodes, and one opcode can run for minutes (a huge ``printf`` width, ``instr`` on 1 MB
  strings), so a statement that ignores the interrupt is abandoned on its thread and the
  connection is replaced: the caller gets its error within ``timeout_s`` + 0.5 s whatever the
  statement does;
- a progress handler stops the statement from inside SQLite once its deadline has passed or it
  was abandoned, so an abandoned statement stops at its next opcodes instead of running on;
- the known long single opcodes are bounded too, so no one function call burns much CPU: values
  are capped at ``MAX_VALUE_BYTES`` (``instr``/``replace`` are quadratic in it), ``LIKE``/``GLOB``
  patterns at ``MAX_PATTERN_BYTES`` (matching is the string's length times the pattern's),
  ``printf``/``format`` refuse a format whose widths and precisions add up to more than it
  (SQLite 3.40 loops over the precision of ``%c`` even when the output is already too big, so
  12,000 specifiers of 99,999 each once ran 6 s in one call), and the two-argument ``trim``,
  ``ltrim`` and ``rtrim`` refuse a value whose length times the character set's passes
  ``MAX_TRIM_WORK`` (SQLite compares every character with every one of the set: a 99,000-byte
  value and an 8,000-character set took 2.8 s);
- temporary storage is capped: the same handler stops a statement before the temporary files
  this process holds open (sorts, ``DISTINCT``, ``UNION``, recursive CTEs spill there) pass
  ``MAX_TEMP_BYTES`` (Linux: counted through ``/proc/self/fd``). It counts every couple of
  milliseconds and stops at ``TEMP_STOP_BYTES``, a margin below the cap that covers what a
  statement can write between two counts, so the peak stays under the cap (counting every 100,000
  opcodes once let rows of 99 KB reach 450 MB);
- results are fetched row by row and capped at ``max_rows`` rows and ``max_bytes`` bytes, so a
  huge result is refused without ever being held in memory;
- SQL text that is not valid Unicode (a lone surrogate) is an error, not an exception, and
  stored text that is not valid UTF-8 is read with its bad bytes dropped.

The source database file is therefore never written, which the isolation tests check by hash.
"""

from __future__ import annotations

import os
import queue
import re
import sqlite3
import threading
import time
import weakref
from pathlib import Path

READ_ONLY_PRAGMAS = frozenset({"table_info", "table_xinfo", "index_list", "index_info", "foreign_key_list"})
# Core scalar, aggregate, window, date, math and JSON functions (sqlite.org/lang_corefunc.html and
# friends). An allowlist, not a denylist: extension functions that a SQLite build happens to
# include (fts3_tokenizer returns a raw pointer, and with two arguments installs one) stay denied.
ALLOWED_FUNCTIONS = frozenset("""
abs changes char coalesce concat concat_ws format glob hex if ifnull iif instr last_insert_rowid length
like likelihood likely lower ltrim max min nullif octet_length printf quote random randomblob replace
round rtrim sign soundex sqlite_version substr substring subtype total_changes trim typeof unhex unicode
unistr unlikely upper zeroblob
avg count group_concat string_agg sum total median percentile percentile_cont percentile_disc
row_number rank dense_rank percent_rank cume_dist ntile lag lead first_value last_value nth_value
date time datetime julianday unixepoch strftime timediff current_date current_time current_timestamp
acos acosh asin asinh atan atan2 atanh ceil ceiling cos cosh degrees exp floor ln log log10 log2 mod
pi pow power radians sin sinh sqrt tan tanh trunc
json json_array json_array_length json_error_position json_extract json_insert json_object json_patch
json_pretty json_quote json_remove json_replace json_set json_type json_valid json_group_array
json_group_object -> ->>
""".split())
_ALLOWED_ACTIONS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE})
MAX_VALUE_BYTES = 100_000  # per value; instr/replace take ~0.1 s at this size, ~12 s at 1 MB
MAX_SQL_BYTES = 100_000  # per query text
MAX_RESULT_BYTES = 8_000_000  # per result (what submit may hold): 10,000 rows of 800 bytes
MAX_STUCK = 2  # abandoned statements still running before new queries are refused
MAX_PATTERN_BYTES = 1_000  # per LIKE / GLOB pattern (SQLite allows 50,000: ~5e9 steps on one value)
MAX_TEMP_BYTES = 64 * 2**20  # temporary files of all statements in this process, together, at their peak
# A statement is stopped once its temporary files pass this: the 16 MB below the cap cover what it
# can write between two counts (a couple of milliseconds, plus one sorter flush of ~2 MB).
TEMP_STOP_BYTES = MAX_TEMP_BYTES - 16 * 2**20
MAX_TRIM_WORK = 2_000_000  # value length x character set for a two-argument trim (~10 ms of CPU)
_PROGRESS_OPCODES = 1_000  # the progress handler runs this often (tens of microseconds of work)
_TEMP_CHECK_S = 0.002  # ... and counts temporary files at most this often (a count costs ~0.1 ms)
_PRINTF_SPEC = re.compile(r"%[-+ 0#,!]*(\*|\d+)?(?:\.(\*|\d*))?(?:ll|l)?(.)", re.DOTALL)


class SQLError(Exception):
    """The query failed: syntax, denied operation, timeout or too big a result. Shown to the agent."""


class _Job:
    """One statement for the worker thread; the caller reads the outcome once ``done`` is set."""

    def __init__(self, sql: str, limit: int, max_bytes: int, deadline: float = float("inf")) -> None:
        self.sql, self.limit, self.max_bytes, self.deadline = sql, limit, max_bytes, deadline
        self.done = threading.Event()
        self.abandoned = False
        self.stopped: str | None = None  # why the progress handler stopped it
        self.cols: list[str] = []
        self.rows: list[tuple] = []
        self.cut: str | None = None  # "rows" or "bytes" when the result was cut
        self.error: BaseException | None = None


class _Callbacks:
    """The connection's authorizer and its ``printf`` and ``trim`` overrides. Kept apart from
    ``ReadOnlyDB`` so that a worker thread, which holds the connection, does not keep the
    ``ReadOnlyDB`` alive."""

    def __init__(self) -> None:
        self.reads: set[str] | None = None  # tables read by the statement being compiled, when recording
        self.builtin_conn = _limited(sqlite3.connect(":memory:", check_same_thread=False))
        self.builtin_conn.text_factory = _decode_text  # trim of a blob is text, not always UTF-8
        self.builtin_lock = threading.Lock()
        self.refused: str | None = None  # why an override last refused its arguments (SQLite drops the text)

    def authorize(self, action: int, arg1, arg2, dbname, source) -> int:
        if action == sqlite3.SQLITE_READ and self.reads is not None:
            self.reads.add(str(arg1).lower())
        if action in _ALLOWED_ACTIONS:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION:
            return sqlite3.SQLITE_OK if str(arg2).lower() in ALLOWED_FUNCTIONS else sqlite3.SQLITE_DENY
        if action == sqlite3.SQLITE_PRAGMA and str(arg1).lower() in READ_ONLY_PRAGMAS:
            return sqlite3.SQLITE_OK
        return sqlite3.SQLITE_DENY

    def printf(self, fmt, *args):
        """SQLite's own ``printf``, run on a private connection once every width is checked."""
        if isinstance(fmt, str):
            self._check(check_printf_sizes, fmt, args)
        return self._builtin("printf", (fmt, *args))

    def trimmer(self, name: str):
        """SQLite's own two-argument ``name`` (trim, ltrim, rtrim), once its work is checked."""

        def trim(value, chars):
            self._check(check_trim_work, value, chars)
            return self._builtin(name, (value, chars))

        return trim

    def _check(self, check, *args) -> None:
        try:
            check(*args)
        except ValueError as e:
            self.refused = str(e)
            raise

    def _builtin(self, name: str, args: tuple):
        with self.builtin_lock:
            marks = ", ".join("?" * len(args))
            return self.builtin_conn.execute(f"SELECT {name}({marks})", args).fetchone()[0]


class _Progress:
    """The connection's progress handler: a nonzero return interrupts the running statement."""

    def __init__(self) -> None:
        self.job: _Job | None = None
        self.temp = TempFiles()
        self.next_count = 0.0

    def __call__(self) -> int:
        job = self.job
        if job is None:
            return 0
        now = time.monotonic()
        if job.abandoned or now > job.deadline:
            job.stopped = job.stopped or "time"
            return 1
        if now >= self.next_count:
            self.next_count = now + _TEMP_CHECK_S
            if self.temp.total() > TEMP_STOP_BYTES:
                job.stopped = "temp"
                return 1
        return 0


class TempFiles:
    """Counts the bytes of SQLite's temporary files this process holds open. SQLite unlinks them
    (``etilqs_*``) as soon as it opens them, so only an open descriptor finds them.

    Which file each descriptor is, is remembered by device and inode: a count lists
    ``/proc/self/fd`` and stats each descriptor, and reads a link only for a file it has not seen.
    """

    _MAX_SEEN = 4096  # remembered files; past it the memory starts over

    def __init__(self) -> None:
        self._is_temp: dict[tuple[int, int], bool] = {}

    def total(self) -> int:
        """Bytes of temporary files open in this process now (0 where ``/proc`` is missing)."""
        try:
            fds = os.listdir("/proc/self/fd")
        except OSError:
            return 0
        if len(self._is_temp) > self._MAX_SEEN:
            self._is_temp.clear()
        total = 0
        for fd in fds:
            try:
                st = os.fstat(int(fd))
                key = (st.st_dev, st.st_ino)
                temp = self._is_temp.get(key)
                if temp is None:
                    temp = self._is_temp[key] = "etilqs_" in os.readlink(f"/proc/self/fd/{fd}")
                if temp:
                    total += st.st_size
            except (OSError, ValueError):
                continue
        return total


def temp_bytes() -> int:
    """Bytes of deleted temporary files this process holds open (see ``TempFiles``)."""
    return TempFiles().total()


def _serve(inbox: queue.SimpleQueue, conn: sqlite3.Connection, progress: _Progress) -> None:
    """A worker thread's loop: run jobs on ``conn`` until ``None`` arrives or a job is abandoned."""
    try:
        while (job := inbox.get()) is not None:
            progress.job = job
            _execute(conn, job)
            progress.job = None
            if job.abandoned:
                break
    finally:
        conn.close()


def _execute(conn: sqlite3.Connection, job: _Job) -> None:
    try:
        cur = conn.execute(job.sql)
        job.cols = [d[0] for d in cur.description or []]
        size = 0
        for row in cur:  # row by row: a huge result is refused, never held
            if len(job.rows) >= job.limit:
                job.cut = "rows"
                break
            size += sum(len(v) if isinstance(v, (str, bytes)) else 8 for v in row)
            if size > job.max_bytes:
                job.cut = "bytes"
                break
            job.rows.append(row)
        cur.close()
    except BaseException as e:  # handed to the caller, who turns it into an SQLError
        job.error = e
    finally:
        job.done.set()


class ReadOnlyDB:
    """One read-only connection to a SQLite file, served by one worker thread.

    Args:
        path: The database file (never modified).
        timeout_s: Wall-clock limit per statement.
        max_rows: Rows beyond this raise (``fetch_all``) or are cut (``run``).
        max_bytes: Result size (text and blob lengths, 8 per number) beyond which the same happens.
    """

    def __init__(self, path: str | Path, timeout_s: float = 2.0, max_rows: int = 10_000, max_bytes: int = MAX_RESULT_BYTES) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no database file at {self.path}")
        self.timeout_s, self.max_rows, self.max_bytes = timeout_s, max_rows, max_bytes
        self._cb = _Callbacks()
        self._reads_memo: dict[str, frozenset[str]] = {}
        self._stuck: list[threading.Thread] = []
        self._start()

    def _start(self) -> None:
        """A fresh connection and the worker thread that owns it."""
        uri = f"{self.path.resolve().as_uri()}?mode=ro"
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA query_only=ON")
        # text that is not valid UTF-8 (third-party data) loses its bad bytes instead of failing
        # the query; the official Spider evaluator decodes the same way
        conn.text_factory = _decode_text
        _limited(conn)
        if hasattr(conn, "enable_load_extension"):  # absent when Python was built without it
            conn.enable_load_extension(False)
        for name in ("printf", "format"):
            conn.create_function(name, -1, self._cb.printf, deterministic=True)
        for name in ("trim", "ltrim", "rtrim"):  # the one-argument forms trim spaces: linear, left as they are
            conn.create_function(name, 2, self._cb.trimmer(name), deterministic=True)
        conn.set_authorizer(self._cb.authorize)
        progress = _Progress()
        conn.set_progress_handler(progress, _PROGRESS_OPCODES)
        self.conn, self._inbox = conn, queue.SimpleQueue()
        self._worker = threading.Thread(target=_serve, args=(self._inbox, conn, progress), name="turngym-sql", daemon=True)
        self._worker.start()
        weakref.finalize(self, self._inbox.put, None)  # a dropped ReadOnlyDB stops its worker

    def _wait(self, job: _Job, timeout_s: float) -> bool:
        """Wait for ``job``; past the deadline interrupt it, and abandon it if that is ignored.

        Returns whether the job finished on its own (else it was stopped or abandoned).
        """
        if job.done.wait(timeout_s):
            return True
        self.conn.interrupt()
        if job.done.wait(min(0.5, timeout_s)):
            return job.error is None  # it may have finished just before the interrupt
        job.abandoned = True  # the worker closes that connection and exits once the opcode ends
        self._inbox.put(None)  # in case it finished before it could see ``abandoned``
        self._stuck.append(self._worker)
        self._start()
        return False

    def _submit(self, sql: str, limit: int, timeout_s: float | None) -> _Job:
        if not isinstance(sql, str) or not sql.strip():
            raise SQLError("the query is empty")
        try:
            size = len(sql.encode("utf-8"))
        except UnicodeEncodeError as e:
            raise SQLError(f"the query is not valid Unicode ({e.reason} at character {e.start})") from None
        if size > MAX_SQL_BYTES:
            raise SQLError(f"the query is {size} bytes long; the limit is {MAX_SQL_BYTES}")
        self._stuck = [t for t in self._stuck if t.is_alive()]
        if len(self._stuck) >= MAX_STUCK:
            raise SQLError("the database is still stopping earlier queries that ran too long; try again shortly")
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        job = _Job(sql, limit, self.max_bytes, time.monotonic() + timeout_s)
        self._cb.refused = None
        self._inbox.put(job)
        if not self._wait(job, timeout_s) or job.stopped == "time":
            raise SQLError(f"query timed out after {timeout_s:g}s and was stopped")
        if job.stopped == "temp":
            raise SQLError(f"the query needs more than {MAX_TEMP_BYTES // 2**20} MB of temporary storage "
                           "(sorting, DISTINCT, UNION or a recursive CTE over too many rows); it was stopped")
        if job.error is not None:
            refused, self._cb.refused = self._cb.refused, None
            if refused and "user-defined function raised exception" in str(job.error):
                raise SQLError(refused)
            raise _as_sql_error(job.error)
        return job

    def run(self, sql: str, limit: int | None = None, timeout_s: float | None = None) -> tuple[list[str], list[tuple], bool]:
        """Run one statement.

        Args:
            sql: A single read-only statement.
            limit: Keep at most this many rows (default ``max_rows``); more sets ``truncated``, as
                does a result over ``max_bytes``.
            timeout_s: This statement's time limit (default ``timeout_s``).

        Returns:
            ``(columns, rows, truncated)``.

        Raises:
            SQLError: any failure, with a message fit for the agent.
        """
        job = self._submit(sql, self.max_rows if limit is None else limit, timeout_s)
        return job.cols, job.rows, job.cut is not None

    def fetch_all(self, sql: str, timeout_s: float | None = None) -> tuple[list[str], list[tuple]]:
        """All rows of a query, or ``SQLError`` when there are more than ``max_rows`` or ``max_bytes``."""
        job = self._submit(sql, self.max_rows, timeout_s)
        if job.cut == "rows":
            raise SQLError(f"the result has more than {self.max_rows} rows; refine the query")
        if job.cut == "bytes":
            raise SQLError(f"the result is larger than {self.max_bytes:,} bytes; select fewer or smaller values")
        return job.cols, job.rows

    def tables_read(self, sql: str) -> frozenset[str]:
        """The tables (lower-cased) that ``sql`` reads, as SQLite's authorizer reports them.

        The statement is only compiled (``EXPLAIN``), never run. Raises ``SQLError`` if it fails.
        """
        if sql not in self._reads_memo:  # memoized: a cached statement skips the authorizer
            self._cb.reads = set()
            try:
                self._submit(f"EXPLAIN {sql}", 1_000_000, None)
                self._reads_memo[sql] = frozenset(self._cb.reads)
            finally:
                self._cb.reads = None
        return self._reads_memo[sql]

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
        """Stop the worker, which closes the connection (a stuck one closes its own when it ends)."""
        self._inbox.put(None)
        self._worker.join(timeout=5.0)  # it only runs a statement within the time limit


def _limited(conn: sqlite3.Connection) -> sqlite3.Connection:
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
    conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, MAX_SQL_BYTES + 16)  # + room for "EXPLAIN "
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    conn.setlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, MAX_PATTERN_BYTES)
    return conn


def _decode_text(b: bytes) -> str:
    return b.decode("utf-8", errors="ignore")


def check_printf_sizes(fmt: str, args: tuple) -> None:
    """Raise ``ValueError`` if the widths and precisions in ``fmt`` (digits or ``*``) add up to more
    than ``MAX_VALUE_BYTES``: SQLite's work for one call grows with their sum, and no result can
    be longer than that anyway."""
    i = 0  # the next argument; ``*`` takes one, as does every conversion but %% and %n
    work = 0
    for m in _PRINTF_SPEC.finditer(fmt):
        width, precision, conv = m.groups()
        for part in (width, precision):
            if part == "*":
                n, i = _as_int(args[i] if i < len(args) else 0), i + 1
            else:
                n = int(part) if part else 0
            work += abs(n)
            if work > MAX_VALUE_BYTES:
                raise ValueError(f"printf widths and precisions add up to {work}, over the limit of {MAX_VALUE_BYTES}")
        if conv not in "%n":
            i += 1


def check_trim_work(value, chars) -> None:
    """Raise ``ValueError`` if trimming ``value`` by the set ``chars`` could take more than
    ``MAX_TRIM_WORK`` comparisons (SQLite compares each character with every one of the set)."""
    if value is None or chars is None:
        return
    size = len(value) if isinstance(value, (str, bytes)) else 32
    n_chars = len(chars) if isinstance(chars, (str, bytes)) else 32
    if size * n_chars > MAX_TRIM_WORK:
        raise ValueError(f"trim of {size} characters by a set of {n_chars} is over the limit of {MAX_TRIM_WORK:,}")


def _as_int(v) -> int:
    try:
        return int(float(v))
    except (TypeError, ValueError, OverflowError):
        return 0  # SQLite reads non-numbers as 0 here


def _as_sql_error(e: BaseException) -> SQLError:
    msg = str(e)
    if isinstance(e, sqlite3.DatabaseError) and msg == "interrupted":
        return SQLError("query timed out and was stopped")
    if "not authorized" in msg or "authorization denied" in msg or "prohibited" in msg:
        return SQLError(msg + " (this database is read-only: only SELECT queries and core SQL functions are allowed)")
    if "user-defined function raised exception" in msg:
        return SQLError("printf/format or trim failed (too long a result?)")
    if isinstance(e, (sqlite3.Error, sqlite3.Warning)):  # Warning: "You can only execute one statement at a time."
        return SQLError(msg)
    return SQLError(f"{type(e).__name__}: {msg}")


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
