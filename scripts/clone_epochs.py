"""How many clone epochs branch BC needs: held-out success after each epoch of one fit.

From a finished ``turngym train`` run of branch BC (its own ``config.json``, with ``--set``
overrides), this loads the SFT weights and what the search remembered (``branch_bc/checkpoint``), fits the clones
again as the run did (``BranchBCTrainer.clone``: the same minibatch order, the same optimizer) and,
after each epoch named in ``--eval``, plays the run's 128 held-out games greedily. The last epoch
reproduces the run's own final evaluation. One seed, one fit: a diagnostic for choosing
``branch.actor_epochs`` or a stopping rule, not a learning claim (that is ``turngym protocol``).

    python scripts/clone_epochs.py runs/quickstart --eval 2 4 6 8
    python scripts/clone_epochs.py runs/quickstart --eval 4 --set branch.actor_lr=6e-4

Prints one line per epoch (its fit seconds and held-out success) and writes them,
with every game's outcome, to ``<run>/clone_epochs.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="a finished turngym train output folder (branch_bc)")
    p.add_argument("--eval", type=int, nargs="+", default=[2, 4, 6, 8], help="epochs after which to evaluate")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config overrides (branch.*)")
    p.add_argument("--out", default=None, help="where the evaluations' episodes go (default: <run>/clone_epochs)")
    args = p.parse_args()

    from turngym.config import apply_overrides, from_dict
    from turngym.rollout import Collector
    from turngym.train import TrainConfig, _with_split, evaluate_policy, load_policy
    from turngym.trainers.checkpoint import load_weights
    from turngym.trainers.branch_bc import BranchBCTrainer
    from turngym.types import Trajectory

    run = Path(args.run)
    cfg = from_dict(TrainConfig, json.loads((run / "config.json").read_text()))
    cfg = apply_overrides(cfg, [f"branch.actor_epochs={max(args.eval)}", *args.set])
    out = Path(args.out or run / "clone_epochs")
    cfg = dataclasses.replace(cfg, output_dir=str(out))
    out.mkdir(parents=True, exist_ok=True)

    policy = load_policy(cfg.model)
    policy.model.load_state_dict(load_weights(run / "sft_model.pt"))
    state = torch.load(run / "branch_bc" / "checkpoint" / "state.pt", map_location="cpu", weights_only=False)
    rows: list[dict] = []
    with Collector(policy) as collector:
        trainer = BranchBCTrainer(policy, cfg.env_id, cfg.branch, env_kwargs=_with_split(cfg.env_kwargs, cfg.train_split),
                                  out_dir=out / "branch_bc", collector=collector)
        trainer.setup()
        trainer.memory = {k: Trajectory.from_dict(d) for k, d in state["memory"].items()}
        data = trainer.clone_data()
        print(f"{len(trainer.memory)} remembered episodes + {len(trainer.experts)} demonstrations, "
              f"{cfg.branch.actor_epochs} epochs", flush=True)
        clock = [time.perf_counter()]

        def after(epoch: int) -> None:
            row = {"epoch": epoch, "fit_s": round(time.perf_counter() - clock[0], 1)}
            if epoch in args.eval:
                res = evaluate_policy(policy, cfg, f"epoch{epoch}", collector=collector)
                row.update(success=res["success"], per_game=res["per_episode_success"])
            rows.append(row)
            print({k: v for k, v in row.items() if k != "per_game"}, flush=True)
            clock[0] = time.perf_counter()  # the next epoch's fit starts now

        fit = trainer.clone(data, on_epoch=after)
    print(f"fit: {fit}")
    (run / "clone_epochs.json").write_text(json.dumps({"overrides": args.set, "epochs": rows}, indent=1))


if __name__ == "__main__":
    main()
