"""Oracle vs random play on the SQL envs; Spider database and gold-query counts.

    python scripts/sql_eval.py                          # bundled synthetic suite
    python scripts/sql_eval.py --data-dir ../shared/data  # plus Spider

Prints success per env and agent (by difficulty / database), and lists gold queries that fail.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import turngym
from turngym.agents.scripted import OracleAgent, RandomAgent
from turngym.data import dataset_path
from turngym.rollout import episode_specs, make_env_factory, rollout


def evaluate(env_id: str, agent, **kw) -> tuple[float, dict[str, float], int]:
    ids = turngym.make(env_id, **kw).unwrapped.task_ids
    trajs = rollout(agent, make_env_factory(env_id, **agent.env_kwargs, **kw), episode_specs(ids, len(ids)), progress=False)
    groups: dict[str, list[float]] = defaultdict(list)
    for t in trajs:
        groups[t.metadata.get("task_type", "default")].append(t.outcome)
    by = {k: sum(v) / len(v) for k, v in sorted(groups.items())}
    return sum(t.outcome for t in trajs) / len(trajs), by, len(trajs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir", default=None, help="local data folder (e.g. ../shared/data) for Spider")
    args = ap.parse_args()
    runs = [("turngym/SQL-synthetic-v1", {"split": "all"})]
    if args.data_dir:
        from turngym.envs.sql.spider import load_spider

        suite = load_spider(dataset_path("spider", args.data_dir))
        print(f"Spider: {len(suite.databases)} databases built, {len(suite.tasks)} questions whose gold SQL runs, "
              f"{len(suite.failed)} whose gold SQL fails")
        for task, err in suite.failed:
            print(f"  FAILING GOLD {task.task_id}: {err}\n    {task.gold_sql}")
        runs.append(("turngym/SQL-spider-v1", {"split": "all", "data_dir": args.data_dir}))
    for env_id, kw in runs:
        for name, agent in (("oracle", OracleAgent()), ("random", RandomAgent(seed=0))):
            rate, by, n = evaluate(env_id, agent, **kw)
            groups = ", ".join(f"{k} {v:.2f}" for k, v in by.items())
            print(f"{env_id:26s} {name:7s} success {rate:.3f} over {n} tasks  [{groups}]")


if __name__ == "__main__":
    main()
