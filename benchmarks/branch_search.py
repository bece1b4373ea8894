"""The quickstart's branch search with and without the KV caches it reuses, in one run.

Branch BC screens training games greedily, then plays its policy's runner-up replies on from the
failed games' decisive turns (``rollout.branching.branch_search``). Two caches spare it prefilling
an episode's history again:

- **carried**: each runner-up reply carries the KV cache of the prompt it answers (``HFPolicy``'s
  ``carried_cache_mb``), so the branch that plays it computes only what follows the branch point;
- **episodes**: a failed screened episode keeps its conversation's KV cache (``EpisodeSpec.keep_cache``,
  ``HFPolicy.final_cache``), so choosing the runner-ups at its turns (``HFPolicy.alternatives``)
  computes only the scored reply, not the turns before it.

Every side starts from the quickstart's SFT weights and searches the same screened episodes, in
alternating order, and the script checks whether they find the same branches, token for token (in
bf16 a cache computed in another batch rounds differently and can flip a greedy near-tie; with
``--fp32`` they must agree).

    python benchmarks/branch_search.py --rounds 2

Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # idle OpenMP threads must not spin on a shared machine

SIDES = {"none": (False, False), "carried": (True, False), "carried + episodes": (True, True)}


def screened(trainer) -> list:
    """The quickstart's first screen: one greedy episode per picked training game, with its spec; a
    failed one keeps its KV cache (``keep_cache``)."""
    from turngym.agents.base import SamplingParams
    from turngym.rollout import EpisodeSpec
    from turngym.rollout.schedule import run_seed

    cfg = trainer.cfg
    specs = [EpisodeSpec(t, run_seed(cfg.seed, trainer.task_ids.index(t)), greedy=True, keep_cache=True)
             for t in trainer.pick_tasks()]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=cfg.max_new_tokens, seed=run_seed(cfg.seed, 0))
    roots, _ = trainer.collector.collect(trainer.env, specs, greedy, num_envs=cfg.num_envs, version=0)
    return list(zip(specs, roots))


def search(trainer, roots: list, kept: dict, carried_mb: int, episodes: bool) -> dict:
    """One branch search over ``roots``: with ``carried_mb`` MB of carried caches, and the screened
    episodes' own caches (``kept``) where ``episodes``. Seconds, tokens, branches."""
    cfg, policy = trainer.cfg, trainer.policy
    policy.carried_cache_bytes = carried_mb * 2**20
    for _, t in roots:  # the search releases an episode's cache once it is scored: hand it back
        t.cache = kept.get(id(t)) if episodes else None
    roots = [(dataclasses.replace(s, keep_cache=episodes), t) for s, t in roots]
    before = dict(policy.stats)
    t0 = time.perf_counter()
    found = trainer.collector.branch_search(trainer.env, roots, points=cfg.branch_points, width=cfg.branch_width,
                                            depth=cfg.branch_depth, max_new_tokens=cfg.max_new_tokens,
                                            num_envs=cfg.num_envs, by=cfg.branch_by, version=0)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "branches": [[t.action_ids(k) for k in range(len(t.turns))] for t in found],
            "solved": sum(t.success for t in found),
            **{k: policy.stats[k] - before.get(k, 0) for k in ("prefill_tokens", "reused_tokens", "sampled_tokens")}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2, help="rounds over the sides (the order alternates)")
    p.add_argument("--carried-mb", type=int, default=2048, help="the caches' budget of the sides that use them")
    p.add_argument("--weights", default=str(Path.home() / ".cache" / "turngym" / "roofline_sft.pt"),
                   help="the quickstart's SFT weights (made by benchmarks/roofline.py when missing)")
    p.add_argument("--tmp", default="/tmp/turngym-branch-search")
    p.add_argument("--fp32", action="store_true",
                   help="generate in fp32 (slower): bf16 rounds a cache computed in another batch differently, "
                        "which can flip a greedy near-tie; in fp32 every side must find the same branches")
    args = p.parse_args()

    import torch

    from roofline import _quickstart, _sft_weights
    from turngym.agents.default_model import load_default
    from turngym.trainers.branch_bc import BranchBCTrainer

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    cfg = _quickstart()
    policy = load_default()
    _sft_weights(args, policy)
    trainer = BranchBCTrainer(policy, cfg.env_id, dataclasses.replace(cfg.branch, expert_replay=0),
                              env_kwargs={**cfg.env_kwargs, "split": cfg.train_split}, out_dir=Path(args.tmp) / "bc")
    trainer.setup()
    if args.fp32:
        policy.generation_dtype = None  # the model's own fp32 weights
    policy.carried_cache_bytes = args.carried_mb * 2**20
    roots = screened(trainer)
    kept = {id(t): t.cache for _, t in roots if t.cache is not None}
    print(f"screen: {len(roots)} games, {sum(not t.success for _, t in roots)} failed, {len(kept)} kept their cache",
          flush=True)
    runs: dict[str, list[dict]] = {name: [] for name in SIDES}
    for r in range(args.rounds):
        for name in list(SIDES) if r % 2 == 0 else list(SIDES)[::-1]:
            carried, episodes = SIDES[name]
            runs[name].append(search(trainer, roots, kept, args.carried_mb if carried else 0, episodes))
            x = runs[name][-1]
            print(f"round {r + 1} {name}: {x['seconds']:.1f} s, prefill {x['prefill_tokens']} tokens, "
                  f"reused {x['reused_tokens']}, {len(x['branches'])} branches, {x['solved']} solved", flush=True)
    trainer.close()
    best = {n: min(rs, key=lambda x: x["seconds"]) for n, rs in runs.items()}
    base = best["none"]
    print("\n| caches | search, s (best of {}) | speed vs none | prefilled tokens | branches (solved) | "
          "the same branches as none |".format(args.rounds))
    print("|---|---|---|---|---|---|")
    for name, x in best.items():
        same = all(a["branches"] == b["branches"] for a, b in zip(runs["none"], runs[name]))
        print(f"| {name} | {x['seconds']:.1f} | {base['seconds'] / x['seconds']:.2f}x | {x['prefill_tokens']} | "
              f"{len(x['branches'])} ({x['solved']}) | {same} |")


if __name__ == "__main__":
    main()
