"""Play ALFWorld games and print success by task type with 95% intervals, what the episodes cost in
tokens, and where the time went (generation, env steps, env start-up); or print the same table for
a training run's held-out evaluation.

    python scripts/alfworld_eval.py --agent oracle --split valid_seen
    python scripts/alfworld_eval.py --agent hf:runs/alfworld/final_model --episodes 140
    python scripts/alfworld_eval.py --from-eval runs/alfworld/eval_sft.json

The policy plays as ``configs/recipes/alfworld.yaml`` evaluates it (the text tool format, compact
admissible commands, greedy, 24 reply tokens); ``--admissible all`` lists every command as ALFWorld does.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from turngym.agents import SamplingParams, make_agent
from turngym.bench.evaluate import evaluate
from turngym.clock import CLOCK, breakdown_table
from turngym.bench.alfworld_report import episode_costs, format_table, success_by_type
from turngym.types import Trajectory


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Play ALFWorld games and print success by task type.")
    p.add_argument("--agent", default="oracle", help="agent spec for make_agent (oracle, random, hf:PATH, ...)")
    p.add_argument("--from-eval", default=None, help="print the table of a saved evaluation (a run's eval_sft.json)")
    p.add_argument("--split", default="valid_seen")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--episodes", type=int, default=140, help="games, the first N in the split's mixed-type order")
    p.add_argument("--max-turns", type=int, default=None, help="default: the env's (50)")
    p.add_argument("--tool-format", default="text")
    p.add_argument("--admissible", default="compact", choices=("compact", "all", "none"))
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--num-envs", type=int, default=32)
    p.add_argument("--out", default=None, help="write the evaluation's JSON here")
    args = p.parse_args(argv)
    if args.from_eval:
        data = json.loads(open(args.from_eval).read())
        trajs = [Trajectory.from_dict(t) for t in data["trajectories"]]
        print(f"{data.get('agent', '')} on {len(trajs)} games ({data.get('config', {}).get('env_kwargs', {})})")
        report(trajs, data["summary"].get("wall_s"))
        return 0
    agent = make_agent(args.agent)
    env_kwargs = {"split": args.split, "data_dir": args.data_dir, "tool_format": args.tool_format,
                  "admissible": args.admissible}
    sampling = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens, seed=0)
    CLOCK.reset()
    t0 = time.perf_counter()
    with CLOCK.stage("eval"):
        res = evaluate("turngym/ALFWorld-v0", agent, agent_name=args.agent, episodes=args.episodes, env_kwargs=env_kwargs,
                       sampling=sampling, num_envs=args.num_envs, max_turns=args.max_turns, distinct=True)
    report(res.trajectories, time.perf_counter() - t0)
    print(breakdown_table(CLOCK.breakdown()))
    if args.out:
        res.save(args.out)
    return 0


def report(trajs: list[Trajectory], wall_s: float | None) -> None:
    print(format_table(success_by_type(trajs)))
    costs = episode_costs(trajs)
    print("  ".join(f"{k} {v:.3g}" for k, v in costs.items()))
    if wall_s:
        print(f"{len(trajs)} games in {wall_s:.0f} s ({wall_s / len(trajs):.1f} s a game)")


if __name__ == "__main__":
    sys.exit(main())
