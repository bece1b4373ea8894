"""The quickstart's branch search with and without the caches its runner-up replies carry, in one run.

Branch BC screens training games greedily, then plays its policy's runner-up replies on from the
failed games' decisive turns (``rollout.branching.branch_search``). Without a carried cache, each
branch's first turn prefills its whole replayed history again; with one (``HFPolicy``'s
``carried_cache_mb``, the default) it computes only what follows the branch point. Both sides start
from the quickstart's SFT weights and search the same screened episodes, in alternating order, and
the script checks that they find the same branches, token for token.

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


def screened(trainer) -> list:
    """The quickstart's first screen: one greedy episode per picked training game, with its spec."""
    from turngym.agents.base import SamplingParams
    from turngym.rollout import EpisodeSpec
    from turngym.rollout.schedule import run_seed

    cfg = trainer.cfg
    specs = [EpisodeSpec(t, run_seed(cfg.seed, trainer.task_ids.index(t)), greedy=True) for t in trainer.pick_tasks()]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=cfg.max_new_tokens, seed=run_seed(cfg.seed, 0))
    roots, _ = trainer.collector.collect(trainer.env, specs, greedy, num_envs=cfg.num_envs, version=0)
    return list(zip(specs, roots))


def search(trainer, roots: list, carried_mb: int) -> dict:
    """One branch search over ``roots`` with ``carried_mb`` MB of carried caches: seconds, tokens, branches."""
    cfg, policy = trainer.cfg, trainer.policy
    policy.carried_cache_bytes = carried_mb * 2**20
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
    p.add_argument("--rounds", type=int, default=2, help="A B rounds (the order alternates)")
    p.add_argument("--carried-mb", type=int, default=1024, help="the carried caches' budget of the 'with' side")
    p.add_argument("--weights", default=str(Path.home() / ".cache" / "turngym" / "roofline_sft.pt"),
                   help="the quickstart's SFT weights (made by benchmarks/roofline.py when missing)")
    p.add_argument("--tmp", default="/tmp/turngym-branch-search")
    p.add_argument("--fp32", action="store_true",
                   help="generate in fp32 (slower): bf16 rounds a cache computed in another batch differently, "
                        "which can flip a greedy near-tie; in fp32 both sides must find the same branches")
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
    roots = screened(trainer)
    print(f"screen: {len(roots)} games, {sum(not t.success for _, t in roots)} failed", flush=True)
    runs: dict[str, list[dict]] = {"without": [], "with": []}
    for r in range(args.rounds):
        for name in (("without", "with") if r % 2 == 0 else ("with", "without")):
            runs[name].append(search(trainer, roots, 0 if name == "without" else args.carried_mb))
            x = runs[name][-1]
            print(f"round {r + 1} {name}: {x['seconds']:.1f} s, prefill {x['prefill_tokens']} tokens, "
                  f"reused {x['reused_tokens']}, {len(x['branches'])} branches, {x['solved']} solved", flush=True)
    trainer.close()
    best = {n: min(rs, key=lambda x: x["seconds"]) for n, rs in runs.items()}
    same = all(a["branches"] == b["branches"] for a, b in zip(runs["without"], runs["with"]))
    print("\n| | without carried caches | with | ratio |\n|---|---|---|---|")
    print(f"| search, s (best of {args.rounds}) | {best['without']['seconds']:.1f} | {best['with']['seconds']:.1f} | "
          f"{best['without']['seconds'] / best['with']['seconds']:.2f}x |")
    print(f"| prefilled tokens | {best['without']['prefill_tokens']} | {best['with']['prefill_tokens']} | "
          f"{best['without']['prefill_tokens'] / max(1, best['with']['prefill_tokens']):.2f}x |")
    print(f"| branches (solved) | {len(best['without']['branches'])} ({best['without']['solved']}) | "
          f"{len(best['with']['branches'])} ({best['with']['solved']}) | token for token the same: {same} |")


if __name__ == "__main__":
    main()
