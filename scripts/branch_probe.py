"""Diagnostic behind docs/experiments.md: how many of the training tasks that greedy play fails does
a search from the failures solve, with the policy's runner-up replies (``HFPolicy.alternatives``, what
branch_bc uses) or with replies sampled at a temperature, and where should it branch?

    python scripts/branch_probe.py runs/quickstart/sft_model.pt                      # runner-ups, depth 2
    python scripts/branch_probe.py runs/quickstart/sft_model.pt --sample 2.0 --depth 1   # sampled at T=2
    python scripts/branch_probe.py runs/hierarchy_search/seed0/sft/sft_model.pt \\
        --env turngym/Search-synthetic-large-v0 --tasks 64 --by state_key observation --pick latest uncertain

Plays the first ``--tasks`` training tasks once greedily (the screen), then searches from the failed
episodes once per branch-point rule (``--by`` x ``--pick``, from the same screen), and prints the
seconds, the branches, the env steps and the failed tasks solved (on TextWorld, also how many at the
walkthrough's length: the oracle is read for this report only, never by the search).
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import gymnasium as gym

from turngym.agents.base import SamplingParams
from turngym.rollout import EnvPools, EnvTarget, EpisodeSpec, env_info, rollout
from turngym.rollout.branching import BRANCH_BY, BRANCH_PICK, branch_points, branch_search
from turngym.rollout.episode import branch_of, moved
from turngym.train import TrainConfig, load_policy
from turngym.trainers.branch_bc import better
from turngym.trainers.checkpoint import load_weights


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


def walkthrough_lengths(env_id: str, kw: dict, task_ids: list[str]) -> dict[str, int]:
    """Each task's oracle length, where the env has one (TextWorld's walkthroughs), else {}."""
    probe = gym.make(env_id, **kw)
    try:
        walk = getattr(probe.unwrapped, "walkthrough", None)
        return {t: len(walk(t)) for t in task_ids} if walk else {}
    finally:
        probe.close()


def report(name: str, found: list, failed: list, walk: dict[str, int], seconds: float) -> dict:
    best = {}
    for t in found:
        if t.success and better(best.get(t.task_id), t):  # branch BC's choice of a task's clone
            best[t.task_id] = t
    row = {"rule": name, "branches": len(found), "env_steps": sum(len(t.turns) for t in found),
           "seconds": round(seconds, 1), "failed": len(failed), "solved": len(best)}
    if walk:
        row["solved_at_walkthrough_length"] = sum(len(t.turns) == walk[k] for k, t in best.items())
    print(f"search {name}: {row['branches']} branches, {row['env_steps']} env steps, {seconds:.0f} s; "
          f"failed tasks solved {row['solved']}/{row['failed']}"
          + (f" ({row['solved_at_walkthrough_length']} at the walkthrough's length)" if walk else ""))
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("weights", help="a state dict of the embedded model (e.g. runs/quickstart/sft_model.pt)")
    p.add_argument("--env", default="turngym/TextWorld-easy-v0")
    p.add_argument("--tasks", type=int, default=0, help="screen the first N training tasks (0: all)")
    p.add_argument("--points", type=int, default=2)
    p.add_argument("--width", type=int, default=3)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--by", nargs="+", default=["state_key"], choices=BRANCH_BY)
    p.add_argument("--pick", nargs="+", default=["latest"], choices=BRANCH_PICK)
    p.add_argument("--sample", type=float, default=None, metavar="T", help="sample replies at temperature T instead")
    p.add_argument("--json", default=None, help="write the screen and every rule's row here")
    a = p.parse_args()
    policy = load_policy("default")
    policy.model.load_state_dict(load_weights(a.weights))
    policy.invalidate_caches()
    kw = {"tool_format": "xml", "split": "train"}
    info = env_info(a.env, **kw)
    task_ids = list(info.task_ids)[: a.tasks or None]
    walk = walkthrough_lengths(a.env, kw, task_ids)
    branch = TrainConfig().branch
    make_env = EnvTarget(a.env, kw, branch.max_turns, branch.max_state_visits).factory()
    rows = []
    with EnvPools() as pools:
        t0 = time.perf_counter()
        specs = [EpisodeSpec(t, i, greedy=True) for i, t in enumerate(task_ids)]
        roots = rollout(policy, make_env, specs, sampling=SamplingParams(0.0, max_new_tokens=16), num_envs=64,
                        progress=False, pools=pools)
        failed = [(s, r) for s, r in zip(specs, roots) if not r.success]
        print(f"screen: {len(roots) - len(failed)}/{len(roots)} greedy wins, {time.perf_counter() - t0:.0f} s")
        rules = [(f"sampled at T={a.sample}", None, None)] if a.sample is not None else \
            [(f"by={by} pick={pick}", by, pick) for by, pick in itertools.product(a.by, a.pick)]
        for name, by, pick in rules:
            t1 = time.perf_counter()
            if by is None:
                found = sampled_search(policy, make_env, failed, a.sample, a.points, a.width, pools)
            else:
                found = branch_search(policy, make_env, failed, stops=list(info.stop_strings), points=a.points,
                                      width=a.width, depth=a.depth, max_new_tokens=16, num_envs=64, pools=pools,
                                      by=by, pick=pick)
            rows.append(report(name, found, failed, walk, time.perf_counter() - t1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"env": a.env, "weights": a.weights, "tasks": len(roots), "greedy_wins": len(roots) - len(failed),
                       "points": a.points, "width": a.width, "depth": a.depth, "rules": rows}, f, indent=1)


if __name__ == "__main__":
    main()
