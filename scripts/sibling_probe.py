"""Which critic ranks a tree's sibling replies out of sample? An offline probe.

Collects one ArCHer tree from a policy's weights (the trainer's own collection: greedy roots on the
training tasks, then branch search; ``--set archer.branch_wins=true`` also branches the won roots),
computes every turn's features as the trainer does, and saves them (``--dump``). Then, for several
random splits of the tasks in two halves, each scorer is fitted on one half's turns and ranks the
other half's sibling pairs (two replies at one state whose episodes earned differently), as the
trainer's ``critic/sibling_auc_xfit`` does. It prints the AUC over all pairs, at the forks of
episodes that lost (where the policy's own reply lost) and at those that won, each with a bootstrap
interval over states:

- ``own_reply``: the policy's own reply first (no fitting: what trusting the policy gives);
- ``expert``: the env oracle's move first (TextWorld's ``expert_match``; a reference, not a critic);
- ``td``: the trainer's critic (TD from the turns, clipped double Q, V on the policy's reply), Q - V;
- ``mc``: Q(s, a) regressed on the return after the turn (no bootstrapping);
- ``pair``: ``mc`` plus a pairwise loss on the training half's sibling pairs.

    python scripts/sibling_probe.py --weights runs/x/seed0/sft/sft_model.pt --dump tree.pt \\
        --set archer.max_state_visits=3 archer.branch_wins=true archer.branch_width=4 archer.branch_depth=1
    python scripts/sibling_probe.py --dump tree.pt --splits 3      # refit on a saved tree
    python scripts/sibling_probe.py --dump runs/x/seed0/arm/hierarchy/tree0.pt --shares 0.25,0.5,1.0

A tree the trainer wrote (``archer.dump_trees``, ``hierarchy.dump_tree``) holds the candidates a critic
that acts is offered at each state; for it the probe also prints what acting with each scorer would
earn there, out of sample, for the prior weights the hierarchy stage reports (``acting_gain``).
``--shares`` fits each scorer on a share of the training half's tasks too: how its ranking grows with data.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
from pathlib import Path

import torch
import torch.nn.functional as F

from turngym.trainers import functional as Fn
from turngym.trainers.hierarchy import ACTING_PRIORS, acting_gain, acting_headroom
from turngym.trainers.archer import (ReplayBuffer, UtteranceCritic, ValueHead, make_target, policy_action_rows,
                                     soft_update, td_loss)

SCORERS = ("td", "mc", "pair")


def collect(config: str, weights: str, sets: list[str], dump: Path) -> dict:
    """One tree from ``weights`` with the trainer's collection, its features and labels, saved to ``dump``."""
    from turngym.config import apply_overrides, load_yaml
    from turngym.envs.registry import resolve_env_id
    from turngym.rollout import Collector
    from turngym.train import TrainConfig, _with_split, load_policy, rl_section
    from turngym.trainers.archer import ArcherTrainer, tree_record

    cfg = apply_overrides(load_yaml(TrainConfig, config), ["algo=archer", *sets])
    cfg = dataclasses.replace(cfg, env_id=resolve_env_id(cfg.env_id))
    torch.manual_seed(cfg.seed)
    policy = load_policy(cfg.model)
    policy.model.load_state_dict(torch.load(weights, map_location="cpu"))
    policy.invalidate_caches()
    rl = rl_section(cfg)[1]
    with Collector(policy, workers=rl.env_workers) as collector:
        trainer = ArcherTrainer(policy, cfg.env_id, rl, env_kwargs=_with_split(cfg.env_kwargs, cfg.train_split),
                                out_dir=dump.parent / "sibling_probe_scratch", collector=collector)
        trainer.setup()
        tree, metrics = trainer._collect_tree()
        data = {**tree_record(tree, trainer.reward_fn(tree.episodes), trainer._encode(tree.episodes)), "metrics": metrics}
    torch.save(data, dump)
    return data


def task_share(tasks: set[str], share: float, salt: int) -> set[str]:
    """The tasks whose hash (salted) falls in the lowest ``share`` of its range: smaller shares are
    subsets of larger ones, so a learning curve over shares adds tasks and never swaps them."""
    rank = lambda t: int(hashlib.sha256(f"share{salt}:{t}".encode()).hexdigest()[:8], 16) / 16**8
    return {t for t in tasks if rank(t) < share}


def with_task_features(data: dict) -> dict:
    """The tree with each turn's features extended by phi(s_0) of its episode's first turn (the
    task as first shown: the goal, the recipe's place), which a critic reading the last token of a
    long conversation may have lost."""
    info = data["info"]
    row = {(x["ep"], x["turn"]): i for i, x in enumerate(info)}
    parent = {x["ep"]: x["parent"] for x in info}
    root = lambda e: e if parent.get(e, -1) < 0 else root(parent[e])
    first = torch.tensor([row[(root(x["ep"]), 0)] for x in info])
    return {**data, "s": torch.cat([data["s"], data["s"][first]], 1), "sa": torch.cat([data["sa"], data["s"][first]], 1)}


class Probe:
    """The saved tree, its sibling pairs and the cross-fitted scorers."""

    def __init__(self, data: dict, steps: int = 3000, lr: float = 3e-4, gamma: float = 0.95,
                 without_won_branches: bool = False) -> None:
        self.d, self.steps, self.lr, self.gamma = data, steps, lr, gamma
        info, values = data["info"], data["values"]
        if without_won_branches:  # the tree a search from the lost roots alone would hold: drop the won roots' branches
            parent = {x["ep"]: x["parent"] for x in info}
            won = {x["ep"] for x in info if x["success"]}
            root = lambda e: e if parent[e] < 0 else root(parent[e])
            keep = {e for e in parent if parent[e] < 0 or root(e) not in won}
            data = {**data, "own": [i for i in data["own"] if info[i]["ep"] in keep],
                    "siblings": [g for g in data["siblings"] if all(info[i]["ep"] in keep for i in g)]}
            self.d = data
        row = {(x["ep"], x["turn"]): i for i, x in enumerate(info)}
        self.next = torch.tensor([row.get((x["ep"], x["turn"] + 1), i) for i, x in enumerate(info)])
        episodes = {x["ep"]: x for x in info}  # V's action: the trainer's policy_action
        self.v_action = policy_action_rows([(x["ep"], x["turn"]) for x in info],
                                           {e: x["parent"] for e, x in episodes.items()},
                                           {e: x["branch_turn"] for e, x in episodes.items()})
        self.groups = [g for g in data["siblings"] if float(values[g].max() - values[g].min()) > 1e-6]

    def lost(self, g: list[int]) -> bool:
        return not self.d["info"][g[0]]["success"]  # g[0]: the parent's own turn at that state

    def fit(self, name: str, rows: list[int], groups: list[list[int]]):
        s, sa, values = self.d["s"], self.d["sa"], self.d["values"]
        if name == "td":
            critic = UtteranceCritic(s.shape[1], 256)
            target, opt = make_target(critic), torch.optim.AdamW(critic.parameters(), lr=self.lr)
            buffer, i = ReplayBuffer(len(rows), s.shape[1], v_action=True), torch.tensor(rows)
            buffer.add(s[i], sa[i], self.d["r"][i], self.d["done"][i], s[self.next[i]], v_sa=sa[self.v_action[i]])
            for _ in range(self.steps):
                loss, _ = td_loss(critic, target, buffer.sample(64), self.gamma, "v_sa")
                opt.zero_grad()
                loss.backward()
                opt.step()
                soft_update(target, critic, 0.05)
            return lambda j: Fn.double_q_min(*critic.q_values(s[j], sa[j])) - critic.value(s[j])
        x = torch.cat([s, sa], 1)
        head, gen = ValueHead(x.shape[1], 256, 1), torch.Generator().manual_seed(0)
        opt, i = torch.optim.AdamW(head.parameters(), lr=self.lr), torch.tensor(rows)
        pairs = torch.tensor([(a, b) for g in groups for a, b in itertools.permutations(g, 2) if values[a] > values[b] + 1e-6])
        for _ in range(self.steps):
            b = i[torch.randint(0, len(i), (64,), generator=gen)]
            loss = F.mse_loss(head(x[b]), values[b])
            if name == "pair" and len(pairs):
                p = pairs[torch.randint(0, len(pairs), (32,), generator=gen)]
                loss = loss + F.softplus(head(x[p[:, 1]]) - head(x[p[:, 0]])).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        return lambda j: head(x[j])

    def crossfit(self, name: str, split: int, share: float = 1.0) -> torch.Tensor:
        """Every turn's score from a scorer fitted without its task (two halves, split ``split``), on
        the other half's turns, or on a ``share`` of that half's tasks (how the ranking grows with data)."""
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share}")
        info, scores = self.d["info"], torch.zeros(len(self.d["info"]))
        half = lambda i: int(hashlib.sha256(f"{split}:{info[i]['task']}".encode()).hexdigest()[:8], 16) % 2
        tasks = task_share({x["task"] for x in info}, share, split)
        kept = lambda i: info[i]["task"] in tasks
        for f in (0, 1):
            test = torch.tensor([i for i in range(len(info)) if half(i) == f], dtype=torch.long)
            if not len(test):
                continue
            torch.manual_seed(split)
            score = self.fit(name, [i for i in self.d["own"] if half(i) != f and kept(i)],
                             [g for g in self.groups if half(g[0]) != f and kept(g[0])])
            with torch.no_grad():
                scores[test] = score(test)
        return scores

    def acting(self, scores: torch.Tensor, priors=ACTING_PRIORS) -> str:
        """What acting with these out-of-sample scores would earn at the tree's offered states
        (``trainers.hierarchy.acting_gain``: the policy's reply or a runner-up, by score + prior x log pi)."""
        if "offered" not in self.d:
            return ""
        groups, values = self.d["offered"], self.d["values"].tolist()
        logp = [x.get("logprob", 0.0) for x in self.d["info"]]
        parts = []
        for p in priors:
            g = acting_gain(scores.tolist(), values, logp, groups, p)
            parts.append(f"prior {p}: {100 * g['gain']:+.1f} ({g['better']:.0f} better, {g['worse']:.0f} worse)")
        best = acting_headroom(values, groups)
        return f"{'':10s} acting at {len(groups)} states: " + "; ".join(parts) + f"; at most {100 * best['gain']:+.1f}"

    def report(self, name: str, scores: torch.Tensor) -> str:
        parts = []
        for label, gs in (("all", self.groups), ("lost", [g for g in self.groups if self.lost(g)]),
                          ("won", [g for g in self.groups if not self.lost(g)])):
            auc, n = Fn.sibling_auc(scores, self.d["values"], gs)
            lo, hi = Fn.sibling_auc_interval(scores, self.d["values"], gs) if n else (float("nan"),) * 2
            parts.append(f"{label} {auc:.3f} [{lo:.2f}, {hi:.2f}] ({n} pairs)")
        return f"{name:10s} " + " | ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Cross-fitted sibling AUC of critic variants on one saved tree.")
    ap.add_argument("--dump", type=Path, required=True, help="the saved tree: written when --weights is given, else read")
    ap.add_argument("--weights", help="policy weights to collect the tree with (e.g. a protocol seed's sft_model.pt)")
    ap.add_argument("--config", default="configs/reward_ablation_tree.yaml")
    ap.add_argument("--set", nargs="*", default=[], help="config overrides, as for turngym train")
    ap.add_argument("--splits", type=int, default=3, help="random task splits; the scores are averaged over them")
    ap.add_argument("--scorers", default=",".join(SCORERS))
    ap.add_argument("--shares", default="1.0", help="comma-separated shares of the training half's tasks to fit on "
                                                      "(e.g. 0.25,0.5,1.0: how the ranking grows with data)")
    ap.add_argument("--task-features", action="store_true",
                    help="extend every turn's features by those of its episode's first state (the task as first shown)")
    ap.add_argument("--without-won-branches", action="store_true",
                    help="drop the won roots' branches (from a tree collected with branch_wins): what they add")
    args = ap.parse_args(argv)
    data = collect(args.config, args.weights, args.set, args.dump) if args.weights else torch.load(args.dump, weights_only=False)
    if args.task_features:
        data = with_task_features(data)
    probe = Probe(data, without_won_branches=args.without_won_branches)
    data = probe.d
    print(f"{len(data['info'])} turns, {len(probe.groups)} states whose siblings earned differently "
          f"({sum(probe.lost(g) for g in probe.groups)} at lost episodes' forks)")
    own = torch.zeros(len(data["info"]))
    own[[g[0] for g in probe.groups]] = 1.0
    print(probe.report("own_reply", own))
    print(probe.report("expert", torch.tensor([float(bool(x["expert"])) for x in data["info"]])))
    for name in args.scorers.split(","):
        for share in (float(x) for x in args.shares.split(",")):
            runs = [probe.crossfit(name, k, share) for k in range(args.splits)]
            each = " ".join(f"{Fn.sibling_auc(x, data['values'], probe.groups)[0]:.3f}" for x in runs)
            label = name if share == 1.0 else f"{name}@{share:g}"
            print(probe.report(label, torch.stack(runs).mean(0)) + f"   (each split: {each})", flush=True)
            if share == 1.0 and "offered" in data:
                print(probe.acting(torch.stack(runs).mean(0)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
