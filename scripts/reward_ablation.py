"""Reward ablation: one trainer, one budget, five reward designs.

    outcome         the episode outcome only (sparse)
    shaped_ungated  outcome + a gameable step bonus, accumulated directly
    shaped_gra      the same, through G-RA (the bonus counts only when outcome >= tau)
    spa             SPA: learned per-step contributions + grounding bonus
    spa_gra         SPA gated by G-RA

Every arm starts from the same weights (optionally an SFT warm start, trained once and cached),
plays the same tasks with the same seeds for the same number of iterations, and logs each
iteration's rollout metrics plus what the reward transforms did (``reward/...``). Outputs in
``--out``: ``<arm>/metrics.jsonl``, ``ablation.json``, ``ablation.md`` (the table) and
``ablation.png`` (training success and episode length over iterations).

Seed claims under test: G-RA prevents the degradation that ungated shaping causes; SPA beats
outcome-only on sparse tasks.

    python scripts/reward_ablation.py --model default --env turngym/Maze-v0 --iterations 6
    python scripts/reward_ablation.py --model tiny --env tests/Guess-v0 --iterations 2   # smoke test
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from turngym.rewards import reward_stats
from turngym.trainers.archer import ArcherConfig, ArcherTrainer
from turngym.trainers.logger import MetricsLogger
from turngym.trainers.pg import PGConfig, PGTrainer
from turngym.trainers.checkpoint import load_weights

ARMS = ("outcome", "shaped_ungated", "shaped_gra", "spa", "spa_gra")


def arm_reward(arm: str, args) -> list:
    """The reward spec of one arm (what ``OnlineConfig.reward`` holds)."""
    shaped = {"name": "shaped", "shaping": args.shaping, "bonus": args.bonus}
    spa = {"name": "spa", "bonus": args.spa_bonus, "updates": args.spa_updates, "encoder": args.spa_encoder,
           "seed": args.seed}
    gated = {"name": "gated", "tau": args.tau, "high": "outcome"}
    return {
        "outcome": ["outcome"],
        "shaped_ungated": [{**gated, "mode": "direct", "step": [shaped]}],
        "shaped_gra": [{**gated, "mode": "gated", "step": [shaped]}],
        "spa": [spa],
        "spa_gra": [{**gated, "mode": "gated", "step": [spa]}],
    }[arm]


def load_start_policy(args, out: Path):
    """The starting policy of every arm: the model, then the cached SFT warm start if asked."""
    if args.model == "tiny":  # the unit tests' 2-layer random Llama, for end-to-end smoke runs
        from transformers import LlamaConfig, LlamaForCausalLM

        from turngym.agents.default_model import load_default_tokenizer
        from turngym.agents.hf import HFPolicy

        tok = load_default_tokenizer()
        cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                          bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        torch.manual_seed(args.seed)
        policy = HFPolicy(LlamaForCausalLM(cfg).float().eval(), tok)
    else:
        from turngym.train import load_policy

        policy = load_policy(args.model)
    if args.sft_episodes:
        from turngym.trainers.sft import SFTConfig, sft

        weights = out / "sft_model.pt"
        if weights.exists():
            policy.model.load_state_dict(load_weights(weights))
        else:
            sft(policy, args.env, SFTConfig(episodes=args.sft_episodes, epochs=args.sft_epochs, seed=args.seed),
                env_kwargs=train_kwargs(args), progress=False)
            torch.save(policy.model.state_dict(), weights)
    policy.invalidate_caches()
    return policy


def train_kwargs(args) -> dict:
    return {**args.env_kwargs, **({"split": args.split} if args.split else {})}


def make_trainer(arm: str, policy, args, out: Path):
    common = dict(iterations=args.iterations, episodes_per_iter=args.episodes_per_iter, num_envs=args.episodes_per_iter,
                  max_turns=args.max_turns, max_new_tokens=args.max_new_tokens, trainable=args.trainable,
                  actor_lr=args.actor_lr, seed=args.seed, checkpoint_every=0, reward=arm_reward(arm, args))
    env_kwargs = train_kwargs(args)
    if args.algo == "archer":
        cfg = ArcherConfig(critic_epochs=args.critic_updates, warmup_iters=args.critic_warmup, **common)
        return ArcherTrainer(policy, args.env, cfg, env_kwargs=env_kwargs, out_dir=out / arm)
    cfg = PGConfig(algo=args.algo, group_size=args.group_size, minibatch_size=args.minibatch_size, **common)
    return PGTrainer(policy, args.env, cfg, env_kwargs=env_kwargs, out_dir=out / arm)


def run_arm(arm: str, args, out: Path) -> dict:
    t0 = time.perf_counter()
    policy = load_start_policy(args, out)
    trainer = make_trainer(arm, policy, args, out)
    trainer.setup()
    logger = MetricsLogger(out / arm)
    rows = []
    while trainer.iteration < args.iterations:
        m = trainer.step()
        m.update(reward_stats(trainer.reward_fn))
        logger.log(m, step=trainer.iteration)
        rows.append(m)
        print(f"{arm:15s} it {trainer.iteration:2d} steps {trainer.env_steps:5d} success {m['rollout/success']:.2f} "
              f"turns {m['rollout/turns']:.1f} invalid {m['rollout/invalid_rate']:.2f}", flush=True)
    logger.close()
    result = {"arm": arm, "reward": arm_reward(arm, args), "iterations": trainer.iteration,
              "env_steps": trainer.env_steps, "wall_s": time.perf_counter() - t0, "rows": rows}
    if args.eval_episodes:
        from turngym.train import EvalConfig, TrainConfig, evaluate_policy

        ecfg = TrainConfig(env_id=args.env, model=args.model, env_kwargs=args.env_kwargs, output_dir=str(out / arm),
                           seed=args.seed, eval=EvalConfig(episodes=args.eval_episodes, num_envs=args.eval_episodes,
                                                           max_new_tokens=args.max_new_tokens))
        result["held_out_success"] = evaluate_policy(policy, ecfg, "final")["success"]
    return result


def summarize(result: dict, window: int) -> dict:
    rows = result["rows"]
    succ = [r["rollout/success"] for r in rows]
    turns = [r["rollout/turns"] for r in rows]
    w = max(1, min(window, len(rows)))
    return {
        "arm": result["arm"], "iterations": result["iterations"], "env_steps": result["env_steps"],
        "success_first": sum(succ[:w]) / w, "success_last": sum(succ[-w:]) / w, "success_mean": sum(succ) / len(succ),
        "turns_first": sum(turns[:w]) / w, "turns_last": sum(turns[-w:]) / w,
        "step_on_failed_last": sum(r.get("reward/gra_step_on_failed_mean", 0.0) for r in rows[-w:]) / w,
        "held_out_success": result.get("held_out_success"), "wall_s": result["wall_s"],
    }


def write_table(summaries: list[dict], args, path: Path) -> str:
    w = args.window
    head = (f"| arm | episodes | env steps | success first {w} it | success last {w} it | mean success | "
            f"turns/ep first -> last | step reward kept on failed eps (last {w}) | held-out | wall s |")
    lines = [head, "|" + "---|" * 10]
    for s in summaries:
        held = "-" if s["held_out_success"] is None else f"{s['held_out_success']:.2f}"
        lines.append(f"| {s['arm']} | {s['iterations'] * args.episodes_per_iter} | {s['env_steps']} | "
                     f"{s['success_first']:.2f} | {s['success_last']:.2f} | {s['success_mean']:.2f} | "
                     f"{s['turns_first']:.1f} -> {s['turns_last']:.1f} | {s['step_on_failed_last']:.3f} | {held} | "
                     f"{s['wall_s']:.0f} |")
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text


def plot(results: list[dict], path: Path, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for r in results:
        its = list(range(1, len(r["rows"]) + 1))
        ax1.plot(its, [x["rollout/success"] for x in r["rows"]], marker="o", label=r["arm"])
        ax2.plot(its, [x["rollout/turns"] for x in r["rows"]], marker="o", label=r["arm"])
    ax1.set(xlabel="iteration", ylabel="training success (outcome)", title=f"{args.env}, {args.algo}")
    ax2.set(xlabel="iteration", ylabel="turns per episode", title="episode length (shaping pays per turn)")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    ax1.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="turngym/Maze-v0")
    ap.add_argument("--env-kwargs", type=json.loads, default={"sizes": ["small"]}, help="JSON constructor overrides")
    ap.add_argument("--split", default="train", help="training split ('' for envs without splits, e.g. tests/Guess-v0)")
    ap.add_argument("--model", default="default", help="default | hf:PATH | tiny (random 2-layer test model)")
    ap.add_argument("--algo", default="grpo", help="archer | grpo | gigpo | rloo | reinforce")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--iterations", type=int, default=6, help="the budget: iterations per arm")
    ap.add_argument("--episodes-per-iter", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-turns", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--minibatch-size", type=int, default=4)
    ap.add_argument("--trainable", default="top:8")
    ap.add_argument("--actor-lr", type=float, default=2e-5)
    ap.add_argument("--critic-updates", type=int, default=20, help="archer: TD steps per iteration (critic_epochs)")
    ap.add_argument("--critic-warmup", type=int, default=1, help="archer: iterations of critic alone (warmup_iters)")
    ap.add_argument("--shaping", default="valid_call", help="valid_call | new_observation | new_state")
    ap.add_argument("--bonus", type=float, default=0.2, help="the gameable step bonus")
    ap.add_argument("--tau", type=float, default=1.0, help="G-RA threshold on the outcome")
    ap.add_argument("--spa-bonus", type=float, default=0.05, help="SPA grounding bonus")
    ap.add_argument("--spa-updates", type=int, default=50)
    ap.add_argument("--spa-encoder", default="hash")
    ap.add_argument("--sft-episodes", type=int, default=0, help="SFT warm start on this many expert episodes (0: none)")
    ap.add_argument("--sft-epochs", type=int, default=1)
    ap.add_argument("--eval-episodes", type=int, default=0, help="held-out greedy episodes per arm at the end (0: none)")
    ap.add_argument("--window", type=int, default=2, help="iterations averaged for first/last success")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/reward_ablation")
    args = ap.parse_args()
    unknown = set(args.arms.split(",")) - set(ARMS)
    if unknown:
        ap.error(f"unknown arms {sorted(unknown)}; choose from {ARMS}")
    return args


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.env.startswith("tests/"):  # the test-suite toy envs register from tests/toy_envs.py
        import sys

        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        import toy_envs  # noqa: F401
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "args.json").write_text(json.dumps(vars(args), indent=2))
    results = [run_arm(arm, args, out) for arm in args.arms.split(",")]
    summaries = [summarize(r, args.window) for r in results]
    (out / "ablation.json").write_text(json.dumps({"args": vars(args), "summary": summaries,
                                                   "curves": {r["arm"]: r["rows"] for r in results}}, indent=2))
    print(write_table(summaries, args, out / "ablation.md"))
    plot(results, out / "ablation.png", args)


if __name__ == "__main__":
    main()
