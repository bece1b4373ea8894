"""Evaluate a finished ArCHer run acting with its critic, from its checkpoint (``eval.critic_guided``
without training again): the actor's greedy reply and K runner-ups are scored at every turn by the
final critic's min(Q1, Q2) (+ ``--prior`` x the actor's log-probability) and the best is played.

Plays the protocol's held-out games (the same reset seeds, so outcomes pair with the run's
``eval_final``) and writes a stage record (``per_episode_success``, ``acting/turns``,
``acting/moved``) to ``--out``.

    python scripts/critic_guided_eval.py runs/v0_seeds/seed0/archer_guided --k 3 --prior 0.1 \
        --games 128 --out runs/v0_seeds/seed0/archer_guided/critic_prior0.1.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from turngym.bench.protocol import held_out_eval, task_groups
from turngym.config import load_yaml
from turngym.train import TrainConfig, _with_split, load_policy
from turngym.trainers.archer import ArcherTrainer
from turngym.trainers.critic_guided import CriticGuidedPolicy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="a finished ArCHer run's output dir (config.json, archer/checkpoint)")
    ap.add_argument("--k", type=int, default=3, help="runner-ups scored beside the greedy reply")
    ap.add_argument("--margin", type=float, default=0.0)
    ap.add_argument("--prior", type=float, default=0.0)
    ap.add_argument("--games", type=int, default=128)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)

    run = Path(args.run)
    cfg = load_yaml(TrainConfig, run / "config.json")  # JSON is YAML
    policy = load_policy(cfg.model)
    trainer = ArcherTrainer(policy, cfg.env_id, cfg.archer, env_kwargs=_with_split(cfg.env_kwargs, cfg.train_split),
                            out_dir=run / "archer")
    trainer.load(run / "archer" / "checkpoint")  # the trained actor and its critic
    guided = CriticGuidedPolicy(policy, trainer.reply_values, args.k, args.margin, args.prior)
    held_out = _with_split(cfg.env_kwargs, cfg.eval.split)
    rec = held_out_eval(guided, cfg.env_id, held_out, games=args.games, samples=0, temperature=1.0,
                        max_new_tokens=cfg.eval.max_new_tokens, num_envs=cfg.eval.num_envs,
                        groups=task_groups(cfg.env_id, held_out))
    rec.update({f"acting/{k}": v for k, v in guided.stats.items()}, k=args.k, margin=args.margin, prior=args.prior)
    Path(args.out).write_text(json.dumps(rec, indent=2))
    print(f"acting with the critic (k={args.k}, margin={args.margin}, prior={args.prior}): "
          f"{rec['success']:.1%} (n={rec['episodes']}), invalid {rec['invalid_action_rate']:.1%}, "
          f"moved {guided.stats['moved']} of {guided.stats['turns']} turns")


if __name__ == "__main__":
    main()
