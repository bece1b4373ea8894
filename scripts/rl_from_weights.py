"""Diagnostics behind docs/experiments.md (2026-11-24, 2026-11-25): one RL run from given SFT weights
for a time budget, then one greedy pass over 128 held-out TextWorld-easy games (the same list as
``turngym train`` and ``turngym protocol``). Not a learning claim: one seed, no CI here (compare
the saved ``eval_final.json`` with the SFT run's evaluation, paired, as the docs do).

    python scripts/rl_from_weights.py runs/p8/seed0/sft/sft_model.pt runs/rl_fbc \\
        algo=filtered_bc task_sampling=greedy_failed actor_lr=1e-4
    python scripts/rl_from_weights.py runs/p8/seed0/sft/sft_model.pt runs/rl_branch algo=branch_bc actor_epochs=8

KEY=VALUE pairs override fields of the quickstart's config section for that algo (``pg``, or
``branch`` for branch_bc, ``archer`` for archer; ``turngym train --show-config``).
"""

from __future__ import annotations

import sys
import time


from turngym.agents.base import SamplingParams
from turngym.bench.evaluate import evaluate
from turngym.config import apply_overrides
from turngym.rollout import Collector
from turngym.train import TrainConfig, load_policy, rl_section
from turngym.trainers.registry import get_algorithm
from turngym.trainers.checkpoint import load_weights

ENV = "turngym/TextWorld-easy-v0"
SHOW = ("rollout/success", "rollout/invalid_rate", "pg/episodes_trained", "screen/greedy_success",
        "search/solved_tasks", "search/failed_tasks", "memory/tasks", "rollout/seconds", "train_seconds", "env_steps")


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise SystemExit(__doc__)
    weights, out, overrides = argv[0], argv[1], argv[2:]
    algo = next((o.split("=", 1)[1] for o in overrides if o.startswith("algo=")), TrainConfig().algo)
    section, base = rl_section(apply_overrides(TrainConfig(), [f"algo={algo}"]))
    cfg = apply_overrides(base, [o for o in overrides if section == "pg" or not o.startswith("algo=")])
    policy = load_policy("default")
    policy.model.load_state_dict(load_weights(weights))
    policy.invalidate_caches()
    with Collector(policy, workers=cfg.env_workers) as collector:
        trainer = get_algorithm(algo).trainer(policy, ENV, cfg, env_kwargs={"tool_format": "xml", "split": "train"}, out_dir=out,
                                    collector=collector)
        trainer.train(progress=False, resume=False, on_iteration=lambda t, m: print(
            t.iteration, {k.split("/")[-1]: round(m[k], 3) for k in SHOW if k in m}, flush=True))
        t0 = time.perf_counter()
        r = evaluate(ENV, policy, episodes=128, seed=10_000, env_kwargs={"tool_format": "xml", "split": "test"},
                     sampling=SamplingParams(temperature=0.0, max_new_tokens=16, seed=0), num_envs=32,
                     progress=False, distinct=True, collector=collector)
    r.save(f"{out}/eval_final.json")
    print(f"held-out greedy {r.summary['success']:.3f}, invalid {r.summary['invalid_action_rate']:.3f}, "
          f"eval {time.perf_counter() - t0:.0f} s, train {trainer.train_seconds:.0f} s, {trainer.env_steps} env steps")


if __name__ == "__main__":
    main(sys.argv[1:])
