"""Where an ArCHer checkpoint's AWR actor would put its target mass, by what the tree saw.

Reads a checkpoint of ``--algo archer`` with ``collect=tree`` (the actor's memory of sibling
groups and the critic), forms the AWR targets the next actor update would use, and counts the
target mass on each kind of reply: the policy's own or a runner-up, accepted or rejected by the
env, and whether its episode won. A healthy target puts the runner-ups' mass on replies that won.

    python scripts/archer_targets.py runs/x/archer/checkpoint/state.pt --margin 0 --margin 0.15

The critic has been trained on most of these turns, so its ranking here is in sample: an upper
bound on how well it separates winners from losers.
"""

from __future__ import annotations

import argparse
import collections

import torch

from turngym.trainers.archer import ArcherConfig, awr_targets, memory_advantages, memory_rows
from turngym.trainers.archer_critic import UtteranceCritic
from turngym.types import Trajectory


def load_memory(path: str):
    """The actor memory's groups, log-probs, returns, validity and the critic's advantages."""
    st = torch.load(path, map_location="cpu", weights_only=False)
    memory = st.get("memory") or []
    if not memory:
        raise SystemExit(f"{path}: no actor memory (not an ArCHer checkpoint with collect=tree and actor_loss=awr)")
    cfg = st.get("config") or {}
    critic = UtteranceCritic(memory[0]["s"].shape[-1], cfg.get("critic_hidden", 256))
    critic.load_state_dict(st["critic"])
    memory = [{**e, "turns": [Trajectory.from_dict(t) if isinstance(t, dict) else t for t in e["turns"]]} for e in memory]
    groups, _, logp, value, valid = memory_rows(memory)
    return groups, logp, value, valid, memory_advantages(memory, critic)


def target_mass(groups, logp, value, valid, adv, cfg: ArcherConfig) -> dict:
    """The AWR target mass per kind of reply at the states the update would pick (``awr_targets``)."""
    w, targets, _, _, pick = awr_targets(logp, adv, groups, valid, cfg)
    mass: dict[str, float] = collections.Counter()
    for i in pick:
        own = max(groups[i], key=lambda r: float(logp[r]))
        for r in targets[i]:
            kind = f"{'own' if r == own else 'runner-up'}, {'won' if value[r] > 0.5 else 'lost'}"
            mass[kind] += float(w[r])
    return {"states": len(pick), **dict(sorted(mass.items()))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint")
    p.add_argument("--margin", type=float, action="append", help="awr_margin values to compare (default: 0, 0.15)")
    p.add_argument("--beta", type=float, default=0.1)
    p.add_argument("--min-shift", type=float, default=0.05)
    p.add_argument("--groups", type=int, default=64, help="actor_groups")
    args = p.parse_args()
    data = load_memory(args.checkpoint)
    groups, _, value, _, _ = data
    mixed = sum(1 for g in groups if value[g].max() > 0.5 and value[g].min() < 0.5)
    print(f"{len(groups)} remembered states, {mixed} with a sibling that won and one that lost")
    for m in args.margin or [0.0, 0.15]:
        cfg = ArcherConfig(awr_margin=m, awr_beta=args.beta, awr_min_shift=args.min_shift, actor_groups=args.groups)
        row = target_mass(*data, cfg)
        print(f"margin {m:g}: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))


if __name__ == "__main__":
    main()
