"""How well a trained ArCHer critic knows what episodes earn, on episodes it never trained on.

Loads a ``turngym train`` (or ``turngym protocol`` arm) run of ``--algo archer``: the SFT weights the
critic's frozen layers come from (``sft_model.pt``), the RL checkpoint (the critic), and held-out
episodes: a held-out evaluation's (``--episodes eval_final.json``), or ``--play N`` held-out tasks
played greedily by the trained actor (``final_model``). Prints the critic's calibration against the
discounted Monte Carlo returns and its ranking of won against lost episodes' turns
(``turngym.trainers.archer.probes.critic_report``).

    python scripts/critic_report.py runs/archer_search/seed0/archer --play 128
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


from turngym.config import from_dict
from turngym.train import TrainConfig, load_policy, train_env_kwargs
from turngym.trainers.archer import ArcherTrainer
from turngym.trainers.archer.probes import critic_report
from turngym.types import SamplingParams, Trajectory
from turngym.trainers.checkpoint import load_weights


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="the run's output dir (config.json, sft_model.pt, archer/checkpoint)")
    ap.add_argument("--episodes", default="eval_final.json", help="episodes to score, in the run's dir")
    ap.add_argument("--play", type=int, default=0, help="instead, play this many held-out tasks with the trained actor")
    args = ap.parse_args()
    cfg = from_dict(TrainConfig, json.loads((args.run / "config.json").read_text())).with_seeds()
    policy = load_policy(cfg.model)
    policy.model.load_state_dict(load_weights(args.run / "sft_model.pt"))  # the critic's frozen part
    trainer = ArcherTrainer(policy, cfg.env_id, cfg.archer, env_kwargs=train_env_kwargs(cfg), out_dir=args.run / "archer")
    trainer.setup()
    trainer.load(args.run / "archer" / "checkpoint")
    if args.play:
        from turngym.bench.evaluate import evaluate
        from turngym.agents import make_agent

        actor = make_agent(f"hf:{args.run / 'final_model'}")
        episodes = evaluate(cfg.env_id, actor, episodes=args.play, seed=10_000 + cfg.seed, distinct=True,
                            env_kwargs={**cfg.env_kwargs, "split": cfg.eval.split}, num_envs=cfg.eval.num_envs,
                            sampling=SamplingParams(temperature=0.0, max_new_tokens=cfg.eval.max_new_tokens or 48)).trajectories
    else:
        data = json.loads((args.run / args.episodes).read_text())
        episodes = [Trajectory.from_dict(t) for t in data["trajectories"]]
    refs, s, sa = trainer.encoder.episodes(episodes)
    rewards = [[t.reward for t in ep.turns] for ep in episodes]
    report = critic_report(trainer.critic, s, sa, refs, rewards, [ep.success for ep in episodes], cfg.archer.gamma)
    print(json.dumps({"episodes": len(episodes), "turns": len(refs), **report}, indent=1))


if __name__ == "__main__":
    main()
