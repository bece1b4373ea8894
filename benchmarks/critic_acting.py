"""Acting with the critic, with and without the KV caches that spare each turn its history, in one run.

Acting with the critic (``acting.k``, ``trainers.archer.acting.CriticGuidedPolicy``) scores
the greedy reply and its runner-ups at every turn. Two caches spare it prefilling the episode's
history for that:

- **actor**: the runner-ups are chosen and finished from the KV cache the greedy reply left
  (``HFPolicy.held_cache``, passed to ``alternatives`` as ``episode_caches``);
- **critic**: the critic's features of a turn's replies run on the keys and values of the previous
  turn's prompt (``archer.encoder.PromptFeatures``), as ArCHer's ``reply_values`` does.

Both sides play the same held-out games from the quickstart's SFT weights, with the same critic (a
fixed random linear read-out of the frozen reference's features, the cost of ArCHer's critic without
its training), in alternating order, and the script checks whether they play the same replies token
for token (in bf16 a cache computed in another batch rounds differently and can flip a near-tie).

    python benchmarks/critic_acting.py --games 32 --rounds 2

Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # idle OpenMP threads must not spin on a shared machine


def play(policy, ref, head, cfg, games: int, k: int, cached: bool) -> dict:
    """``games`` held-out episodes acted with the critic; seconds, prefilled tokens (actor, critic), replies."""
    import torch

    from turngym.agents.base import SamplingParams
    from turngym.bench.evaluate import evaluate
    from turngym.trainers.actor import autocast
    from turngym.trainers.archer.encoder import PromptFeatures
    from turngym.trainers.archer.acting import CriticGuidedPolicy

    features = PromptFeatures(ref, budget_mb=2048 if cached else 0)

    def values(prompt, replies):
        with autocast(ref, "auto"):
            _, sa = features(list(prompt), [list(r) for r in replies])
        return (sa @ head).tolist()

    policy.invalidate_caches()
    held = policy.held_cache
    if not cached:
        policy.held_cache = lambda conv: None  # alternatives prefills the history again
    guided = CriticGuidedPolicy(policy, values, k=k, prior=0.1)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=cfg.eval.max_new_tokens)
    before = dict(policy.stats)
    t0 = time.perf_counter()
    with torch.no_grad():  # the held-out games turngym protocol plays (reset seeds 10000 + i)
        trajs = evaluate(cfg.env_id, guided, episodes=games, seed=10_000, env_kwargs={**cfg.env_kwargs, "split": "test"},
                         num_envs=cfg.eval.num_envs, sampling=greedy, progress=False, distinct=True).trajectories
    seconds = time.perf_counter() - t0
    policy.held_cache = held
    return {"seconds": seconds, "replies": [[t.action_ids(j) for j in range(len(t.turns))] for t in trajs],
            "success": sum(t.success for t in trajs), "turns": guided.stats["turns"], "moved": guided.stats["moved"],
            "actor_prefill": policy.stats["prefill_tokens"] - before["prefill_tokens"],
            "critic_prefill": features.stats["prefilled_tokens"], "critic_prompts": features.stats["prompt_tokens"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--games", type=int, default=32, help="held-out TextWorld-easy games per side")
    p.add_argument("--k", type=int, default=3, help="runner-ups scored per turn (acting.k)")
    p.add_argument("--rounds", type=int, default=2, help="rounds over the sides (the order alternates)")
    p.add_argument("--weights", default=str(Path.home() / ".cache" / "turngym" / "roofline_sft.pt"),
                   help="the quickstart's SFT weights (made by benchmarks/roofline.py when missing)")
    args = p.parse_args()

    import torch

    from roofline import _quickstart, _sft_weights
    from turngym.agents.default_model import load_default
    from turngym.trainers.actor import frozen_copy

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    cfg = _quickstart()
    cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, num_envs=min(cfg.eval.num_envs, args.games)))
    policy = load_default()
    _sft_weights(args, policy)
    ref = frozen_copy(policy.model)
    head = torch.Generator().manual_seed(0)
    head = torch.randn(ref.config.get_text_config().hidden_size, generator=head)
    runs: dict[str, list[dict]] = {"no caches": [], "caches": []}
    for r in range(args.rounds):
        for name in list(runs) if r % 2 == 0 else list(runs)[::-1]:
            x = play(policy, ref, head, cfg, args.games, args.k, cached=name == "caches")
            runs[name].append(x)
            print(f"round {r + 1} {name}: {x['seconds']:.1f} s, {x['turns']} turns ({x['moved']} moved), "
                  f"prefilled: actor {x['actor_prefill']}, critic {x['critic_prefill']} of {x['critic_prompts']} "
                  f"prompt tokens; {x['success']} of {args.games} won", flush=True)
    best = {n: min(rs, key=lambda x: x["seconds"]) for n, rs in runs.items()}
    base = best["no caches"]
    print(f"\n| side | seconds (best of {args.rounds}) | speed vs no caches | actor prefilled | critic prefilled | "
          "won | the same replies |")
    print("|---|---|---|---|---|---|---|")
    for name, x in best.items():
        same = all(a["replies"] == b["replies"] for a, b in zip(runs["no caches"], runs[name]))
        print(f"| {name} | {x['seconds']:.1f} | {base['seconds'] / x['seconds']:.2f}x | {x['actor_prefill']} | "
              f"{x['critic_prefill']} | {x['success']}/{args.games} | {same} |")


if __name__ == "__main__":
    main()
