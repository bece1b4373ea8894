"""Benchmark: env-step throughput with 1, 2 and 4 subprocess env workers, against 1, in one run.

Two envs, both played by the oracle so the env is the bottleneck:

1. ``turngym/TextWorld-easy-v0`` (test split): CPU-bound Python + the TextWorld engine. Workers can
   only scale up to the free cores (this machine has 2, shared with other jobs).
2. ``bench/Sleep-v0``: every turn's tool sleeps ``--sleep-s`` like a sandbox exec or an HTTP call
   (I/O-bound), so workers should scale with their count.

For each env it times, on the same episodes:

- the raw engine: a plain loop over one ``turngym.make(...)`` env (reset, step the oracle action),
  no rollout machinery (the reference);
- ``rollout(workers=False)``: the env in this process, one episode at a time;
- ``rollout(workers=True, num_envs=k)`` for k = 1, 2, 4: k subprocess workers stepping together
  (plus ``workers="thread"`` with 4 envs for the sleep env).

Throughput is agent turns (env steps) per wall-clock second of the whole call, resets and worker
start-up included. Every configuration runs ``--reps`` times, interleaved; the median is reported.

    python benchmarks/parallel_envs.py
    python benchmarks/parallel_envs.py --tw-episodes 32 --sleep-s 0.02 --reps 3
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import turngym
from turngym.agents import OracleAgent
from turngym.envs import StepOutcome, TextEnv
from turngym.rollout import episode_specs, make_env_factory, rollout
from turngym.tools import Tool
from turngym.types import Message, ToolCall


class SleepEnv(TextEnv):
    """Every turn runs the agent's command in a pretend sandbox that answers after ``sleep_s``.

    A turn whose command did not run (no call, or a malformed one) still waits (a rejected command
    costs a round trip too), so every step costs the same whatever the policy says. ``jitter`` j
    draws each wait from ``sleep_s * U(1 - j, 1 + j)``, seeded by task and turn (same in every run).
    Episodes end at the turn limit.
    """

    def __init__(self, sleep_s: float = 0.2, jitter: float = 0.0, n_tasks: int = 8, **kw) -> None:
        self.sleep_s, self.jitter = sleep_s, jitter
        super().__init__(**kw)
        self.task_ids = [f"t{i}" for i in range(n_tasks)]

    def _build_tools(self):
        def run(command: str) -> str:
            """Run a shell command in the sandbox.

            Args:
                command: the command line
            """
            self._wait()
            self._ran = True
            return f"$ {command[:60]}\nok"

        return [Tool.from_function(run, timeout_s=None)]

    def _reset_task(self, task_id):
        return [Message("system", "You operate a Linux shell through the run tool."),
                Message("user", f"Task {task_id}: list the files, then print the date.")]

    def _step_outcome(self, parsed, results):
        if not getattr(self, "_ran", False):
            self._wait()
        self._ran = False
        return StepOutcome(reward=0.0, terminated=False)

    def _wait(self) -> None:
        u = random.Random(f"{self.task_id}:{self.turn}").uniform(-1, 1)
        time.sleep(self.sleep_s * (1 + self.jitter * u))

    def state_key(self):
        return f"{self.task_id}:{self.turn}"

    def oracle_action(self):
        return self.format.render_call(ToolCall("c", "run", {"command": "ls"}))


turngym.register("bench/Sleep-v0", entry_point=SleepEnv, max_turns=4)


def raw_loop(env_id: str, kw: dict, specs) -> tuple[int, float]:
    """One env from ``turngym.make``, stepped with the oracle action: (steps, seconds)."""
    env = turngym.make(env_id, **kw)
    t0, steps = time.perf_counter(), 0
    for spec in specs:
        obs, info = env.reset(seed=spec.seed, options={"task_id": spec.task_id})
        done = False
        while not done:
            obs, reward, term, trunc, info = env.step(info["oracle_action"])
            steps += 1
            done = term or trunc
    env.close()
    return steps, time.perf_counter() - t0


def rollout_run(env_id: str, kw: dict, specs, workers, num_envs: int) -> tuple[int, float]:
    t0 = time.perf_counter()
    trajs = rollout(OracleAgent(), make_env_factory(env_id, **kw), specs, num_envs=num_envs, workers=workers,
                    progress=False)
    seconds = time.perf_counter() - t0
    assert not any(t.truncated and "error" in t.metadata for t in trajs), "an env crashed"
    return sum(len(t.turns) for t in trajs), seconds


def bench_env(name: str, env_id: str, kw: dict, episodes: int, reps: int, extra: list) -> None:
    task_ids = turngym.make(env_id, **kw).unwrapped.task_ids
    specs = episode_specs(task_ids, episodes)
    raw_loop(env_id, kw, specs[:2])  # warm-up: imports, game files in the page cache
    configs = [("raw engine loop (1 env)", None, 1), ("rollout, in-process (1 env)", False, 1)]
    configs += [(f"rollout, {k} subprocess worker{'s' * (k > 1)}", True, k) for k in (1, 2, 4)] + extra
    times: dict[str, list[float]] = {c[0]: [] for c in configs}
    steps: dict[str, int] = {}
    for _ in range(reps):
        for label, workers, k in configs:
            if workers is None:
                steps[label], sec = raw_loop(env_id, kw, specs)
            else:
                steps[label], sec = rollout_run(env_id, kw, specs, workers, k)
            times[label].append(sec)
    rate = {label: steps[label] / statistics.median(times[label]) for label in times}
    one, raw = rate["rollout, 1 subprocess worker"], rate["raw engine loop (1 env)"]
    print(f"\n## {name}: {episodes} episodes, {steps[configs[0][0]]} steps, median of {reps}")
    print(f"{'configuration':34s} {'wall s':>8s} {'steps/s':>9s} {'vs 1 worker':>12s} {'vs raw':>8s}")
    for label in times:
        print(f"{label:34s} {statistics.median(times[label]):8.3f} {rate[label]:9.1f} "
              f"{rate[label] / one:11.2f}x {rate[label] / raw:7.2f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tw-episodes", type=int, default=64)
    p.add_argument("--sleep-episodes", type=int, default=16)
    p.add_argument("--sleep-s", type=float, default=0.05, help="the sleep env's tool latency")
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    print(f"cores: {os.cpu_count()}, load average at start: {os.getloadavg()[0]:.2f}")
    bench_env("TextWorld-easy (CPU-bound)", "turngym/TextWorld-easy-v0", {"split": "test", "scripted_hints": True},
              args.tw_episodes, args.reps, [])
    bench_env(f"Sleep env, tool sleeps {args.sleep_s:g} s (I/O-bound)", "bench/Sleep-v0",
              {"sleep_s": args.sleep_s, "scripted_hints": True}, args.sleep_episodes, args.reps,
              [("rollout, 4 envs on threads", "thread", 4)])
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
