"""First-run TextWorld game generation of two checkouts, interleaved, in one run.

Each version generates the quickstart's games (``--train`` training and ``--test`` held-out
TextWorld-easy games) into an empty cache folder of its own, through ``ensure_games`` as the first
``turngym train`` does. Printed per version: wall seconds, CPU seconds (this process's children:
the generator, its workers and the Inform 7 compilers they run) and CPU seconds per game, so a
shared machine's load shows as wall time above CPU time rather than as a wrong ratio.

    python benchmarks/game_generation.py --compare /tmp/before            # before, this checkout
    python benchmarks/game_generation.py --compare /tmp/before --rounds 2 # A B A B

A game costs one Inform 7 compile (TextWorld's maker would compile it once more to record the
walkthrough's events; ``turngym.envs.textworld.walkthrough`` records them on the game's logic):
with both cores busy the wall time per game is about half its CPU time at best. ``same games``
compares the two versions' content hashes. Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from checkout import check_imports_from, checkout_env

HERE = Path(__file__).resolve().parent.parent

CHILD = """
import sys
from turngym.envs.textworld.games import ensure_games
root = sys.argv[1]
for split, n in (("train", int(sys.argv[2])), ("test", int(sys.argv[3]))):
    ensure_games("easy", split, n, root)
"""


def run_version(tree: str, train: int, test: int) -> dict:
    root = tempfile.mkdtemp(prefix="turngym-games-")
    check_imports_from(tree)
    env = checkout_env(tree, TURNGYM_PROGRESS="never")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", CHILD, root, str(train), str(test)], env=env, cwd=tree, check=True,
                   stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    hashes = [g["content_hash"] for split in ("train", "test")
              for g in json.loads((Path(root) / "easy" / split / "index.json").read_text())["games"]]
    shutil.rmtree(root, ignore_errors=True)
    return {"wall_s": wall, "cpu_s": cpu, "games": train + test, "load": load, "load_end": os.getloadavg()[0],
            "hashes": hashes}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compare", default=None, help="a checkout of the version to compare against (run first)")
    p.add_argument("--train", type=int, default=64)
    p.add_argument("--test", type=int, default=128)
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args()
    versions = {"before": args.compare, "after": str(HERE)} if args.compare else {"this": str(HERE)}
    runs: dict[str, list[dict]] = {n: [] for n in versions}
    for _ in range(args.rounds):
        for name, tree in versions.items():
            r = run_version(tree, args.train, args.test)
            runs[name].append(r)
            print(f"{name}: {r['games']} games, {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU "
                  f"({r['cpu_s'] / r['games']:.2f} s a game), load {r['load']:.1f}-{r['load_end']:.1f}", flush=True)
    if len(runs) == 2:
        a, b = (min(rs, key=lambda r: r["wall_s"]) for rs in runs.values())
        print(f"same games: {a['hashes'] == b['hashes']}; wall before/after: {a['wall_s'] / b['wall_s']:.2f}x; "
              f"CPU before/after: {a['cpu_s'] / b['cpu_s']:.2f}x")


if __name__ == "__main__":
    main()
