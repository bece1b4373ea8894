"""Spider loader: questions plus one SQLite file per database, built once and cached.

Two layouts are read:

- the re-packaged one in ``../shared/data/spider`` (cloudera/spiderman): ``questions.csv``
  (``database,question,sql``) and ``databases/<db>/schema.sql`` (MySQL dialect) + ``data/<table>.csv``.
  The schema is converted to SQLite by removing the `` `db`. `` prefix from table names, dropping
  ``NOT NULL`` and ``INDEX``/``KEY`` lines, then running it and inserting the CSV rows (empty
  fields and the token ``NULL`` become SQL NULL, as in the official SQLite files; other values
  are stored as text and SQLite's column affinity converts numbers). A table with no CSV, or
  whose CSV does not load, is a warning, and the questions that read it are left out: an empty
  table would make an empty answer look right;
- the official ``spider.zip`` layout: ``dev.json`` (``db_id, question, query``) and
  ``database/<db>/<db>.sqlite``, used as they are.

Gold queries are executed once when the suite loads; those that fail, read a missing table, or
return more than the env accepts (``max_rows`` / ``max_bytes``) are kept out of the task list,
reported in ``SpiderSuite.failed`` and counted in a logged warning.
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import os
import re
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from turngym.data.registry import cache_root
from turngym.data.warn import warn_once
from turngym.envs.sql.sandbox import MAX_RESULT_BYTES, ReadOnlyDB, SQLError
from turngym.envs.sql.synthetic import SQLTask
from turngym.tools.base import valid_unicode

logger = logging.getLogger(__name__)
LOADER_VERSION = "2"  # part of the cache key: bump it when the conversion changes (2: NULL token)
NULL_TOKENS = frozenset({"", "NULL"})

_DROP_LINE = re.compile(r"^\s*(?:UNIQUE\s+)?(?:INDEX|KEY|FULLTEXT\s+KEY|UNIQUE\s+KEY)\b", re.IGNORECASE)


@dataclass
class SpiderSuite:
    """Loaded Spider tasks and the ones left out.

    Attributes:
        tasks: Tasks whose gold query runs within the caps on complete tables.
        failed: ``(task, reason)`` for every task left out.
        databases: ``db_id -> SQLite file``.
        missing_tables: ``db_id -> tables without data`` (no CSV, or a CSV that did not load).
        dropped: Counts of left-out tasks by kind: ``gold_error``, ``missing_table``,
            ``over_caps``, ``missing_database``.
    """

    tasks: list[SQLTask]
    failed: list[tuple[SQLTask, str]] = field(default_factory=list)
    databases: dict[str, str] = field(default_factory=dict)
    missing_tables: dict[str, list[str]] = field(default_factory=dict)
    dropped: Counter = field(default_factory=Counter)


def find_root(folder: Path) -> tuple[Path, str]:
    """The folder holding the questions and which layout it uses (``"csv"`` or ``"official"``).

    Raises:
        FileNotFoundError: neither layout is found within two levels.
    """
    for d in (folder, *sorted(p for p in folder.iterdir() if p.is_dir())) if folder.is_dir() else ():
        if (d / "questions.csv").exists() and (d / "databases").is_dir():
            return d, "csv"
        if (d / "dev.json").exists() and (d / "database").is_dir():
            return d, "official"
    raise FileNotFoundError(f"no Spider data in {folder}: expected questions.csv + databases/ or dev.json + database/")


def mysql_schema_to_sqlite(schema: str, db_id: str) -> str:
    """The cleaned-up ``CREATE TABLE`` script (see the module docstring)."""
    lines = []
    for line in schema.splitlines():
        if line.lstrip().startswith("--") or _DROP_LINE.match(line):
            continue
        line = line.replace(f"`{db_id}`.", "")
        line = re.sub(r"\s+NOT\s+NULL\b", "", line, flags=re.IGNORECASE)
        lines.append(line)
    sql = "\n".join(lines)
    return re.sub(r",(\s*\))", r"\1", sql)  # a dropped last line can leave "x,\n)"


def build_csv_database(db_dir: Path, dest: Path) -> list[str]:
    """Convert ``db_dir`` (``schema.sql`` + ``data/*.csv``) into the SQLite file ``dest``.

    Returns:
        The tables left without data (no CSV, or one that did not load), also written to
        ``missing_tables_file(dest)`` so a cached build still knows them. A CSV that does not
        load or matches no table is a warning here; ``load_spider`` warns about every table
        without data on each load.
    """
    db_id = db_dir.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f"{dest.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    conn = sqlite3.connect(tmp, isolation_level=None)
    try:
        conn.executescript(mysql_schema_to_sqlite((db_dir / "schema.sql").read_text(encoding="utf-8"), db_id))
        tables = {r[0].lower(): r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        loaded = set()
        for path in sorted((db_dir / "data").glob("*.csv")):
            name = tables.get(path.stem.lower())
            if name is None:
                warn_once(f"Spider {db_id}: {path.name} matches no table of schema.sql; ignored")
            elif _load_csv(conn, name, path):
                loaded.add(name.lower())
        missing = sorted(t for low, t in tables.items() if low not in loaded)
    finally:
        conn.close()
    missing_tables_file(tmp).write_text(json.dumps(missing))
    missing_tables_file(tmp).replace(missing_tables_file(dest))
    tmp.replace(dest)
    return missing


def _load_csv(conn: sqlite3.Connection, table: str, path: Path) -> bool:
    """Insert one CSV into ``table`` in one transaction; on failure warn, roll back, return False."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if not header:
                raise ValueError("no header line")
            cols = ", ".join(f'"{c}"' for c in header)
            rows = [[None if v in NULL_TOKENS else v for v in r] for r in reader if r]
        conn.execute("BEGIN")
        conn.executemany(f'INSERT INTO "{table}" ({cols}) VALUES ({", ".join("?" * len(header))})', rows)
        conn.execute("COMMIT")
        return True
    except (OSError, UnicodeDecodeError, ValueError, csv.Error, sqlite3.Error) as e:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        warn_once(f"Spider: {path} did not load into table {table}: {type(e).__name__}: {e}", stacklevel=3)
        return False


def missing_tables_file(db_file: Path) -> Path:
    return db_file.with_name(db_file.name + ".missing.json")


def _fingerprint(db_dir: Path) -> str:
    h = hashlib.sha256(LOADER_VERSION.encode() + (db_dir / "schema.sql").read_bytes())
    for p in sorted((db_dir / "data").glob("*.csv")):
        h.update(f"{p.name}:{p.stat().st_size}".encode())
    return h.hexdigest()[:12]


def load_spider(
    folder: str | Path,
    cache: Path | None = None,
    check_timeout_s: float = 10.0,
    max_rows: int = 10_000,
    max_bytes: int = MAX_RESULT_BYTES,
) -> SpiderSuite:
    """Load Spider from a local copy, building the SQLite files on first use.

    Args:
        folder: ``dataset_path("spider")`` or any folder with one of the two layouts.
        cache: Where converted databases go (default ``<cache>/sql/spider``).
        check_timeout_s: Time limit per gold query during the check.
        max_rows: Tasks whose gold result has more rows are left out (the env's ``submit`` cap).
        max_bytes: Likewise for the gold result's size in bytes.
    """
    root, layout = find_root(Path(folder))
    rows, dbs, missing = _read_layout(root, layout, cache or cache_root() / "sql" / "spider")
    suite = SpiderSuite([], [], dbs, {d: m for d, m in missing.items() if m})
    for db_id, tables in suite.missing_tables.items():
        warn_once(f"Spider {db_id}: no data for table(s) {', '.join(tables)}; the questions that read them are left out")
    conns = {d: ReadOnlyDB(p, timeout_s=check_timeout_s, max_rows=max_rows, max_bytes=max_bytes) for d, p in dbs.items() if Path(p).exists()}
    try:
        for i, (db_id, question, sql) in enumerate(rows):
            task = SQLTask(f"{db_id}-{i:04d}", db_id, dbs[db_id], valid_unicode(question), sql, db_id)
            kind, reason = _check_gold(conns.get(db_id), sql, {t.lower() for t in missing.get(db_id, [])})
            if kind is None:
                suite.tasks.append(task)
            else:
                suite.failed.append((task, reason or f"database file missing: {dbs[db_id]}"))
                suite.dropped[kind] += 1
    finally:
        for c in conns.values():
            c.close()
    if suite.dropped:
        kinds = ", ".join(f"{k}: {n}" for k, n in sorted(suite.dropped.items()))
        warn_once(f"Spider: {len(suite.failed)} of {len(rows)} tasks left out ({kinds})", logger=logger)
    return suite


def _read_layout(root: Path, layout: str, cache: Path) -> tuple[list[tuple[str, str, str]], dict[str, str], dict[str, list[str]]]:
    """``(db_id, question, sql)`` rows, ``db_id -> SQLite file`` and ``db_id -> missing tables``."""
    if layout == "official":
        rows = [(q["db_id"], q["question"], q["query"]) for q in json.loads((root / "dev.json").read_text(encoding="utf-8"))]
        return rows, {d: str(root / "database" / d / f"{d}.sqlite") for d in sorted({r[0] for r in rows})}, {}
    with open(root / "questions.csv", newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if not {"database", "question", "sql"} <= set(reader.fieldnames or ()):
            raise ValueError(f"{root / 'questions.csv'}: expected columns database,question,sql, got {reader.fieldnames}")
        rows = [(r["database"], r["question"], r["sql"]) for r in reader]
    dbs, missing = {}, {}
    for db_id in sorted({r[0] for r in rows}):
        src = root / "databases" / db_id
        dest = cache / f"{db_id}-{_fingerprint(src)}.sqlite"
        if dest.exists() and missing_tables_file(dest).exists():
            missing[db_id] = json.loads(missing_tables_file(dest).read_text())
        else:
            missing[db_id] = build_csv_database(src, dest)
        dbs[db_id] = str(dest)
    return rows, dbs, missing


def _check_gold(db: ReadOnlyDB | None, sql: str, missing: set[str]) -> tuple[str | None, str]:
    """``(None, "")`` for a usable gold query, else ``(kind, reason)``."""
    if db is None:
        return "missing_database", ""
    try:
        empty = sorted(db.tables_read(sql) & missing)
        if empty:
            return "missing_table", f"reads table(s) without data: {', '.join(empty)}"
        _, _, over = db.run(sql)
    except SQLError as e:
        return "gold_error", str(e)
    if over:
        return "over_caps", f"the gold result exceeds the env's caps ({db.max_rows} rows, {db.max_bytes:,} bytes)"
    return None, ""
