"""Diagnostic behind docs/experiments.md (2026-11-25): how many of the training games that greedy
play fails does a search from the failures solve, with the policy's runner-up replies
(``HFPolicy.alternatives``, what branch_bc uses) or with replies sampled at a temperature?

    python scripts/branch_probe.py runs/quickstart/sft_model.pt                      # runner-ups, depth 2
    python scripts/branch_probe.py runs/quickstart/sft_model.pt --sample 2.0 --depth 1   # sampled at T=2

Plays every training game of TextWorld-easy once greedily (the screen), searches from the failed
episodes, and prints the seconds, the branches and the failed games solved (and how many of those at
the walkthrough's length: the oracle is read for this report only, never by the search).
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import torch

from turngym.agents.base import SamplingParams
from turngym.rollout import EnvPools, EnvTarget, EpisodeSpec, env_info, rollout
from turngym.rollout.branching import branch_points, branch_search
from turngym.rollout.episode import branch_of, moved
from turngym.train import TrainConfig, load_policy

ENV = "turngym/TextWorld-easy-v0"


def sampled_search(policy, make_env, roots, temperature, points, width, pools):
    """One level of search with ``width`` replies sampled at ``temperature`` per branch point."""
    probes = [(s, r, j) for s, r in roots for j in branch_points(r, points) for _ in range(width)]
    tries = rollout(policy, make_env, [branch_of(r, s, j, free_turns=1) for s, r, j in probes],
                    sampling=SamplingParams(temperature, 1.0, 16, seed=0), num_envs=64, progress=False, pools=pools)
    seen, done, specs = set(), [], []
    for (s, r, j), t in zip(probes, tries):
        if len(t.turns) <= j or not moved(t, j):
            continue  # diverged, refused or a no-op
        key = (id(r), j, t.turns[j].info.get("state_key"))
        if key in seen or key[2] == r.turns[j].info.get("state_key"):
            continue  # the root's own move, or one already tried
        seen.add(key)
        if t.metadata.get("stopped") == "free_turns":
            specs.append(branch_of(t, s, j + 1, greedy=True))
        else:
            done.append(t)  # the sampled reply ended the episode
    played = rollout(policy, make_env, specs, sampling=SamplingParams(0.0, max_new_tokens=16), num_envs=64,
                     progress=False, pools=pools) if specs else []
    return done + played


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("weights", help="a state dict of the embedded model (e.g. runs/quickstart/sft_model.pt)")
    p.add_argument("--points", type=int, default=2)
    p.add_argument("--width", type=int, default=3)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--sample", type=float, default=None, metavar="T", help="sample replies at temperature T instead")
    a = p.parse_args()
    policy = load_policy("default")
    policy.model.load_state_dict(torch.load(a.weights, map_location=policy.device))
    policy.invalidate_caches()
    kw = {"tool_format": "xml", "split": "train"}
    probe = gym.make(ENV, **kw)
    walk = {t: len(probe.unwrapped.walkthrough(t)) for t in env_info(ENV, **kw).task_ids}
    stops = list(env_info(ENV, **kw).stop_strings)
    probe.close()
    branch = TrainConfig().branch
    make_env = EnvTarget(ENV, kw, branch.max_turns, branch.max_state_visits).factory()
    with EnvPools() as pools:
        t0 = time.perf_counter()
        specs = [EpisodeSpec(t, i, greedy=True) for i, t in enumerate(walk)]
        roots = rollout(policy, make_env, specs, sampling=SamplingParams(0.0, max_new_tokens=16), num_envs=64,
                        progress=False, pools=pools)
        failed = [(s, r) for s, r in zip(specs, roots) if not r.success]
        t1 = time.perf_counter()
        if a.sample is None:
            found = branch_search(policy, make_env, failed, stops=stops, points=a.points, width=a.width,
                                  depth=a.depth, max_new_tokens=16, num_envs=64, pools=pools)
        else:
            found = sampled_search(policy, make_env, failed, a.sample, a.points, a.width, pools)
        t2 = time.perf_counter()
    best = {}
    for t in found:
        if t.success and (t.task_id not in best or len(t.turns) < len(best[t.task_id].turns)):
            best[t.task_id] = t
    optimal = sum(len(t.turns) == walk[k] for k, t in best.items())
    print(f"screen: {len(roots) - len(failed)}/{len(roots)} greedy wins, {t1 - t0:.0f} s")
    print(f"search: {len(found)} branches, {sum(len(t.turns) for t in found)} env steps, {t2 - t1:.0f} s; "
          f"failed games solved {len(best)}/{len(failed)} ({optimal} at the walkthrough's length)")


if __name__ == "__main__":
    main()
