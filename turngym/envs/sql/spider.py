"""Spider loader: questions plus one SQLite file per database, built once and cached.

Two layouts are read:

- the re-packaged one in ``../shared/data/spider`` (cloudera/spiderman): ``questions.csv``
  (``database,question,sql``) and ``databases/<db>/schema.sql`` (MySQL dialect) + ``data/<table>.csv``.
  The schema is converted to SQLite by removing the `` `db`. `` prefix from table names, dropping
  ``NOT NULL`` and ``INDEX``/``KEY`` lines, then running it and inserting the CSV rows (empty
  fields become NULL; other values are stored as text and SQLite's column affinity converts
  numbers, as in the original Spider files);
- the official ``spider.zip`` layout: ``dev.json`` (``db_id, question, query``) and
  ``database/<db>/<db>.sqlite``, used as they are.

Gold queries are executed once when the suite loads; those that fail are kept out of the task
list and reported in ``SpiderSuite.failed``.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from turngym.data.registry import cache_root
from turngym.envs.sql.sandbox import ReadOnlyDB, SQLError
from turngym.envs.sql.synthetic import SQLTask

_DROP_LINE = re.compile(r"^\s*(?:UNIQUE\s+)?(?:INDEX|KEY|FULLTEXT\s+KEY|UNIQUE\s+KEY)\b", re.IGNORECASE)


@dataclass
class SpiderSuite:
    """Loaded Spider tasks (gold runs) and the gold queries that failed, with their errors."""

    tasks: list[SQLTask]
    failed: list[tuple[SQLTask, str]] = field(default_factory=list)
    databases: dict[str, str] = field(default_factory=dict)


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


def build_csv_database(db_dir: Path, dest: Path) -> None:
    """Convert ``db_dir`` (``schema.sql`` + ``data/*.csv``) into the SQLite file ``dest``."""
    db_id = db_dir.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f"{dest.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    conn = sqlite3.connect(tmp)
    try:
        conn.executescript(mysql_schema_to_sqlite((db_dir / "schema.sql").read_text(encoding="utf-8"), db_id))
        tables = {r[0].lower(): r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        for path in sorted((db_dir / "data").glob("*.csv")):
            name = tables.get(path.stem.lower())
            if name is None:
                raise ValueError(f"{path} has no table in {db_dir / 'schema.sql'}")
            with open(path, newline="", encoding="utf-8") as f:
                reader = csv.reader(f)
                header = next(reader, None)
                if not header:
                    continue
                cols = ", ".join(f'"{c}"' for c in header)
                rows = [[None if v == "" else v for v in r] for r in reader if r]
                conn.executemany(f'INSERT INTO "{name}" ({cols}) VALUES ({", ".join("?" * len(header))})', rows)
        conn.commit()
    finally:
        conn.close()
    tmp.replace(dest)


def _fingerprint(db_dir: Path) -> str:
    h = hashlib.sha256((db_dir / "schema.sql").read_bytes())
    for p in sorted((db_dir / "data").glob("*.csv")):
        h.update(f"{p.name}:{p.stat().st_size}".encode())
    return h.hexdigest()[:12]


def load_spider(folder: str | Path, cache: Path | None = None, check_timeout_s: float = 10.0) -> SpiderSuite:
    """Load Spider from a local copy, building the SQLite files on first use.

    Args:
        folder: ``dataset_path("spider")`` or any folder with one of the two layouts.
        cache: Where converted databases go (default ``<cache>/sql/spider``).
        check_timeout_s: Time limit per gold query during the check.
    """
    root, layout = find_root(Path(folder))
    cache = cache or cache_root() / "sql" / "spider"
    if layout == "csv":
        with open(root / "questions.csv", newline="", encoding="utf-8") as f:
            rows = [(r["database"], r["question"], r["sql"]) for r in csv.DictReader(f)]
        dbs = {}
        for db_id in sorted({r[0] for r in rows}):
            src = root / "databases" / db_id
            dest = cache / f"{db_id}-{_fingerprint(src)}.sqlite"
            if not dest.exists():
                build_csv_database(src, dest)
            dbs[db_id] = str(dest)
    else:
        rows = [(q["db_id"], q["question"], q["query"]) for q in json.loads((root / "dev.json").read_text(encoding="utf-8"))]
        dbs = {d: str(root / "database" / d / f"{d}.sqlite") for d in sorted({r[0] for r in rows})}
    suite = SpiderSuite([], [], dbs)
    conns = {d: ReadOnlyDB(p, timeout_s=check_timeout_s, max_rows=100_000) for d, p in dbs.items() if Path(p).exists()}
    try:
        for i, (db_id, question, sql) in enumerate(rows):
            task = SQLTask(f"{db_id}-{i:04d}", db_id, dbs[db_id], question, sql, db_id)
            if db_id not in conns:
                suite.failed.append((task, f"database file missing: {dbs[db_id]}"))
                continue
            try:
                conns[db_id].fetch_all(sql)
                suite.tasks.append(task)
            except SQLError as e:
                suite.failed.append((task, str(e)))
    finally:
        for c in conns.values():
            c.close()
    return suite
