"""Success by ALFWorld task type, and a small evaluation entry point.

``python -m turngym.envs.alfworld.report --agent oracle --split valid_seen`` plays every game of
the split and prints the table by task type.
"""

from __future__ import annotations

import argparse
import sys
import time

from turngym.envs.alfworld.games import TASK_TYPES
from turngym.types import Trajectory


def success_by_type(trajectories: list[Trajectory]) -> dict[str, tuple[int, int]]:
    """``task type -> (won, played)``, in ALFWorld's task-type order (plus ``all``)."""
    table: dict[str, list[int]] = {t: [0, 0] for t in TASK_TYPES}
    for tr in trajectories:
        row = table.setdefault(tr.metadata.get("task_type", "default"), [0, 0])
        row[0] += int(tr.outcome >= 1.0)
        row[1] += 1
    out = {t: (w, n) for t, (w, n) in table.items() if n}
    out["all"] = (sum(w for w, _ in out.values()), sum(n for _, n in out.values()))
    return out


def format_table(rows: dict[str, tuple[int, int]]) -> str:
    """The success table as aligned text."""
    width = max(len(t) for t in rows)
    lines = [f"{'task type':<{width}}  won/played  success", "-" * (width + 22)]
    for t, (w, n) in rows.items():
        lines.append(f"{t:<{width}}  {w:>4}/{n:<5}  {w / n:7.1%}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from turngym.agents.registry import make_agent
    from turngym.trainers.rollout import episode_specs, make_env_factory, rollout

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
