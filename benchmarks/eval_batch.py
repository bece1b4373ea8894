"""The quickstart's held-out evaluation with more or fewer games in flight, or draft tokens, in one run.

A wider generation batch feeds every matmul more rows, which is how a GPU gets faster. On a CPU
whose generation is already compute-bound it may not be: this script plays the same held-out games
from the same weights at each ``--num-envs`` in turn (``--rounds 2``: the widths again, reversed, to
cancel drift) and prints each width's wall time, its ratio to the first width's, the tokens it
generated, its success and how many games ended differently (bf16 batches of another width round
differently, so a few greedy episodes may choose other tokens).

``--draft-tokens`` does the same for the prompt-lookup drafts greedy decoding checks per forward
(``HFPolicy.draft_tokens``, ``agents/lookahead.py``): each drafted token is a row of the forward
whether it is kept or not, so on a compute-bound CPU fewer drafts can be faster.

    python benchmarks/eval_batch.py --num-envs 32 128            # the quickstart's SFT weights
    python benchmarks/eval_batch.py --num-envs 32 64 128 --rounds 2
    python benchmarks/eval_batch.py --num-envs 32 --draft-tokens 8 4 2 --rounds 2

Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # idle OpenMP threads must not spin on a shared machine


def play(policy, cfg, games: int, num_envs: int) -> dict:
    """One greedy held-out evaluation as ``turngym train`` plays it, ``num_envs`` games in flight."""
    from turngym.agents.base import SamplingParams
    from turngym.bench.evaluate import evaluate

    policy.invalidate_caches()
    before = dict(policy.stats)
    t0 = time.perf_counter()
    res = evaluate(cfg.env_id, policy, episodes=games, seed=10_000, distinct=True, progress=False,
                   env_kwargs={**cfg.env_kwargs, "split": cfg.eval.split}, num_envs=num_envs,
                   sampling=SamplingParams(temperature=0.0, max_new_tokens=cfg.eval.max_new_tokens, seed=0))
    return {"seconds": time.perf_counter() - t0, "success": res.summary["success"],
            "turns": res.summary["tool_calls"], "outcomes": [bool(t.success) for t in res.trajectories],
            **{k: policy.stats.get(k, 0) - before.get(k, 0) for k in ("sampled_tokens", "drafted", "accepted")}}


def held_out_args(p: argparse.ArgumentParser, rounds: int, rounds_help: str) -> None:
    """The options of a benchmark that plays the held-out games: how many, how many rounds, which weights."""
    p.add_argument("--games", type=int, default=128, help="distinct held-out games per pass")
    p.add_argument("--rounds", type=int, default=rounds, help=rounds_help)
    p.add_argument("--weights", default=str(Path.home() / ".cache" / "turngym" / "roofline_sft.pt"),
                   help="the SFT weights to play (made by a full SFT stage when missing, as roofline.py does)")


def sft_policy(args) -> tuple:
    """The quickstart's config and the default policy with its SFT weights (``args.weights``)."""
    from roofline import _quickstart, _sft_weights

    from turngym.agents.default_model import load_default

    policy = load_default()
    _sft_weights(args, policy)
    return _quickstart(), policy


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-envs", type=int, nargs="+", default=[32, 128], help="games in flight, one pass each")
    p.add_argument("--draft-tokens", type=int, nargs="+", default=None,
                   help="draft tokens per forward, one pass each (default: the policy's own)")
    held_out_args(p, rounds=1, rounds_help="2: the widths again in reverse order")
    args = p.parse_args()
    cfg, policy = sft_policy(args)
    drafts = args.draft_tokens or [policy.draft_tokens]
    order = [(n, d) for n in args.num_envs for d in drafts]
    runs: dict[tuple, list[dict]] = {x: [] for x in order}
    for r in range(args.rounds):
        for n, d in order if r % 2 == 0 else order[::-1]:
            policy.draft_tokens = d
            runs[n, d].append(play(policy, cfg, args.games, n))
            print(f"round {r + 1}, {n} in flight, {d} draft tokens: {runs[n, d][-1]['seconds']:.1f} s", flush=True)
    first = order[0]
    base = sum(x["seconds"] for x in runs[first]) / args.rounds
    print(f"\n{args.games} held-out games, {os.cpu_count()} cores, {args.rounds} round(s)\n")
    print("| games in flight | draft tokens | seconds (mean) | speed vs the first | tokens generated | drafts kept | "
          "success | games ended differently |")
    print("|---|---|---|---|---|---|---|---|")
    for n, d in order:
        seconds = sum(x["seconds"] for x in runs[n, d]) / args.rounds
        last = runs[n, d][-1]
        differ = sum(a != b for a, b in zip(last["outcomes"], runs[first][-1]["outcomes"]))
        kept = f"{last['accepted']} of {last['drafted']}" if last["drafted"] else "-"
        print(f"| {n} | {d} | {seconds:.1f} | {base / seconds:.2f}x | {last['sampled_tokens']} | {kept} | "
              f"{last['success']:.1%} | {differ} |")


if __name__ == "__main__":
    main()
