"""Oracle vs random play on the LMRL-Gym-style games.

    python scripts/games_eval.py                            # built-in word lists and tables
    python scripts/games_eval.py --data-dir ../shared/data    # plus Wordle on the official lists
"""

from __future__ import annotations

import argparse

import turngym
from turngym.agents.scripted import OracleAgent, RandomAgent
from turngym.rollout import episode_specs, make_env_factory, rollout

GAMES = ["turngym/Maze-v0", "turngym/Maze-partial-v0", "turngym/TextNav-v0", "turngym/Wordle-v0",
         "turngym/TwentyQuestions-v0", "turngym/GuessMyCity-v0"]


def evaluate(env_id: str, agent, episodes: int, **kw) -> tuple[float, int, float]:
    ids = turngym.make(env_id, **kw).unwrapped.task_ids
    specs = episode_specs(ids, min(episodes, len(ids)))
    trajs = rollout(agent, make_env_factory(env_id, **agent.env_kwargs, **kw), specs, progress=False)
    return sum(t.outcome for t in trajs) / len(trajs), len(trajs), sum(len(t.turns) for t in trajs) / len(trajs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir", default=None, help="local data folder (e.g. ../shared/data) for the official lists")
    ap.add_argument("--episodes", type=int, default=200, help="episodes per env and agent (train split)")
    args = ap.parse_args()
    runs = [(g, {}) for g in GAMES]
    if args.data_dir:
        runs.append(("turngym/Wordle-v0", {"words": "lmrl", "data_dir": args.data_dir}))
    for env_id, kw in runs:
        for name, agent in (("oracle", OracleAgent()), ("random", RandomAgent(seed=0))):
            rate, n, turns = evaluate(env_id, agent, args.episodes, **kw)
            label = env_id + (" (official lists)" if kw else "")
            print(f"{label:44s} {name:7s} success {rate:.3f} over {n} episodes, {turns:.1f} turns/episode")


if __name__ == "__main__":
    main()
