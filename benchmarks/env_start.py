"""Starting a TextWorld env: its engine as a fresh interpreter vs forked from a warm server, in one run.

A TextWorld env runs its engine in a child process behind a step deadline (``envs/engine.py``).
A fresh child starts Python and imports TextWorld (about 0.8 s of CPU) before its first reset; a
child forked from the fork server (``envs/forkserver.py``, the default where Linux pidfds exist)
starts with TextWorld imported. This opens ``--envs`` envs each way, alternating in rounds, and
prints the seconds from ``make`` to the end of the first reset, per env.

    python benchmarks/env_start.py [--envs 16] [--rounds 2]

Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def start_envs(n: int, preload: tuple) -> list[float]:
    """Seconds to make and first-reset each of ``n`` envs (closed after); ``preload`` () = fresh engines."""
    import turngym
    from turngym.envs.textworld.env import TextWorldEnv

    TextWorldEnv.engine_preload = preload  # what each new env's engine is started with
    times, envs = [], []
    for i in range(n):
        t0 = time.perf_counter()
        env = turngym.make("turngym/TextWorld-easy-v0", split="test", tool_format="xml")
        env.reset(seed=i)
        times.append(time.perf_counter() - t0)
        envs.append(env)
    for env in envs:
        env.close()
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envs", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    from turngym.envs.textworld.env import TextWorldEnv

    warm = getattr(TextWorldEnv, "engine_preload", ())
    if not warm:
        raise SystemExit("this checkout starts no engine from a fork server")
    start_envs(1, warm)  # the fork server starts once per run: not counted
    got: dict[str, list[float]] = {"fresh": [], "forked": []}
    for _ in range(args.rounds):
        for kind in got:
            got[kind] += start_envs(args.envs, warm if kind == "forked" else ())
    med = {k: statistics.median(v) for k, v in got.items()}
    print(f"load {os.getloadavg()[0]:.1f}; median seconds per env start: fresh {med['fresh']:.3f}, "
          f"forked {med['forked']:.3f} ({med['fresh'] / med['forked']:.1f}x), {args.envs} x {args.rounds} each")


if __name__ == "__main__":
    main()
