"""Benchmark: one turngym TextWorld step against one raw ``textworld.gym`` step, same games.

Both sides play the same N cached games with the same command sequence (a look, an inventory, a
command the parser rejects, then the walkthrough) and ask the engine for the same ``EnvInfos``.
turngym is timed through ``turngym.make`` (Gymnasium wrappers included) with Hermes tool-call
text as the action; the raw side gets the bare command. Episodes alternate which side goes
first, so drift in machine load hits both. Resets are not timed.

    python benchmarks/textworld_step.py --games 8 --reps 5
    python benchmarks/textworld_step.py --hints        # admissible commands + oracle tracking on
    python benchmarks/textworld_step.py --profile      # where turngym's own time goes
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import statistics
import time

import textworld.gym

import turngym
from turngym.types import ToolCall


def raw_episode(env, commands: list[str]) -> list[float]:
    env.reset()
    times = []
    for cmd in commands:
        t0 = time.perf_counter()
        _, _, done, _ = env.step(cmd)
        times.append(time.perf_counter() - t0)
        if done:
            break
    return times


def turngym_episode(env, task_id: str, actions: list[str]) -> list[float]:
    env.reset(seed=0, options={"task_id": task_id})
    times = []
    for action in actions:
        t0 = time.perf_counter()
        _, _, terminated, truncated, _ = env.step(action)
        times.append(time.perf_counter() - t0)
        if terminated or truncated:
            break
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--level", default="easy", choices=["easy", "medium", "hard"])
    p.add_argument("--split", default="test")
    p.add_argument("--games", type=int, default=8)
    p.add_argument("--reps", type=int, default=5, help="episodes per game per side")
    p.add_argument("--hints", action="store_true", help="scripted_hints=True (admissible commands, oracle)")
    p.add_argument("--profile", action="store_true", help="print a cProfile of the turngym steps")
    args = p.parse_args()

    env = turngym.make(f"turngym/TextWorld-{args.level}-v0", split=args.split, num_games=args.games,
                       scripted_hints=args.hints)
    base = env.unwrapped
    infos = base.request_infos()
    games = []
    for record in base.games:
        commands = ["look", "inventory", "xyzzy", *record.walkthrough]
        actions = [base.format.render_call(ToolCall("b", "act", {"command": c})) for c in commands]
        # Each raw env holds one game, as the turngym env holds one game at a time.
        raw_id = textworld.gym.register_game(str(base._folder / record.file), request_infos=infos,
                                             max_episode_steps=len(commands) + 1)
        games.append((record.task_id, commands, actions, textworld.gym.make(raw_id)))

    raw_t, tg_t = [], []
    prof = cProfile.Profile() if args.profile else None
    for rep in range(args.reps):
        for i, (task_id, commands, actions, raw_env) in enumerate(games):
            sides = ["raw", "turngym"] if (rep + i) % 2 == 0 else ["turngym", "raw"]
            for side in sides:
                gc.collect()
                if side == "raw":
                    raw_t += raw_episode(raw_env, commands)
                else:
                    if prof:
                        prof.enable()
                    tg_t += turngym_episode(env, task_id, actions)
                    if prof:
                        prof.disable()
    assert len(raw_t) == len(tg_t), "both sides must play the same steps"

    raw_mean, tg_mean = statistics.fmean(raw_t) * 1e6, statistics.fmean(tg_t) * 1e6
    raw_med, tg_med = statistics.median(raw_t) * 1e6, statistics.median(tg_t) * 1e6
    print(f"TextWorld {args.level}/{args.split}: {len(games)} games x {args.reps} reps, {len(tg_t)} steps a side, "
          f"hints={'on' if args.hints else 'off'}")
    print(f"  raw textworld.gym step : mean {raw_mean:8.1f} us   median {raw_med:8.1f} us")
    print(f"  turngym step           : mean {tg_mean:8.1f} us   median {tg_med:8.1f} us")
    print(f"  overhead ratio         : mean {tg_mean / raw_mean:.3f}     median {tg_med / raw_med:.3f}   (goal <= 1.05)")
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    env.close()
    for *_, raw_env in games:
        raw_env.close()


if __name__ == "__main__":
    main()
