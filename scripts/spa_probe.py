"""Does SPA's progress estimator predict outcomes? An offline probe on tree rollouts.

SPA's per-step reward is the estimator's contribution c_t, trained so that an episode's
contributions add up to its outcome. If that sum does not predict the outcome better than the
base rate, the contributions are noise, and what is left of the reward is the grounding bonus
for valid commands (which a policy can game).

This plays the tree the ArCHer trainer collects in its first round (every training task
greedily, then branches from the failed ones), reads each turn's features from the SFT'd
policy as the trainer does (``encoder: policy``), fits the estimator on the episodes of half the
tasks (``fit_first`` steps, as the trainer does once) and scores both halves:

- the mean squared error of sum_t c_t against the outcome, beside the error of predicting the
  fitting half's success rate for every episode (the base rate);
- the AUC of sum_t c_t for success on the other half (0.5 is chance), beside the AUC of the
  episode's length alone (failed episodes tend to run to the turn limit);
- the AUC of c_t for success among turns at the same index (turns 1-3): whether the credit
  tells a step that leads to a win from one that does not, rather than an early turn from a late one;

for raw and for standardized features under SPA-RL's sum matching, and for the potential fit
(``fit="potential"``: each step's value fitted to its episode's outcome, the credit its rise),
over a few initialisations of the head. Under the potential fit the predicted outcome is the last
step's value (base rate plus the credits).

    python scripts/spa_probe.py --weights runs/reward_tree/seed0/sft/sft_model.pt
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from turngym.rewards.encoders import PolicyEncoder
from turngym.rewards.progress import ProgressReward
from turngym.rollout import EpisodeSpec, env_info
from turngym.rollout.branching import tree_rollout
from turngym.rollout.episode import make_env_factory
from turngym.rollout.schedule import run_seed
from turngym.trainers.functional import auc
from turngym.train import load_policy
from turngym.trainers.checkpoint import load_weights


class CachedFeatures:
    """The policy encoder's features, computed once per episode (every variant reads the same)."""

    def __init__(self, encoder: PolicyEncoder, trajs: list) -> None:
        self.dim = encoder.dim
        self.feats = {id(t): encoder.encode_trajectory(t).float() for t in trajs}

    def encode_trajectory(self, traj) -> torch.Tensor:
        return self.feats[id(traj)]


def same_turn_auc(contribs: list[list[float]], won: list[bool], turns: int = 3) -> float:
    """The AUC of c_t for the episode's success among turns at the same index (the first ``turns``),
    averaged over those indices: progress credit, as opposed to credit for being early or late."""
    aucs = []
    for k in range(turns):
        at = [(c[k], w) for c, w in zip(contribs, won) if len(c) > k]
        value = auc(torch.tensor([c for c, _ in at]), torch.tensor([float(w) for _, w in at]))
        if value == value:  # both outcomes present at this index
            aucs.append(value)
    return sum(aucs) / len(aucs) if aucs else float("nan")


def score(spa: ProgressReward, trajs: list, base_rate: float) -> dict[str, float]:
    contribs = spa.contributions(trajs)
    sums = torch.tensor([spa.predicted_outcome(spa.features(t)) for t in trajs])
    outcomes = torch.tensor([float(t.outcome) for t in trajs])
    return {"mse": float(((sums - outcomes) ** 2).mean()), "base_rate_mse": float(((base_rate - outcomes) ** 2).mean()),
            "auc": auc(sums, (outcomes > 0.5).float()), "same_turn_auc": same_turn_auc(contribs, [o > 0.5 for o in outcomes.tolist()]),
            "mean_sum": float(sums.mean()), "success": float(outcomes.mean())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", required=True, help="the SFT'd policy's state dict (sft_model.pt)")
    ap.add_argument("--env", default="turngym/TextWorld-easy-v0")
    ap.add_argument("--env-kwargs", type=json.loads, default={"tool_format": "xml"})
    ap.add_argument("--tasks", type=int, default=64, help="training tasks screened (the trainer's episodes_per_iter)")
    ap.add_argument("--fit-steps", type=int, default=500, help="the estimator's fit_first")
    ap.add_argument("--head-seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--fits", nargs="+", default=["sum", "potential"], choices=["sum", "potential"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()

    policy = load_policy("default")
    policy.model.load_state_dict(load_weights(args.weights))
    policy.invalidate_caches()
    policy.model.eval()
    kwargs = {**args.env_kwargs, "split": "train"}
    info = env_info(args.env, **kwargs)
    tasks = list(info.task_ids)[: args.tasks]
    specs = [EpisodeSpec(t, run_seed(args.seed, i), greedy=True) for i, t in enumerate(tasks)]
    t0 = time.perf_counter()
    tree = tree_rollout(policy, make_env_factory(args.env, **kwargs), specs, stops=list(info.stop_strings),
                        points=2, width=3, depth=2, max_new_tokens=16, num_envs=len(specs), by="state_key")
    trajs = [t for t in tree.episodes if t.turns]
    print(f"tree: {len(tree.roots)} roots, {len(trajs) - len(tree.roots)} branches, "
          f"success {sum(t.success for t in trajs) / len(trajs):.1%}, {time.perf_counter() - t0:.0f} s", flush=True)
    cache = CachedFeatures(PolicyEncoder(policy.model), trajs)
    every = torch.cat(list(cache.feats.values()))
    spread = every.std(dim=0)
    print(f"features: {len(every)} turns x {every.shape[1]}; per-dimension std median {spread.median():.3g}, "
          f"max {spread.max():.3g}; mean |x| {every.abs().mean():.3g}", flush=True)

    halves = {"fit": [t for t in trajs if tasks.index(t.task_id) % 2 == 0],
              "held_out": [t for t in trajs if tasks.index(t.task_id) % 2 == 1]}
    base_rate = sum(float(t.outcome) for t in halves["fit"]) / len(halves["fit"])
    held = halves["held_out"]
    length_auc = auc(-torch.tensor([float(len(t.turns)) for t in held]), torch.tensor([float(t.outcome > 0.5) for t in held]))
    print(f"held-out AUC of the episode's length alone (shorter = success): {length_auc:.3f}", flush=True)
    results = {"episodes": {k: len(v) for k, v in halves.items()}, "base_rate": base_rate,
               "feature_std_median": float(spread.median()), "feature_std_max": float(spread.max()),
               "feature_abs_mean": float(every.abs().mean()), "length_auc": length_auc, "runs": []}
    for fit, standardize in [(fit, std) for fit in args.fits for std in ((False, True) if fit == "sum" else (True,))]:
        for head_seed in args.head_seeds:
            spa = ProgressReward(encoder=cache, online=False, bonus=0.0, seed=head_seed, standardize=standardize, fit=fit)
            spa.fit(halves["fit"], updates=args.fit_steps)
            # "method", not "fit": the halves' scores are keyed "fit" and "held_out"
            row = {"method": fit, "standardize": standardize, "head_seed": head_seed,
                   **{k: score(spa, v, base_rate) for k, v in halves.items()}}
            results["runs"].append(row)
            f, h = row["fit"], row["held_out"]
            print(f"fit={fit:9} standardize={standardize!s:5} head seed {head_seed}: fit MSE {f['mse']:.3f} (base rate "
                  f"{f['base_rate_mse']:.3f}), held-out MSE {h['mse']:.3f} (base rate {h['base_rate_mse']:.3f}), "
                  f"held-out AUC {h['auc']:.3f}, at the same turn index {h['same_turn_auc']:.3f}", flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
