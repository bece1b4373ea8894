"""Sandbox latency: turngym's exec against raw ``docker exec`` on the same container, in one run,
and SWE episode reset time with and without the warm container pool.

    python benchmarks/sandbox_latency.py            # needs a Docker engine and the sandbox image
    python benchmarks/sandbox_latency.py --n 100 --resets 20

Goals: turngym exec <= 1.2x raw ``docker exec``; episode reset with the warm pool <= 0.3 s.
Commands are interleaved (turngym, CLI, SDK, turngym, ...) so machine load hits all alike.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import warnings


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def row(name: str, xs: list[float]) -> str:
    return f"{name:<34} median {statistics.median(xs) * 1e3:7.1f} ms   p90 {pct(xs, 0.9) * 1e3:7.1f} ms   n={len(xs)}"


def bench_exec(n: int, command: str) -> dict[str, list[float]]:
    """Per-call wall time of one command: turngym exec, docker CLI, docker SDK exec_run."""
    from turngym.tools.sandbox import DockerBackend
    from turngym.tools.sandbox.docker_backend import SANDBOX_USER, docker_client

    times: dict[str, list[float]] = {"turngym exec": [], "raw docker exec (CLI)": [], "raw docker SDK exec_run": []}
    with DockerBackend() as sb:
        cid = sb.container_id
        client = docker_client()
        container = client.containers.get(cid)
        argv = ["sh", "-c", command]
        for _ in range(3):  # warm-up: first execs pay for connection setup
            sb.exec(command)
            container.exec_run(argv, user=SANDBOX_USER)
        for _ in range(n):
            t = time.perf_counter()
            res = sb.exec(command)
            times["turngym exec"].append(time.perf_counter() - t)
            assert res.exit_code == 0, res.observation()
            t = time.perf_counter()
            subprocess.run(["docker", "exec", "-u", SANDBOX_USER, cid, *argv], capture_output=True, check=True)
            times["raw docker exec (CLI)"].append(time.perf_counter() - t)
            t = time.perf_counter()
            out = container.exec_run(argv, user=SANDBOX_USER, demux=True)
            times["raw docker SDK exec_run"].append(time.perf_counter() - t)
            assert out.exit_code == 0
    return times


def bench_resets(resets: int, pause_s: float) -> dict[str, list[float]]:
    """SWE env reset time (fresh container + repo upload + first hash), warm pool vs none."""
    import turngym

    out: dict[str, list[float]] = {}
    for label, pool in (("SWE reset, warm pool (size 1)", 1), ("SWE reset, no pool (cold start)", 0)):
        env = turngym.make("turngym/SWE-synthetic-v0", split="test", sandbox="docker", pool_size=pool)
        ids = env.unwrapped.task_ids
        env.reset(seed=0, options={"task_id": ids[0]})  # starts the pool
        xs = []
        for i in range(resets):
            time.sleep(pause_s)  # an episode's worth of agent time, in which the pool refills
            t = time.perf_counter()
            env.reset(seed=i, options={"task_id": ids[i % len(ids)]})
            xs.append(time.perf_counter() - t)
        env.close()
        out[label] = xs
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=50, help="exec calls per method")
    p.add_argument("--command", default="true", help="the command to time")
    p.add_argument("--resets", type=int, default=10, help="episode resets per setting")
    p.add_argument("--pause", type=float, default=1.0, help="seconds between resets (the episode)")
    args = p.parse_args(argv)
    from turngym.tools.sandbox.docker_backend import docker_available, ensure_image

    reason = docker_available()
    if reason:
        print(f"skipped: {reason}")
        return 1
    ensure_image()
    warnings.simplefilter("ignore")
    print(f"exec latency of `{args.command}` (same container, interleaved):")
    times = bench_exec(args.n, args.command)
    for name, xs in times.items():
        print("  " + row(name, xs))
    ours = statistics.median(times["turngym exec"])
    for raw in ("raw docker exec (CLI)", "raw docker SDK exec_run"):
        print(f"  ratio turngym / {raw}: {ours / statistics.median(times[raw]):.2f}x  (goal <= 1.2x)")
    print(f"\nepisode reset ({args.resets} resets, {args.pause:g}s apart):")
    for name, xs in bench_resets(args.resets, args.pause).items():
        print("  " + row(name, xs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
