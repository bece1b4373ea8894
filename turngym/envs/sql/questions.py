"""The question kinds of the generated SQL suite: twenty templates that fit every domain.

Each kind is a function ``(db, rng) -> candidates``: ``(question, gold SQL)`` pairs in a seeded
order, with their parameters (a category, a name, a threshold) drawn from the database's own rows.
The suite keeps the first candidate whose gold result is informative (``informative``), so every
database asks every kind once. Kinds span filters, aggregates, grouping, ordering, joins of two
and three tables, outer joins, ``HAVING``, sub-queries and NULL handling; each question names
its tie-break, and lists name a column that is unique in its table, so the answer is one result.
Gold queries are one line (the ``text`` tool format reads one line).
"""

from __future__ import annotations

import random
import statistics
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from turngym.envs.sql.domains import Domain

Candidates = Iterator[tuple[str, str]]


@dataclass
class DB:
    """A database's rows, as generated (``parents``: ``(id, name, cat, num)``; ``items``:
    ``(id, title, parent_id, cat, num, real, opt)``; ``events``: ``(id, item_id, year, qty, status)``),
    with the words its questions use."""

    d: Domain
    parents: list[tuple]
    items: list[tuple]
    events: list[tuple]

    def __post_init__(self) -> None:
        d = self.d
        self.P, self.I, self.E = d.parent[0], d.item[0], d.event[0]
        self.parent, self.item, self.event = d.parent[1], d.item[1], d.event[1]
        self.parents_pl, self.items_pl = self.P.replace("_", " "), self.I.replace("_", " ")
        self.title = d.item_title

    def values(self, rows: list[tuple], idx: int) -> list:
        """The distinct non-NULL values of column ``idx``, sorted (a stable base for seeded picks)."""
        return sorted({r[idx] for r in rows if r[idx] is not None})

    def items_of(self, parent_id: int) -> list[tuple]:
        return [r for r in self.items if r[2] == parent_id]


def q(s: str) -> str:
    """A value as an SQL string literal's body."""
    return str(s).replace("'", "''")


def a(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def shuffled(xs, rng: random.Random) -> list:
    xs = list(xs)
    rng.shuffle(xs)
    return xs


def informative(rows: list[tuple]) -> bool:
    """A gold result that tells answers apart: not empty, not all NULL, and not a lone 0 (which
    many wrong queries return too)."""
    if not rows or all(v is None for r in rows for v in r):
        return False
    return not (len(rows) == 1 and len(rows[0]) == 1 and rows[0][0] == 0)


# ----- easy: one table ----------------------------------------------------------------------------
def count_filter(db: DB, rng: random.Random) -> Candidates:
    c = db.d.item_cat
    for v in shuffled(db.values(db.items, 3), rng):
        yield (f"How many {db.items_pl} have the {c.label} '{v}'?",
               f"SELECT COUNT(*) FROM {db.I} WHERE {c.col} = '{q(v)}'")


def list_filter(db: DB, rng: random.Random) -> Candidates:
    c, n = db.d.item_cat, db.d.item_num
    for v in shuffled(db.values(db.items, 3), rng):
        nums = sorted({r[4] for r in db.items if r[3] == v})
        if len(nums) < 2:
            continue
        x = rng.choice(nums[1:])  # keeps some rows and drops at least the smallest
        yield (f"List the {db.title}s of the {db.items_pl} with the {c.label} '{v}' whose {n.label} is at least {x}.",
               f"SELECT {db.title} FROM {db.I} WHERE {c.col} = '{q(v)}' AND {n.col} >= {x}")


def min_max(db: DB, rng: random.Random) -> Candidates:
    c, n = db.d.item_cat, db.d.item_num
    for v in shuffled(db.values(db.items, 3), rng):
        word, fn = rng.choice((("highest", "MAX"), ("lowest", "MIN")))
        yield (f"What is the {word} {n.label} among the {db.items_pl} with the {c.label} '{v}'?",
               f"SELECT {fn}({n.col}) FROM {db.I} WHERE {c.col} = '{q(v)}'")


def range_count(db: DB, rng: random.Random) -> Candidates:
    r = db.d.item_real
    reals = sorted(row[5] for row in db.items)
    for _ in range(20):
        lo = int(reals[rng.randint(0, len(reals) // 2)])
        hi = int(reals[rng.randint(len(reals) // 2, len(reals) - 1)]) + 1
        yield (f"How many {db.items_pl} have a {r.label} between {lo} and {hi}, inclusive?",
               f"SELECT COUNT(*) FROM {db.I} WHERE {r.col} BETWEEN {lo} AND {hi}")


def null_count(db: DB, rng: random.Random) -> Candidates:
    o, c = db.d.item_opt, db.d.item_cat
    for v in shuffled(db.values(db.items, 3), rng):
        yield (f"How many {db.items_pl} with the {c.label} '{v}' have no {o.label} recorded?",
               f"SELECT COUNT(*) FROM {db.I} WHERE {c.col} = '{q(v)}' AND {o.col} IS NULL")
    yield (f"How many {db.items_pl} have no {o.label} recorded?", f"SELECT COUNT(*) FROM {db.I} WHERE {o.col} IS NULL")


def distinct_sorted(db: DB, rng: random.Random) -> Candidates:
    c, n = db.d.parent_cat, db.d.parent_num
    nums = sorted(r[3] for r in db.parents)
    for x in shuffled(nums[len(nums) // 4: 3 * len(nums) // 4], rng):
        yield (f"List every {c.label} of the {db.parents_pl} whose {n.label} is above {x}, each once, "
               "in alphabetical order.",
               f"SELECT DISTINCT {c.col} FROM {db.P} WHERE {n.col} > {x} ORDER BY {c.col}")


# ----- medium: grouping, ordering, one join ---------------------------------------------------------
def group_count(db: DB, rng: random.Random) -> Candidates:
    c, s = db.d.item_cat, db.d.event_status
    variants = [
        (f"For each {c.label}, how many {db.items_pl} are there? Give the {c.label} and the count.",
         f"SELECT {c.col}, COUNT(*) FROM {db.I} GROUP BY {c.col}"),
        (f"For each {s.label} of the {db.E.replace('_', ' ')}, how many are there? Give the {s.label} and the count.",
         f"SELECT {s.col}, COUNT(*) FROM {db.E} GROUP BY {s.col}"),
    ]
    yield from shuffled(variants, rng)


def top_n(db: DB, rng: random.Random) -> Candidates:
    for _ in range(10):
        col = rng.choice((db.d.item_num, db.d.item_real))
        n = rng.randint(3, 5)
        word, other, order = rng.choice((("highest", "lowest", "DESC"), ("lowest", "highest", "ASC")))
        yield (f"What are the {db.title}s of the {n} {db.items_pl} with the {word} {col.label}, from {word} to {other}? "
               f"Break ties by {db.title} in alphabetical order.",
               f"SELECT {db.title} FROM {db.I} ORDER BY {col.col} {order}, {db.title} LIMIT {n}")


def join_count(db: DB, rng: random.Random) -> Candidates:
    c = db.d.parent_cat
    for v in shuffled(db.values(db.parents, 2), rng):
        yield (f"How many {db.items_pl} belong to {db.parents_pl} whose {c.label} is '{v}'?",
               f"SELECT COUNT(*) FROM {db.I} c JOIN {db.P} p ON c.{db.d.parent_fk} = p.id WHERE p.{c.col} = '{q(v)}'")


def join_list(db: DB, rng: random.Random) -> Candidates:
    for p in shuffled(db.parents, rng):
        if len(db.items_of(p[0])) >= 2:
            yield (f"List the {db.title}s of the {db.items_pl} of the {db.parent} named '{p[1]}', in alphabetical order.",
                   f"SELECT c.{db.title} FROM {db.I} c JOIN {db.P} p ON c.{db.d.parent_fk} = p.id "
                   f"WHERE p.name = '{q(p[1])}' ORDER BY c.{db.title}")


def group_avg(db: DB, rng: random.Random) -> Candidates:
    c, n = db.d.parent_cat, db.d.item_num
    yield (f"For each {c.label} of the {db.parents_pl}, what is the average {n.label} of their {db.items_pl}? "
           f"Give the {c.label} and the average.",
           f"SELECT p.{c.col}, AVG(c.{n.col}) FROM {db.P} p JOIN {db.I} c ON c.{db.d.parent_fk} = p.id GROUP BY p.{c.col}")


def null_avg(db: DB, rng: random.Random) -> Candidates:
    o, c = db.d.item_opt, db.d.item_cat
    for v in shuffled(db.values(db.items, 3), rng):
        yield (f"What is the average {o.label} of the {db.items_pl} with the {c.label} '{v}', counting only those "
               "that have one recorded?",
               f"SELECT AVG({o.col}) FROM {db.I} WHERE {c.col} = '{q(v)}'")


def left_join_count(db: DB, rng: random.Random) -> Candidates:
    yield (f"For each {db.parent}, how many {db.items_pl} does it have? Include the {db.parents_pl} that have none. "
           "Give the name and the count.",
           f"SELECT p.name, COUNT(c.id) FROM {db.P} p LEFT JOIN {db.I} c ON c.{db.d.parent_fk} = p.id GROUP BY p.id")


def argmax(db: DB, rng: random.Random) -> Candidates:
    yield (f"Which {db.parent} has the most {db.items_pl}? If several tie, give the name that comes first "
           "alphabetically.",
           f"SELECT p.name FROM {db.P} p JOIN {db.I} c ON c.{db.d.parent_fk} = p.id GROUP BY p.id "
           "ORDER BY COUNT(*) DESC, p.name LIMIT 1")


# ----- hard: three tables, HAVING, sub-queries, NULLs -----------------------------------------------
def join3_sum(db: DB, rng: random.Random) -> Candidates:
    c, qty, ey = db.d.parent_cat, db.d.event_qty, db.d.event_year
    years = db.values(db.events, 2)
    for v in shuffled(db.values(db.parents, 2), rng):
        y = rng.choice(years)
        yield (f"What is the total {qty.label} of the {db.E.replace('_', ' ')} in {y} of {db.items_pl} whose "
               f"{db.parent}'s {c.label} is '{v}'?",
               f"SELECT SUM(e.{qty.col}) FROM {db.E} e JOIN {db.I} c ON e.{db.d.item_fk} = c.id "
               f"JOIN {db.P} p ON c.{db.d.parent_fk} = p.id WHERE p.{c.col} = '{q(v)}' AND e.{ey.col} = {y}")


def having(db: DB, rng: random.Random) -> Candidates:
    counts = Counter(r[2] for r in db.items)
    # thresholds that keep between one and half of the parents
    ks = [k for k in sorted(set(counts.values())) if 1 <= sum(n > k for n in counts.values()) <= len(db.parents) // 2]
    for k in shuffled(ks, rng):
        yield (f"Which {db.parents_pl} have more than {k} {db.items_pl}? Give their names.",
               f"SELECT p.name FROM {db.P} p JOIN {db.I} c ON c.{db.d.parent_fk} = p.id GROUP BY p.id "
               f"HAVING COUNT(*) > {k}")


def not_in(db: DB, rng: random.Random) -> Candidates:
    c = db.d.item_cat
    for v in shuffled(db.values(db.items, 3), rng):
        yield (f"Which {db.items_pl} with the {c.label} '{v}' have never had {a(db.event)}? Give their {db.title}s.",
               f"SELECT {db.title} FROM {db.I} WHERE {c.col} = '{q(v)}' AND id NOT IN "
               f"(SELECT {db.d.item_fk} FROM {db.E})")


def above_avg(db: DB, rng: random.Random) -> Candidates:
    c, n = db.d.item_cat, db.d.item_num
    mean = statistics.mean(r[4] for r in db.items)
    for v in shuffled(db.values(db.items, 3), rng):
        if any(r[3] == v and r[4] <= mean for r in db.items):  # the filter must drop someone
            yield (f"Which {db.items_pl} with the {c.label} '{v}' have {a(n.label)} above the average {n.label} of "
                   f"all {db.items_pl}? Give their {db.title}s.",
                   f"SELECT {db.title} FROM {db.I} WHERE {c.col} = '{q(v)}' AND {n.col} > (SELECT AVG({n.col}) FROM {db.I})")


def coalesce(db: DB, rng: random.Random) -> Candidates:
    o = db.d.item_opt
    for p in shuffled(db.parents, rng):
        mine = db.items_of(p[0])
        if any(r[6] is None for r in mine) and any(r[6] is not None for r in mine):
            yield (f"List each {db.item} of the {db.parent} named '{p[1]}' with its {o.label}, showing 0 where none "
                   f"is recorded. Give the {db.title} and the {o.label}.",
                   f"SELECT c.{db.title}, COALESCE(c.{o.col}, 0) FROM {db.I} c JOIN {db.P} p ON c.{db.d.parent_fk} = p.id "
                   f"WHERE p.name = '{q(p[1])}'")


def distinct_event(db: DB, rng: random.Random) -> Candidates:
    c, s = db.d.item_cat, db.d.event_status
    for v in shuffled(db.values(db.items, 3), rng):
        for st in shuffled(db.values(db.events, 4), rng):
            yield (f"How many different {db.items_pl} with the {c.label} '{v}' had at least one "
                   f"{db.event} with the {s.label} '{st}'?",
                   f"SELECT COUNT(DISTINCT e.{db.d.item_fk}) FROM {db.E} e JOIN {db.I} c ON e.{db.d.item_fk} = c.id "
                   f"WHERE c.{c.col} = '{q(v)}' AND e.{s.col} = '{q(st)}'")


KINDS: dict[str, tuple[str, Callable[[DB, random.Random], Candidates]]] = {
    f.__name__: (level, f) for level, fs in (
        ("easy", (count_filter, list_filter, min_max, range_count, null_count, distinct_sorted)),
        ("medium", (group_count, top_n, join_count, join_list, group_avg, null_avg, left_join_count, argmax)),
        ("hard", (join3_sum, having, not_in, above_avg, coalesce, distinct_event)),
    ) for f in fs
}
