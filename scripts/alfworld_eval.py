"""Play every ALFWorld game of a split and print success by task type.

    python scripts/alfworld_eval.py --agent oracle --split valid_seen
"""

from __future__ import annotations

import argparse
import sys
import time

from turngym.agents.registry import make_agent
from turngym.envs.alfworld.report import format_table, success_by_type
from turngym.rollout import episode_specs, make_env_factory, rollout


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Play ALFWorld games and print success by task type.")
    p.add_argument("--agent", default="oracle", help="agent spec for make_agent (oracle, random, ...)")
    p.add_argument("--split", default="valid_seen")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--max-games", type=int, default=None)
    p.add_argument("--max-turns", type=int, default=50)
    args = p.parse_args(argv)
    agent = make_agent(args.agent)
    kwargs = {"split": args.split, "data_dir": args.data_dir, "max_games": args.max_games,
              "max_turns": args.max_turns, **getattr(agent, "env_kwargs", {})}
    factory = make_env_factory("turngym/ALFWorld-v0", **kwargs)
    env = factory()
    ids = env.unwrapped.task_ids
    env.close()
    t0 = time.time()
    trajs = rollout(agent, factory, episode_specs(ids, len(ids)), num_envs=1)
    print(format_table(success_by_type(trajs)))
    print(f"{len(trajs)} games in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
