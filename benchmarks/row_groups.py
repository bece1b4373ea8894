"""Packed generation with a batch's rows split into one group per thread, against one forward on
all threads, in one run.

``PackedLM.forward`` on a CPU with several threads runs a batch's rows as groups, one per thread,
each group on one OpenMP thread (``PackedLM.row_groups``). A forward of 32 short rows is mostly
small per-row calls (attention against each row's own cache: rows x layers calls), and every call
on two threads pays a fork and join. This script plays the quickstart's held-out evaluation from
its SFT weights both ways (``--rounds 2``: again in the opposite order, to cancel drift) and prints
the seconds, their ratio, the tokens generated and how many games ended differently (none, if the
groups compute every row exactly as the whole batch does).

    python benchmarks/row_groups.py                    # 128 games, 2 rounds
    python benchmarks/row_groups.py --games 64 --rounds 1

Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os

from eval_batch import held_out_args, play, sft_policy

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # idle OpenMP threads must not spin on a shared machine


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    held_out_args(p, rounds=2, rounds_help="2: both ways again in the opposite order")
    p.add_argument("--num-envs", type=int, default=32, help="games in flight (the quickstart's eval.num_envs)")
    args = p.parse_args()

    import torch

    cfg, policy = sft_policy(args)
    ways = {"one forward": False, "row groups": True}
    runs: dict[str, list[dict]] = {w: [] for w in ways}
    order = list(ways)
    for r in range(args.rounds):
        for way in order if r % 2 == 0 else order[::-1]:
            policy.packed.split_rows = ways[way]
            runs[way].append(play(policy, cfg, args.games, args.num_envs))
            print(f"round {r + 1}, {way}: {runs[way][-1]['seconds']:.1f} s", flush=True)
    base = sum(x["seconds"] for x in runs[order[0]]) / args.rounds
    print(f"\n{args.games} held-out games, {args.num_envs} in flight, {torch.get_num_threads()} threads, "
          f"{args.rounds} round(s)\n")
    print("| forward | seconds (mean) | speed vs one forward | tokens generated | success | games ended differently |")
    print("|---|---|---|---|---|---|")
    for way in order:
        seconds = sum(x["seconds"] for x in runs[way]) / args.rounds
        last = runs[way][-1]
        differ = sum(a != b for a, b in zip(last["outcomes"], runs[order[0]][-1]["outcomes"]))
        print(f"| {way} | {seconds:.1f} | {base / seconds:.2f}x | {last['sampled_tokens']} | {last['success']:.1%} | {differ} |")


if __name__ == "__main__":
    main()
