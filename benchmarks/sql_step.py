"""Benchmark: one turngym SQL step (``execute_sql`` through ``turngym.make``) against the raw engine.

Both sides run the same gold queries of the synthetic suite (or Spider with ``--data-dir``) on
the same database files. turngym parses the XML tool call, runs the query on its read-only,
time-limited connection and formats the table; the raw side is ``sqlite3.connect(path)``,
``execute`` and ``fetchmany(20)`` on a plain connection. Order alternates per query.

    python benchmarks/sql_step.py --reps 5
    python benchmarks/sql_step.py --data-dir ../shared/data
"""

from __future__ import annotations

import argparse
import sqlite3
import time

import turngym


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir", default=None, help="use Spider from this local data folder")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    kw = {"suite": "spider", "data_dir": args.data_dir} if args.data_dir else {"suite": "synthetic"}
    env = turngym.make("turngym/SQL-synthetic-v1", split="all", **kw)
    tasks = env.unwrapped.tasks
    raw_conns: dict[str, sqlite3.Connection] = {}
    t_gym = t_raw = 0.0
    n = 0
    for rep in range(args.reps):
        for i, (tid, task) in enumerate(tasks.items()):
            env.reset(seed=0, options={"task_id": tid})
            conn = raw_conns.setdefault(task.db_path, sqlite3.connect(task.db_path))
            action = f"<execute_sql>{task.gold_sql}</execute_sql>"
            for side in ((0, 1) if (i + rep) % 2 == 0 else (1, 0)):
                t0 = time.perf_counter()
                if side == 0:
                    env.step(action)
                    t_gym += time.perf_counter() - t0
                else:
                    conn.execute(task.gold_sql).fetchmany(20)
                    t_raw += time.perf_counter() - t0
            n += 1
    print(f"{kw['suite']}: {n} steps")
    print(f"turngym execute_sql step: {1e3 * t_gym / n:.3f} ms   raw sqlite3 query: {1e3 * t_raw / n:.3f} ms   "
          f"ratio {t_gym / t_raw:.2f}x")


if __name__ == "__main__":
    main()
