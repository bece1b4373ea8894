"""Sample efficiency in miniature: ArCHer vs GRPO vs GiGPO with equal env-step budgets and seeds.

All algorithms start from the same SFT warm start (trained once and cached in the output dir),
play the same training tasks with the same seeds, and stop at the same env-step budget. The script
writes a table (Markdown + JSON) and a plot of training success against env steps, and reports the
env steps each algorithm needed to reach the target success (a 2-iteration moving average), plus
held-out success at the end.

    python scripts/compare_algos.py --budget 400 --target 0.6 --out runs/compare
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import torch

from turngym.train import EvalConfig, TrainConfig, evaluate_policy, load_policy
from turngym.trainers.archer import ArcherConfig, ArcherTrainer
from turngym.trainers.logger import MetricsLogger
from turngym.trainers.pg import PGConfig, PGTrainer
from turngym.trainers.sft import SFTConfig, sft

QUICKSTART = TrainConfig()  # same knobs as `turngym train`; only the stopping rule differs


def warm_start(args, out: Path):
    policy = load_policy(args.model)
    weights = out / "sft_model.pt"
    if weights.exists():
        policy.model.load_state_dict(torch.load(weights, map_location="cpu"))
    else:
        sft_cfg = SFTConfig(**{**asdict(QUICKSTART.sft), "episodes": args.sft_episodes, "epochs": args.sft_epochs})
        sft(policy, args.env, sft_cfg, env_kwargs=_env_kwargs("train"))
        torch.save(policy.model.state_dict(), weights)
    policy.invalidate_caches()
    return policy


def _env_kwargs(split: str) -> dict:
    return {**QUICKSTART.env_kwargs, "split": split}


def make_trainer(algo: str, policy, env: str, out: Path):
    # the budget is counted in env steps by the caller, so the iteration cap is only a ceiling
    if algo == "archer":
        cfg = ArcherConfig(**{**asdict(QUICKSTART.archer), "iterations": 10**6, "checkpoint_every": 0})
        return ArcherTrainer(policy, env, cfg, env_kwargs=_env_kwargs("train"), out_dir=out / algo)
    cfg = PGConfig(**{**asdict(QUICKSTART.pg), "algo": algo, "iterations": 10**6, "checkpoint_every": 0})
    return PGTrainer(policy, env, cfg, env_kwargs=_env_kwargs("train"), out_dir=out / algo)


def steps_to_target(rows: list[dict], target: float) -> int | None:
    for i in range(len(rows)):
        window = rows[max(0, i - 1) : i + 1]
        if sum(r["rollout/success"] for r in window) / len(window) >= target:
            return rows[i]["env_steps"]
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="turngym/TextWorld-easy-v0")
    ap.add_argument("--model", default="default")
    ap.add_argument("--algos", default="archer,grpo,gigpo")
    ap.add_argument("--budget", type=int, default=400, help="env steps per algorithm")
    ap.add_argument("--target", type=float, default=0.6, help="training success to reach")
    ap.add_argument("--sft-episodes", type=int, default=24)
    ap.add_argument("--sft-epochs", type=int, default=2)
    ap.add_argument("--eval-episodes", type=int, default=20)
    ap.add_argument("--out", default="runs/compare")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    eval_cfg = TrainConfig(env_id=args.env, model=args.model, output_dir=str(out),
                           eval=EvalConfig(episodes=args.eval_episodes, num_envs=args.eval_episodes))
    print(f"equal budgets: {args.budget} env steps per algorithm, seed {QUICKSTART.seed}, from one SFT warm start")
    results = {}
    for algo in args.algos.split(","):
        policy = warm_start(args, out)
        trainer = make_trainer(algo, policy, args.env, out)
        trainer.setup()
        logger = MetricsLogger(out / algo)
        rows = []
        while trainer.env_steps < args.budget:
            m = trainer.step()
            logger.log(m, step=trainer.iteration)
            rows.append(m)
            print(f"{algo:7s} it {trainer.iteration:3d} env_steps {trainer.env_steps:5d} success {m['rollout/success']:.2f}")
        logger.close()
        held_out = evaluate_policy(policy, eval_cfg, f"{algo}_final")
        results[algo] = {"env_steps": trainer.env_steps, "iterations": trainer.iteration,
                         "steps_to_target": steps_to_target(rows, args.target),
                         "final_train_success": rows[-1]["rollout/success"] if rows else None,
                         "held_out_success": held_out["success"], "curve": [(r["env_steps"], r["rollout/success"]) for r in rows]}
    (out / "comparison.json").write_text(json.dumps(results, indent=2))
    table = ["| algo | env steps | steps to target {:.0%} | final train success | held-out success |".format(args.target),
             "|---|---|---|---|---|"]
    for algo, r in results.items():
        table.append(f"| {algo} | {r['env_steps']} | {r['steps_to_target'] or 'not reached'} | "
                     f"{r['final_train_success']:.2f} | {r['held_out_success']:.2f} |")
    (out / "comparison.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))
    _plot(results, out / "comparison.png", args)


def _plot(results: dict, path: Path, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for algo, r in results.items():
        if r["curve"]:
            xs, ys = zip(*r["curve"])
            ax.plot(xs, ys, marker="o", label=algo)
    ax.axhline(args.target, color="grey", ls="--", lw=1, label="target")
    ax.set_xlabel("env steps")
    ax.set_ylabel("training success")
    ax.set_title(f"{args.env}: equal env-step budgets")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
