"""The generated SQL suite behind ``turngym/SQL-synthetic-v2``: many databases, held out by domain.

Each database is one instance of a domain (``domains.py``): its rows are drawn from a seed, and
it asks every question kind of ``questions.py`` once. Training databases come from
``TRAIN_DOMAINS`` (6 instances each), held-out ones from ``TEST_DOMAINS`` (3 each), so a held-out
database shares no table, column, category value or entity name with any training database.

Task ids are ``<domain>-<instance>-<kind>`` (``library-03-top_n``) and are known without building
anything; a database is generated, written and its questions checked the first time one of its
tasks is read (``GeneratedTasks``): about 40 ms, 7 ms when its file is already cached. Files go to
``<cache>/sql/generated-v2-seed<seed>/`` and are never modified afterwards. Within a split, tasks
are ordered round-robin over the domains (each domain's tasks in a fixed shuffled order), so the
first N tasks of a split spread over every domain and question kind.
"""

from __future__ import annotations

import hashlib
import random
import sqlite3
from collections.abc import Iterator, Mapping
from pathlib import Path

from turngym.data.registry import cache_root
from turngym.envs.sql.domains import DOMAINS, SYLLABLES, Domain
from turngym.envs.sql.questions import DB, KINDS, informative
from turngym.envs.sql.synthetic import SQLTask, write_db

VERSION = "v2"
INSTANCES = {"train": 6, "test": 3}
SPLITS = ("train", "test")
_BY_NAME: dict[str, tuple[str, Domain]] = {d.name: (s, d) for s in SPLITS for d in DOMAINS[s]}
_BUILT: dict[tuple[int, str, str], dict[str, SQLTask]] = {}  # (seed, folder, db id) -> its tasks


def task_ids(split: str) -> list[str]:
    """The task ids of ``train``, ``test`` or ``all`` (train then test), in the suite's order.

    Raises:
        ValueError: Unknown split.
    """
    if split == "all":
        return task_ids("train") + task_ids("test")
    if split not in SPLITS:
        raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}")
    per_domain = []
    for d in DOMAINS[split]:
        ids = [f"{d.name}-{i:02d}-{kind}" for i in range(INSTANCES[split]) for kind in KINDS]
        random.Random(f"sql-{VERSION}-order:{d.name}").shuffle(ids)
        per_domain.append(ids)
    return [ids[k] for k in range(len(per_domain[0])) for ids in per_domain]


def split_of(task_id: str) -> str:
    """``train`` or ``test``: the split of the task's domain."""
    return _BY_NAME[task_id.split("-")[0]][0]


def content_keys(task_id: str) -> set[str]:
    """What a held-out task may share with no training task: its domain and its tables."""
    d = _BY_NAME[task_id.split("-")[0]][1]
    return {f"domain:{d.name}"} | {f"table:{t}" for t in d.schema()}


# ----- the rows ------------------------------------------------------------------------------------
def _names(rng: random.Random, syllables: tuple[str, ...], n: int) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        name = " ".join("".join(rng.choice(syllables) for _ in range(rng.choice((2, 3)))).capitalize() for _ in range(2))
        if name not in out:
            out.append(name)
    return out


def generate(d: Domain, split: str, rng: random.Random) -> DB:
    """One database of domain ``d``: 10-16 parents, 45-75 items, 160-280 events. A few parents have
    no items and about a sixth of the items no events (so "none" questions have answers), and about
    a fifth of the items lack the optional number (NULL)."""
    syl = SYLLABLES[split]
    n_p, n_i, n_e = rng.randint(10, 16), rng.randint(45, 75), rng.randint(160, 280)
    pcats = rng.sample(d.parent_cat.values, rng.randint(3, len(d.parent_cat.values)))
    icats = rng.sample(d.item_cat.values, rng.randint(3, len(d.item_cat.values)))
    idle = set(rng.sample(range(1, n_p + 1), rng.randint(2, 3)))
    active = [i for i in range(1, n_p + 1) if i not in idle]
    parent_cat = {i: rng.choice(pcats) for i in active}
    used = sorted(set(parent_cat.values()))
    for i in idle:  # an idle parent's category is one an active parent has: per-category answers
        parent_cat[i] = rng.choice(used)  # then do not depend on inner versus outer joins
    pn = d.parent_num
    parents = [(i, name, parent_cat[i], rng.randint(int(pn.low), int(pn.high)))
               for i, name in enumerate(_names(rng, syl, n_p), start=1)]
    owners = active + [rng.choice(active) for _ in range(n_i - len(active))]  # every active parent owns one
    rng.shuffle(owners)
    num, real, opt = d.item_num, d.item_real, d.item_opt
    items = [(i, title, owners[i - 1], rng.choice(icats), rng.randint(int(num.low), int(num.high)),
              round(rng.uniform(real.low, real.high), 2),
              None if rng.random() < 0.2 else rng.randint(int(opt.low), int(opt.high)))
             for i, title in enumerate(_names(rng, syl, n_i), start=1)]
    quiet = set(rng.sample(range(1, n_i + 1), n_i // 6))
    busy = [i for i in range(1, n_i + 1) if i not in quiet]
    y, qty, st = d.event_year, d.event_qty, d.event_status
    events = [(i, rng.choice(busy), rng.randint(int(y.low), int(y.high)), rng.randint(int(qty.low), int(qty.high)),
               rng.choice(st.values)) for i in range(1, n_e + 1)]
    return DB(d, parents, items, events)


def _tables(db: DB) -> dict[str, tuple[str, list[tuple]]]:
    schema = db.d.schema()
    rows = {db.P: db.parents, db.I: db.items, db.E: db.events}
    return {t: (", ".join(f"{c} {ty}" for c, ty in cols), rows[t]) for t, cols in schema.items()}


# ----- databases and tasks -------------------------------------------------------------------------
def folder_for(seed: int) -> Path:
    return cache_root() / "sql" / f"generated-{VERSION}-seed{seed}"


def database_tasks(db_id: str, seed: int = 0, folder: Path | None = None) -> dict[str, SQLTask]:
    """Build (once per process) the database ``<domain>-<instance>`` and return its tasks by id.

    Raises:
        KeyError: Unknown domain.
        RuntimeError: A question kind found no informative question on this database (a generator bug).
    """
    folder = Path(folder) if folder else folder_for(seed)
    key = (seed, str(folder), db_id)
    if key in _BUILT:
        return _BUILT[key]
    split, d = _BY_NAME[db_id.split("-")[0]]
    db = generate(d, split, random.Random(f"sql-{VERSION}:{seed}:{db_id}"))
    tables = _tables(db)
    fingerprint = hashlib.sha256(repr(tables).encode()).hexdigest()[:12]  # new data => new file
    path = folder / f"{db_id}-{fingerprint}.sqlite"
    if not path.exists():
        write_db(path, tables)
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    tasks = {}
    try:
        for kind, (level, make) in KINDS.items():
            for question, sql in make(db, random.Random(f"sql-{VERSION}:{seed}:{db_id}:{kind}")):
                if informative(conn.execute(sql).fetchall()):
                    break
            else:
                raise RuntimeError(f"{db_id}: no {kind} question has an informative answer")
            tid = f"{db_id}-{kind}"
            tasks[tid] = SQLTask(tid, db_id, str(path), question, sql, level, kind)
    finally:
        conn.close()
    _BUILT[key] = tasks
    return tasks


class GeneratedTasks(Mapping):
    """Task id -> ``SQLTask`` for one split; a task's database is built when the task is first read.

    Args:
        split: ``train``, ``test`` or ``all``.
        seed: Seeds every database's rows and question parameters (the domains and ids stay).
        folder: Where the ``.sqlite`` files go (default ``<cache>/sql/generated-v2-seed<seed>``).
    """

    def __init__(self, split: str, seed: int = 0, folder: Path | None = None) -> None:
        self.split, self.seed, self.folder = split, seed, folder
        self._ids = task_ids(split)
        self._known = set(self._ids)

    def __getitem__(self, task_id: str) -> SQLTask:
        if task_id not in self._known:
            raise KeyError(task_id)
        return database_tasks(task_id.rsplit("-", 1)[0], self.seed, self.folder)[task_id]

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._known

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def same_database(self, task: SQLTask) -> list[SQLTask]:
        """The tasks that ask about ``task``'s database (builds only that one)."""
        return list(database_tasks(task.db_id, self.seed, self.folder).values())


def oracle_replies(split: str = "train", seed: int = 0, tool_format: str = "xml") -> dict[str, str]:
    """Each task's oracle reply as a policy would write it: the ``submit`` call of its gold query in
    ``tool_format``. A reply cap shorter than the longest of these cuts some answers."""
    from turngym.tools.formats import get_format
    from turngym.types import ToolCall

    fmt = get_format(tool_format)
    return {tid: fmt.render_call(ToolCall("oracle", "submit", {"sql": t.gold_sql}))
            for tid, t in GeneratedTasks(split, seed).items()}
