"""scripts/sibling_probe.py: the sibling pairs it scores, the won roots' branches it can drop, and a
cross-fitted scorer that finds a reply's worth when the features hold it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

spec = importlib.util.spec_from_file_location("sibling_probe", Path(__file__).parents[1] / "scripts" / "sibling_probe.py")
probe_mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe_mod)


def _tree(tasks: int = 8, dim: int = 4) -> dict:
    """Per task a 2-turn root and one branch that leaves it at turn 1 (turn 0 replayed). Even tasks'
    roots win and their branch loses; odd tasks the other way round. Feature 0 of phi(s, a) says
    whether the episode it is in wins."""
    gen = torch.Generator().manual_seed(0)
    info, values, sa_win = [], [], []
    for k in range(tasks):
        root_wins = k % 2 == 0
        for ep, parent, won in ((2 * k, -1, root_wins), (2 * k + 1, 2 * k, not root_wins)):
            for turn in (0, 1):
                info.append({"task": f"t{k}", "ep": ep, "turn": turn, "parent": parent, "branch_turn": 1 if parent >= 0 else 0,
                             "expert": turn == 1 and won, "success": won})
                values.append(1.0 if won else 0.0)
                sa_win.append(1.0 if won else 0.0)
    n = len(info)
    sa = torch.randn(n, dim, generator=gen)
    sa[:, 0] = 3 * torch.tensor(sa_win)
    row = {(x["ep"], x["turn"]): i for i, x in enumerate(info)}
    state = torch.randn(tasks, 2, dim, generator=gen)  # siblings share their state: a branch replays its root up to its fork
    s = torch.stack([state[int(x["task"][1:]), x["turn"]] for x in info])
    return {"s": s, "sa": sa, "r": torch.tensor(values) * torch.tensor([float(x["turn"] == 1) for x in info]),
            "done": torch.tensor([float(x["turn"] == 1) for x in info]), "values": torch.tensor(values), "info": info,
            "own": [i for i, x in enumerate(info) if x["turn"] >= x["branch_turn"]],
            "siblings": [[row[(2 * k, 1)], row[(2 * k + 1, 1)]] for k in range(tasks)]}


def test_the_probe_keeps_pairs_that_earned_differently_and_can_drop_the_won_roots_branches():
    data = _tree()
    probe = probe_mod.Probe(data)
    assert len(probe.groups) == 8 and sum(probe.lost(g) for g in probe.groups) == 4
    # the policy's own reply (g[0]) won exactly at the won roots: AUC 1 there, 0 at the lost ones
    own = torch.zeros(len(data["info"]))
    own[[g[0] for g in probe.groups]] = 1.0
    assert "all 0.500" in probe.report("own", own) and "lost 0.000" in probe.report("own", own)
    lost_only = probe_mod.Probe(data, without_won_branches=True)
    assert len(lost_only.groups) == 4 and all(lost_only.lost(g) for g in lost_only.groups)
    won_roots = {x["ep"] for x in data["info"] if x["parent"] < 0 and x["success"]}
    assert not any(data["info"][i]["parent"] in won_roots for i in lost_only.d["own"])


def test_a_cross_fitted_scorer_ranks_the_winning_reply_first_when_the_features_say_so():
    probe = probe_mod.Probe(_tree(tasks=24), steps=300, lr=1e-2)
    for name in ("mc", "pair", "td"):
        scores = probe.crossfit(name, split=0)
        auc, pairs = probe_mod.Fn.sibling_auc(scores, probe.d["values"], probe.groups)
        assert pairs == 24 and auc >= 0.9, name  # chance is 0.5


def test_acting_and_fits_on_a_share_of_the_tasks():
    data = _tree(tasks=24)
    data["offered"] = data["siblings"]
    for x in data["info"]:
        x["logprob"] = 0.0 if x["parent"] < 0 else -2.0
    probe = probe_mod.Probe(data, steps=300, lr=1e-2)
    # a perfect scorer (the winning sibling's feature) gains at the lost roots' forks, where a runner-up won
    line = probe.acting(data["sa"][:, 0].clone(), priors=(0.0,))
    assert "prior 0.0: +50.0 (12 better, 0 worse)" in line and "at most +50.0" in line
    # a share of the tasks: about that many, the smaller share inside the larger, and a fit on it runs
    tasks = {f"t{k}" for k in range(400)}
    quarter, half = probe_mod.task_share(tasks, 0.25, 0), probe_mod.task_share(tasks, 0.5, 0)
    assert quarter < half < tasks and 60 < len(quarter) < 140 and 150 < len(half) < 250
    assert probe_mod.task_share(tasks, 1.0, 3) == tasks
    assert torch.isfinite(probe.crossfit("mc", split=0, share=0.5)).all()


def test_task_features_come_from_each_episodes_first_state():
    data = _tree(tasks=3)
    out = probe_mod.with_task_features(data)
    dim = data["s"].shape[1]
    row = {(x["ep"], x["turn"]): i for i, x in enumerate(data["info"])}
    for i, x in enumerate(data["info"]):  # a branch's first state is its root's (the replayed turn 0)
        root = x["ep"] if x["parent"] < 0 else x["parent"]
        torch.testing.assert_close(out["s"][i, dim:], data["s"][row[(root, 0)]])
        torch.testing.assert_close(out["sa"][i, :dim], data["sa"][i])
