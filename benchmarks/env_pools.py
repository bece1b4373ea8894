"""Envs kept open (the Collector's pools) against new envs for every collection, in one run.

A training run collects every iteration and evaluates between stages. Old-style, each collection
opened ``num_envs`` new envs and closed them after: on TextWorld every new env starts a game
engine (about 1 s of CPU here), every time. The Collector keeps them open across iterations and
evaluations. This plays ``--collections`` collections of ``--episodes`` episodes each way, with the
same agent, specs and seeds, and prints seconds per collection and the ratio.

    python benchmarks/env_pools.py [--env turngym/TextWorld-easy-v0] [--agent random|tiny]
        [--collections 4] [--episodes 32] [--num-envs 32]

``--agent random`` (the default) plays random admissible commands, so the env's own cost is what is
measured; ``--agent tiny`` plays a tiny random LM (generation cost included). Results:
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import time


def make_policy(kind: str):
    if kind == "random":
        from turngym.agents.scripted import RandomAgent

        return RandomAgent(seed=0)
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from turngym.agents.default_model import load_default_tokenizer
    from turngym.agents.hf import HFPolicy

    tok = load_default_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                      tie_word_embeddings=False, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    return HFPolicy(LlamaForCausalLM(cfg).float().eval(), tok)


def run(policy, env, specs_for, args, pooled: bool) -> list[float]:
    from turngym.agents.base import SamplingParams
    from turngym.rollout import Collector

    times = []
    with Collector(policy) as collector:
        for i in range(args.collections):
            t0 = time.perf_counter()
            collector.play(env, specs_for(i), SamplingParams(temperature=1.0, max_new_tokens=16, seed=i),
                           num_envs=args.num_envs, pooled=pooled)
            times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="turngym/TextWorld-easy-v0")
    p.add_argument("--split", default="train")
    p.add_argument("--agent", choices=("random", "tiny"), default="random")
    p.add_argument("--collections", type=int, default=4)
    p.add_argument("--episodes", type=int, default=32)
    p.add_argument("--num-envs", type=int, default=32)
    p.add_argument("--max-turns", type=int, default=10)
    a = p.parse_args()
    from turngym.rollout import EnvTarget, episode_specs

    policy = make_policy(a.agent)
    env = EnvTarget(a.env, {"split": a.split, "tool_format": "xml", **getattr(policy, "env_kwargs", {})},
                    max_turns=a.max_turns)
    tasks = list(env.info.task_ids)
    specs_for = lambda i: episode_specs(tasks[(i * a.episodes) % len(tasks):] + tasks, a.episodes, seed=i)  # noqa: E731
    new = run(policy, env, specs_for, a, pooled=False)
    kept = run(policy, env, specs_for, a, pooled=True)
    print(f"{a.env} ({a.split}), agent {a.agent}: {a.collections} collections of {a.episodes} episodes, "
          f"{a.num_envs} envs, at most {a.max_turns} turns")
    print(f"{'':28s} {'first s':>8s} {'later s (mean)':>15s} {'total s':>8s}")
    for name, t in (("new envs every collection", new), ("envs kept open (Collector)", kept)):
        later = t[1:] or t
        print(f"{name:28s} {t[0]:8.1f} {sum(later) / len(later):15.1f} {sum(t):8.1f}")
    later_new = sum(new[1:]) / max(1, len(new) - 1)
    later_kept = sum(kept[1:]) / max(1, len(kept) - 1)
    print(f"saved per later collection: {later_new - later_kept:.1f} s; total time ratio new/kept: "
          f"{sum(new) / sum(kept):.2f}x; later collections {later_new / later_kept:.2f}x")


if __name__ == "__main__":
    main()
