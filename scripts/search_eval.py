"""Oracle vs random play on the search envs (EM and F1).

    python scripts/search_eval.py                          # bundled synthetic suite
    python scripts/search_eval.py --data-dir ../shared/data  # plus HotpotQA (distractor, 100 questions)
"""

from __future__ import annotations

import argparse

import turngym
from turngym.agents.scripted import OracleAgent, RandomAgent
from turngym.rollout import episode_specs, make_env_factory, rollout


def evaluate(env_id: str, agent, **kw) -> tuple[float, float, int, float]:
    ids = turngym.make(env_id, **kw).unwrapped.task_ids
    trajs = rollout(agent, make_env_factory(env_id, **agent.env_kwargs, **kw), episode_specs(ids, len(ids)), progress=False)
    em = sum(t.outcome for t in trajs) / len(trajs)
    f1 = sum((t.turns[-1].info.get("f1", 0.0) if t.turns else 0.0) for t in trajs) / len(trajs)
    return em, f1, len(trajs), sum(len(t.turns) for t in trajs) / len(trajs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir", default=None, help="local data folder (e.g. ../shared/data) for HotpotQA")
    args = ap.parse_args()
    runs = [("turngym/Search-synthetic-v0", {"split": "all"})]
    if args.data_dir:
        runs.append(("turngym/Search-hotpotqa-v0", {"split": "all", "data_dir": args.data_dir}))
    for env_id, kw in runs:
        for name, agent in (("oracle", OracleAgent()), ("random", RandomAgent(seed=0))):
            em, f1, n, turns = evaluate(env_id, agent, **kw)
            print(f"{env_id:28s} {name:7s} EM {em:.3f}  F1 {f1:.3f}  over {n} questions, {turns:.1f} turns/episode")


if __name__ == "__main__":
    main()
