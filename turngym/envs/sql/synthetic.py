"""The bundled SQL suite: three databases generated from a seed, with templated questions.

Databases: ``shop`` (customers, products, orders, order_items), ``school`` (teachers, courses,
students, enrollments) and ``flights`` (airports, airlines, flights). Names are invented, so
answers come from the data, not from memory. Each question template has a difficulty level:
``easy`` (one table), ``medium`` (grouping, ordering, one join) and ``hard`` (several joins,
``HAVING``, sub-queries). Questions that need a tie-break say which one.

Files are written once per seed under ``<cache>/sql/synthetic-v0-seed<seed>/`` and never
modified afterwards (episodes open them read-only).

A question drawn twice for one database is kept once (its later copy's id is left unused, so the
other ids and the id-hashed split stay as they were): under seed 0, ``flights-hard-02`` (held out)
asked what ``flights-hard-00`` (training) asks. The larger suite with held-out databases is
``generated.py`` (``turngym/SQL-synthetic-v2``).
"""

from __future__ import annotations

import hashlib
import os
import random
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from turngym.data.registry import cache_root

VERSION = "v0"
LEVELS = ("easy", "medium", "hard")
_SYL = ["ka", "lo", "mi", "ra", "ven", "tor", "sel", "dru", "an", "bel", "cor", "fen", "gal", "hir", "is", "jun",
        "mar", "nol", "pen", "quil", "ros", "sa", "tam", "ul", "vor", "wen", "yar", "zel"]


@dataclass(frozen=True)
class SQLTask:
    """One question over one database."""

    task_id: str
    db_id: str
    db_path: str
    question: str
    gold_sql: str
    level: str
    kind: str = ""  # the question template (generated suite)


def _word(rng: random.Random, n: int = 2) -> str:
    return "".join(rng.choice(_SYL) for _ in range(n)).capitalize()


def _names(rng: random.Random, n: int, parts: int = 2) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        w = " ".join(_word(rng, rng.choice((2, 3))) for _ in range(parts))
        if w not in out:
            out.append(w)
    return out


# ----- database contents ------------------------------------------------------------------------
def shop_tables(rng: random.Random) -> dict[str, tuple[str, list[tuple]]]:
    cities = _names(rng, 6, 1)
    cats = ["tools", "garden", "kitchen", "toys", "books"]
    customers = [(i + 1, n, rng.choice(cities), rng.randint(2015, 2024)) for i, n in enumerate(_names(rng, 60))]
    products = [(i + 1, n, rng.choice(cats), round(rng.uniform(2, 300), 2)) for i, n in enumerate(_names(rng, 40))]
    orders = [(i + 1, rng.randint(1, 50), rng.randint(2019, 2024), rng.choice(["shipped", "shipped", "pending", "cancelled"]))
              for i in range(200)]  # customers 51-60 never order
    items = sorted({(rng.randint(1, 200), rng.randint(1, 40)) for _ in range(500)})
    return {
        "customers": ("id INTEGER PRIMARY KEY, name TEXT, city TEXT, joined_year INTEGER", customers),
        "products": ("id INTEGER PRIMARY KEY, name TEXT, category TEXT, price REAL", products),
        "orders": ("id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customers(id), order_year INTEGER, status TEXT", orders),
        "order_items": ("order_id INTEGER REFERENCES orders(id), product_id INTEGER REFERENCES products(id), quantity INTEGER",
                        [(o, p, rng.randint(1, 5)) for o, p in items]),
    }


def school_tables(rng: random.Random) -> dict[str, tuple[str, list[tuple]]]:
    depts = ["math", "physics", "history", "art", "biology"]
    teachers = [(i + 1, n, rng.choice(depts)) for i, n in enumerate(_names(rng, 15))]
    titles = [f"{_word(rng)} {rng.choice(['Studies', 'Methods', 'Theory', 'Lab', 'Seminar'])}" for _ in range(30)]
    titles = list(dict.fromkeys(titles))
    courses = []
    for i, t in enumerate(titles):
        tid = rng.randint(1, 15)
        courses.append((i + 1, t, teachers[tid - 1][2], rng.choice([2, 3, 4, 5]), tid))
    students = [(i + 1, n, rng.randint(1, 4), rng.choice(depts)) for i, n in enumerate(_names(rng, 80))]
    enroll = sorted({(rng.randint(1, 80), rng.randint(1, len(courses))) for _ in range(300)})
    return {
        "teachers": ("id INTEGER PRIMARY KEY, name TEXT, department TEXT", teachers),
        "courses": ("id INTEGER PRIMARY KEY, title TEXT, department TEXT, credits INTEGER, teacher_id INTEGER REFERENCES teachers(id)", courses),
        "students": ("id INTEGER PRIMARY KEY, name TEXT, year INTEGER, major TEXT", students),
        "enrollments": ("student_id INTEGER REFERENCES students(id), course_id INTEGER REFERENCES courses(id), grade INTEGER",
                        [(s, c, rng.randint(40, 100)) for s, c in enroll]),
    }


def flights_tables(rng: random.Random) -> dict[str, tuple[str, list[tuple]]]:
    countries = _names(rng, 4, 1)
    airports, codes = [], set()
    for city in _names(rng, 14, 1):
        code = city[:3].upper()
        while code in codes:
            code = "".join(rng.choice("ABCDEFGHJKLMNPRSTVWXZ") for _ in range(3))
        codes.add(code)
        airports.append((code, city, rng.choice(countries)))
    airlines = [(i + 1, n + " Air", rng.choice(countries)) for i, n in enumerate(_names(rng, 6, 1))]
    flights = []
    for i in range(120):
        a, b = rng.sample(airports, 2)
        dist = rng.randint(150, 9000)
        flights.append((i + 1, rng.randint(1, 6), a[0], b[0], dist, int(dist / 13 + rng.randint(20, 60))))
    return {
        "airports": ("code TEXT PRIMARY KEY, city TEXT, country TEXT", airports),
        "airlines": ("id INTEGER PRIMARY KEY, name TEXT, country TEXT", airlines),
        "flights": ("id INTEGER PRIMARY KEY, airline_id INTEGER REFERENCES airlines(id), origin TEXT REFERENCES airports(code), "
                    "destination TEXT REFERENCES airports(code), distance INTEGER, duration_min INTEGER", flights),
    }


BUILDERS = {"shop": shop_tables, "school": school_tables, "flights": flights_tables}


def write_db(path: Path, tables: dict[str, tuple[str, list[tuple]]]) -> None:
    """Write ``tables`` to a new SQLite file atomically (parallel workers may race to build it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    conn = sqlite3.connect(tmp)
    for name, (cols, rows) in tables.items():
        conn.execute(f"CREATE TABLE {name} ({cols})")
        if rows:
            conn.executemany(f"INSERT INTO {name} VALUES ({','.join('?' * len(rows[0]))})", rows)
    conn.commit()
    conn.close()
    tmp.replace(path)


# ----- question templates -----------------------------------------------------------------------
def _q(s: str) -> str:
    return s.replace("'", "''")


def _col(tables, table: str, idx: int) -> list:
    return sorted({r[idx] for r in tables[table][1]})


def shop_questions(t, rng):
    cities, cats = _col(t, "customers", 2), _col(t, "products", 2)
    years, statuses = _col(t, "orders", 2), _col(t, "orders", 3)
    yield from (("easy", f"How many customers live in {c}?", f"SELECT COUNT(*) FROM customers WHERE city = '{_q(c)}'") for c in rng.sample(cities, 3))
    yield from (("easy", f"List the names of all products in the {c} category.", f"SELECT name FROM products WHERE category = '{c}'") for c in rng.sample(cats, 3))
    yield from (("easy", f"What is the average price of products in the {c} category?", f"SELECT AVG(price) FROM products WHERE category = '{c}'") for c in rng.sample(cats, 2))
    yield from (("easy", f"How many orders have the status '{s}'?", f"SELECT COUNT(*) FROM orders WHERE status = '{s}'") for s in statuses)
    yield ("medium", "For each product category, how many products are there? Give the category and the count.",
           "SELECT category, COUNT(*) FROM products GROUP BY category")
    yield from (("medium", f"What are the names of the {n} most expensive products, from most to least expensive (ties broken by name)?",
                 f"SELECT name FROM products ORDER BY price DESC, name ASC LIMIT {n}") for n in (3, 5))
    yield from (("medium", f"Among customers who joined in {y} or later, which city has the most customers? If several tie, give the alphabetically first.",
                 f"SELECT city FROM customers WHERE joined_year >= {y} GROUP BY city ORDER BY COUNT(*) DESC, city ASC LIMIT 1") for y in (2015, 2019, 2021))
    yield from (("medium", f"How many orders were placed by customers who live in {c}?",
                 f"SELECT COUNT(*) FROM orders JOIN customers ON orders.customer_id = customers.id WHERE customers.city = '{_q(c)}'") for c in rng.sample(cities, 3))
    for c, y in [(rng.choice(cats), rng.choice(years)) for _ in range(3)]:
        yield ("hard", f"What is the total quantity of {c} products in shipped orders from {y}?",
               "SELECT SUM(oi.quantity) FROM order_items oi JOIN orders o ON oi.order_id = o.id JOIN products p ON oi.product_id = p.id "
               f"WHERE p.category = '{c}' AND o.order_year = {y} AND o.status = 'shipped'")
    for x in (1500, 2500, 3500):
        yield ("hard", f"Which customers spent more than {x} in total on shipped orders (price times quantity)? Give their names.",
               "SELECT c.name FROM customers c JOIN orders o ON o.customer_id = c.id JOIN order_items oi ON oi.order_id = o.id "
               f"JOIN products p ON p.id = oi.product_id WHERE o.status = 'shipped' GROUP BY c.id HAVING SUM(p.price * oi.quantity) > {x}")
    yield from (("hard", f"Which customers from {c} have never placed an order? Give their names.",
                 f"SELECT name FROM customers WHERE city = '{_q(c)}' AND id NOT IN (SELECT customer_id FROM orders)") for c in rng.sample(cities, 3))


def school_questions(t, rng):
    depts, titles = _col(t, "teachers", 2), _col(t, "courses", 1)
    yield from (("easy", f"How many students are in year {y}?", f"SELECT COUNT(*) FROM students WHERE year = {y}") for y in (1, 2, 3, 4))
    yield from (("easy", f"List the titles of the courses offered by the {d} department.", f"SELECT title FROM courses WHERE department = '{d}'") for d in rng.sample(depts, 3))
    yield from (("easy", f"How many teachers work in the {d} department?", f"SELECT COUNT(*) FROM teachers WHERE department = '{d}'") for d in rng.sample(depts, 2))
    yield ("medium", "For each major, how many students are there? Give the major and the count.", "SELECT major, COUNT(*) FROM students GROUP BY major")
    yield from (("medium", f"What is the average grade in the course '{c}'?",
                 f"SELECT AVG(e.grade) FROM enrollments e JOIN courses c ON e.course_id = c.id WHERE c.title = '{_q(c)}'") for c in rng.sample(titles, 3))
    yield from (("medium", f"List the titles of the courses taught by teachers of the {d} department, ordered by title.",
                 f"SELECT c.title FROM courses c JOIN teachers t ON c.teacher_id = t.id WHERE t.department = '{d}' ORDER BY c.title") for d in rng.sample(depts, 2))
    yield from (("medium", f"Which {n} students have the highest grades in '{c}'? List their names from highest grade down (ties broken by name).",
                 f"SELECT s.name FROM students s JOIN enrollments e ON e.student_id = s.id JOIN courses c ON c.id = e.course_id "
                 f"WHERE c.title = '{_q(c)}' ORDER BY e.grade DESC, s.name ASC LIMIT {n}") for n, c in zip((2, 3), rng.sample(titles, 2)))
    yield from (("hard", f"Which students are enrolled in more than {k} courses? Give their names.",
                 f"SELECT s.name FROM students s JOIN enrollments e ON e.student_id = s.id GROUP BY s.id HAVING COUNT(*) > {k}") for k in (4, 5, 6))
    yield from (("hard", f"Which teachers teach courses whose average grade is above {x}? Give each teacher's name once.",
                 "SELECT DISTINCT t.name FROM teachers t JOIN courses c ON c.teacher_id = t.id WHERE c.id IN "
                 f"(SELECT course_id FROM enrollments GROUP BY course_id HAVING AVG(grade) > {x})") for x in (70, 75))
    yield from (("hard", f"How many different students take at least one course of the {d} department?",
                 f"SELECT COUNT(DISTINCT e.student_id) FROM enrollments e JOIN courses c ON e.course_id = c.id WHERE c.department = '{d}'") for d in rng.sample(depts, 3))


def flights_questions(t, rng):
    countries, codes = _col(t, "airports", 2), _col(t, "airports", 0)
    airlines = _col(t, "airlines", 1)
    yield from (("easy", f"How many airports are there in {c}?", f"SELECT COUNT(*) FROM airports WHERE country = '{_q(c)}'") for c in countries)
    yield from (("easy", f"How many flights depart from the airport with code {c}?", f"SELECT COUNT(*) FROM flights WHERE origin = '{c}'") for c in rng.sample(codes, 3))
    yield from (("easy", f"List the codes of the airports in {c}.", f"SELECT code FROM airports WHERE country = '{_q(c)}'") for c in rng.sample(countries, 2))
    yield ("medium", "For each airline, how many flights does it operate? Give the airline name and the count.",
           "SELECT a.name, COUNT(*) FROM flights f JOIN airlines a ON f.airline_id = a.id GROUP BY a.id")
    yield from (("medium", f"What is the average distance of the flights operated by {a}?",
                 f"SELECT AVG(f.distance) FROM flights f JOIN airlines a ON f.airline_id = a.id WHERE a.name = '{_q(a)}'") for a in rng.sample(airlines, 3))
    yield from (("medium", f"What are the ids of the {n} longest flights, longest first (ties broken by id)?",
                 f"SELECT id FROM flights ORDER BY distance DESC, id ASC LIMIT {n}") for n in (3, 5))
    for c1, c2 in [tuple(rng.sample(countries, 2)) for _ in range(3)]:
        yield ("hard", f"How many flights go from an airport in {c1} to an airport in {c2}?",
               "SELECT COUNT(*) FROM flights f JOIN airports s ON f.origin = s.code JOIN airports d ON f.destination = d.code "
               f"WHERE s.country = '{_q(c1)}' AND d.country = '{_q(c2)}'")
    yield from (("hard", f"Which airlines operate no flight departing from {c}? Give their names.",
                 f"SELECT name FROM airlines WHERE id NOT IN (SELECT airline_id FROM flights WHERE origin = '{c}')") for c in rng.sample(codes, 3))
    yield from (("hard", f"Which airlines operate more than {k} flights longer than {d} km? Give their names.",
                 f"SELECT a.name FROM airlines a JOIN flights f ON f.airline_id = a.id WHERE f.distance > {d} GROUP BY a.id HAVING COUNT(*) > {k}")
                for k, d in ((5, 3000), (8, 2000), (3, 6000)))


QUESTIONS = {"shop": shop_questions, "school": school_questions, "flights": flights_questions}


def _gold_is_informative(db: Path, sql: str) -> bool:
    """Drop questions whose answer is empty or NULL: any empty query would 'match' them."""
    conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
    try:
        rows = conn.execute(sql).fetchall()
    finally:
        conn.close()
    return bool(rows) and any(v is not None for r in rows for v in r)


def build_suite(seed: int = 0, folder: Path | None = None) -> list[SQLTask]:
    """Generate (or reuse) the databases for ``seed`` and return every task, in a fixed order.

    Args:
        seed: Seeds the data and the question parameters.
        folder: Where the ``.sqlite`` files go (default ``<cache>/sql/synthetic-v0-seed<seed>``).
    """
    folder = Path(folder) if folder else cache_root() / "sql" / f"synthetic-{VERSION}-seed{seed}"
    tasks: list[SQLTask] = []
    for db_id, builder in BUILDERS.items():
        rng = random.Random(f"{seed}:{db_id}")
        tables = builder(rng)
        fingerprint = hashlib.sha256(repr(tables).encode()).hexdigest()[:12]  # new data => new file
        path = folder / f"{db_id}-{fingerprint}.sqlite"
        if not path.exists():
            write_db(path, tables)
        counters: dict[str, int] = {}
        asked: set[str] = set()
        for level, question, sql in QUESTIONS[db_id](tables, rng):
            if not _gold_is_informative(path, sql):
                continue
            i = counters[level] = counters.get(level, -1) + 1
            if question in asked:
                continue
            asked.add(question)
            tasks.append(SQLTask(f"{db_id}-{level}-{i:02d}", db_id, str(path), question, sql, level))
    return tasks


