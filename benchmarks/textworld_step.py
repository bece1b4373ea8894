"""Benchmark: one turngym TextWorld step against one raw ``textworld.gym`` step, same games.

Both sides play the same N cached games with the same command sequence (a look, an inventory, a
command the parser rejects, then the walkthrough) and ask the engine for the same ``EnvInfos``.
turngym is timed through ``turngym.make`` (Gymnasium wrappers included) with Hermes tool-call
text as the action; the raw side gets the bare command. Resets are not timed.

Noise control: episodes alternate which side goes first, and every (game, step) pair is timed
``--reps`` times on each side. The headline ratio sums, over all pairs, each side's median time
for that pair, so a step that lost its core to another process does not count; plain means are
printed too. Wall time and this thread's CPU time are both reported.

    python benchmarks/textworld_step.py --games 8 --reps 20
    python benchmarks/textworld_step.py --hints        # admissible commands + oracle tracking on
    python benchmarks/textworld_step.py --profile      # where turngym's own time goes
    python benchmarks/textworld_step.py --in-process   # the engine in this process, without a deadline

By default the engine runs in a child process behind its deadline (``engine_deadline_s``), so the
turngym side pays a pipe round trip per command and its CPU time (this thread) leaves out the
engine's own work; ``--in-process`` compares like with like.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import statistics
import time
from collections import defaultdict

import textworld.gym

import turngym
from turngym.types import ToolCall

Times = dict[tuple[int, int], list[tuple[float, float]]]  # (game, step) -> [(wall, cpu), ...]


def _clocks() -> tuple[float, float]:
    # Wall time, and this thread's CPU time: on a shared machine the second leaves out the time
    # other processes held the core.
    return time.perf_counter(), time.thread_time()


def raw_episode(env, game: int, commands: list[str], out: Times) -> None:
    env.reset()
    for i, cmd in enumerate(commands):
        w0, c0 = _clocks()
        _, _, done, _ = env.step(cmd)
        w1, c1 = _clocks()
        out[game, i].append((w1 - w0, c1 - c0))
        if done:
            break


def turngym_episode(env, game: int, task_id: str, actions: list[str], out: Times) -> None:
    env.reset(seed=0, options={"task_id": task_id})
    for i, action in enumerate(actions):
        w0, c0 = _clocks()
        _, _, terminated, truncated, _ = env.step(action)
        w1, c1 = _clocks()
        out[game, i].append((w1 - w0, c1 - c0))
        if terminated or truncated:
            break


def report(label: str, raw: Times, tg: Times, k: int) -> float:
    """Print per-step times and ratios for clock ``k`` (0 wall, 1 CPU); return the median ratio."""
    keys = sorted(raw)
    raw_med = sum(statistics.median(t[k] for t in raw[key]) for key in keys) / len(keys) * 1e6
    tg_med = sum(statistics.median(t[k] for t in tg[key]) for key in keys) / len(keys) * 1e6
    raw_mean = statistics.fmean(t[k] for key in keys for t in raw[key]) * 1e6
    tg_mean = statistics.fmean(t[k] for key in keys for t in tg[key]) * 1e6
    print(f"  {label}")
    print(f"    raw textworld.gym step : {raw_med:8.1f} us (per-step medians)   {raw_mean:8.1f} us (mean)")
    print(f"    turngym step           : {tg_med:8.1f} us (per-step medians)   {tg_mean:8.1f} us (mean)")
    print(f"    overhead ratio         : {tg_med / raw_med:8.3f}                        {tg_mean / raw_mean:8.3f}"
          "   (goal <= 1.05)")
    return tg_med / raw_med


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--level", default="easy", choices=["easy", "medium", "hard"])
    p.add_argument("--split", default="test")
    p.add_argument("--games", type=int, default=8)
    p.add_argument("--reps", type=int, default=20, help="episodes per game per side")
    p.add_argument("--hints", action="store_true", help="scripted_hints=True (admissible commands, oracle)")
    p.add_argument("--profile", action="store_true", help="print a cProfile of the turngym steps")
    p.add_argument("--in-process", action="store_true", help="engine_deadline_s=None: no child process, no deadline")
    args = p.parse_args()

    env = turngym.make(f"turngym/TextWorld-{args.level}-v0", split=args.split, num_games=args.games,
                       scripted_hints=args.hints, **({"engine_deadline_s": None} if args.in_process else {}))
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

    raw_t: Times = defaultdict(list)
    tg_t: Times = defaultdict(list)
    prof = cProfile.Profile() if args.profile else None
    for rep in range(args.reps):
        for g, (task_id, commands, actions, raw_env) in enumerate(games):
            for side in (("raw", "turngym") if (rep + g) % 2 == 0 else ("turngym", "raw")):
                gc.collect()
                if side == "raw":
                    raw_episode(raw_env, g, commands, raw_t)
                    continue
                if prof:
                    prof.enable()
                turngym_episode(env, g, task_id, actions, tg_t)
                if prof:
                    prof.disable()
    assert raw_t.keys() == tg_t.keys(), "both sides must play the same steps"

    steps = sum(len(v) for v in tg_t.values())
    print(f"TextWorld {args.level}/{args.split}: {len(games)} games x {args.reps} reps, {steps} steps a side, "
          f"hints={'on' if args.hints else 'off'}, engine={'in-process' if args.in_process else 'child process'}")
    report("wall time", raw_t, tg_t, 0)
    report("CPU time (this thread)", raw_t, tg_t, 1)
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    env.close()
    for *_, raw_env in games:
        raw_env.close()


if __name__ == "__main__":
    main()
