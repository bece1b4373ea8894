"""ArCHer's plug-ins on the tiny model and the toy env: the search tree (``tree``), the probes and gate
(``sibling_auc``), the actor at forks (``awr``), self-imitation, clones, critic-ranked search and the
oracle-move AUC; their math on numbers worked by hand."""

from __future__ import annotations

import math

import pytest
import torch
from fixtures_model import EveryGuess, NonsenseFirst, build_tiny_model
from torch.testing import assert_close

from turngym.rollout.branching import Tree, is_no_op, keep_top
from turngym.rollout.schedule import screen_order
from turngym.trainers.archer import ArcherConfig, ArcherTrainer
from turngym.trainers.archer.awr import sibling_awr_weights, sibling_margins
from turngym.trainers.archer.critic_rank import reply_scores
from turngym.trainers.archer.expert_auc import auc
from turngym.trainers.archer.self_imitation import self_imitation_weights
from turngym.trainers.archer.sibling_auc import heldout_tasks, sibling_auc, sibling_auc_interval
from turngym.types import Trajectory, Turn

ENV = "tests/Guess-v0"


def t(x):
    return torch.tensor(x, dtype=torch.float32)


# ----- the math, by hand ------------------------------------------------------------------------
def test_sibling_auc_and_its_interval_by_hand():
    scores, values = t([0.9, 0.1, 0.5, 0.5, 0.2]), t([1.0, 0.0, 1.0, 0.0, 0.0])
    # group 0: (0 beats 1) right; group 1: 2 and 3 tie on score (1/2), 2 vs 4 right: (1 + 0.5 + 1) / 3
    auc_value, pairs = sibling_auc(scores, values, [[0, 1], [2, 3, 4]])
    assert pairs == 3 and auc_value == pytest.approx(2.5 / 3)
    low, high = sibling_auc_interval(scores, values, [[0, 1], [2, 3, 4]])
    assert low <= auc_value <= high
    assert math.isnan(sibling_auc(scores, t([1.0] * 5), [[0, 1]])[0])  # no pair earned differently


def test_awr_weights_margins_self_imitation_and_auc_by_hand():
    logp, adv = t([0.0, 0.0, math.log(3.0), 0.0]), t([0.0, 0.1, 0.0, 0.0])
    w = sibling_awr_weights(logp, adv, [[0, 1], [2, 3]], beta=0.1)
    e = math.e
    assert_close(w, t([1 / (1 + e), e / (1 + e), 0.75, 0.25]))
    margins = sibling_margins(t([-1.0, -0.2, -3.0]), t([0.5, 0.1, 0.4]), [[0, 1, 2]])
    assert margins[0] == pytest.approx(0.4)  # own = row 1 (highest log-prob): max(0.5, 0.4) - 0.1
    assert sibling_margins(t([-1.0, -0.2]), t([0.5, 0.1]), [[0, 1]], torch.tensor([False, True]))[0] == -math.inf
    assert_close(self_imitation_weights(t([1.0, 1.0, 0.0]), t([0.25, 1.1, 0.3]), 2.0), t([1.5, 0.0, 0.0]))
    assert auc(t([0.9, 0.1, 0.5]), t([1.0, 0.0, float("nan")])) == 1.0
    assert reply_scores([1.0, 2.0], [[-1.0, -3.0], [0.0]], prior=0.5) == [-1.0, 2.0]


def test_held_out_tasks_are_independent_of_the_screen_order():
    tasks = [f"q-{i:03d}" for i in range(522)]
    held = heldout_tasks(tasks, 0.125, seed=0)
    assert 40 < len(held) < 95 and held == heldout_tasks(tasks, 0.125, seed=0)
    first = set(screen_order(tasks, set(), {}, seed=0, iteration=0, n=64))
    assert len(held & first) < 20  # about 8 expected; a shuffle seeded like the screen's gave all 64
    assert heldout_tasks(tasks, 0.0, seed=0) == set()


# ----- on the tiny model ------------------------------------------------------------------------
def _tree(**kw):
    return {"name": "tree", "points": 1, "width": 8, "depth": 1, "by": "state_key", **kw}


def _cfg(plugins, **kw):
    base = dict(iterations=1, episodes_per_iter=4, num_envs=4, max_new_tokens=6, critic_epochs=4, critic_states=8,
                critic_batch_size=8, actor_states=4, warmup_iters=0, critic_encoder="reference", trainable="all",
                actor_lr=1e-3, autocast="none", plugins=plugins)
    return ArcherConfig(**{**base, **kw})


def _trainer(tiny_tokenizer, out, plugins, policy_cls=EveryGuess, **kw):
    policy = policy_cls(build_tiny_model(tiny_tokenizer), tiny_tokenizer, generation_dtype=torch.float32)
    trainer = ArcherTrainer(policy, ENV, _cfg(plugins, **kw), env_kwargs={"tool_format": "text"}, out_dir=out)
    trainer.setup()
    return trainer


def _keep_trees(trainer, monkeypatch) -> dict:
    """Wrap the tree plug-in's collection so a test can read the last tree (``seen["tree"]``)."""
    seen, plug = {}, trainer.plugins.get("tree")
    collect = plug.collect

    def spy(tr):
        seen["tree"], metrics = collect(tr)
        return seen["tree"], metrics

    monkeypatch.setattr(plug, "collect", spy)
    return seen


def test_tree_buffers_each_turn_once_and_awr_trains_at_its_forks(tiny_tokenizer, tmp_path, monkeypatch):
    trainer = _trainer(tiny_tokenizer, tmp_path, [_tree(), {"name": "sibling_auc", "holdout": 0.25, "gate": 0.0},
                                                  {"name": "awr", "min_shift": 0.0, "margin": 0.0, "groups": 8}])
    seen = _keep_trees(trainer, monkeypatch)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    row = trainer.step()
    tree = seen["tree"]
    assert len(tree.episodes) > len(tree.roots) and tree.sibling_groups()
    held = trainer.plugins.get("sibling_auc").heldout_tasks
    kept = [i for i, e in enumerate(tree.episodes) if e.task_id not in held]
    assert len(trainer.buffer) == sum(len(tree.own_turns(i)) for i in kept)  # a branch adds only its own turns
    awr = trainer.plugins.get("awr")
    assert [len(e["turns"]) for e in awr.memory] == [len(g) for g in tree.sibling_groups()]
    assert row["awr/informative_states"] > 0 and math.isfinite(row["actor/pg_loss"]) and row["actor/rows"] > 0
    assert row["critic/sibling_pairs_xfit"] > 0 and 0.0 <= row["critic/sibling_auc_xfit"] <= 1.0
    assert row["critic/sibling_auc_xfit_low"] <= row["critic/sibling_auc_xfit"] <= row["critic/sibling_auc_xfit_high"]
    assert row["critic/sibling_pairs_xfit_lost"] == row["critic/sibling_pairs_xfit"]  # only lost roots branched
    assert row["env_episodes"] == len(tree.episodes)  # every branch is an episode played in the env
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())


def test_a_closed_gate_stops_the_forks_not_self_imitation_or_clones(tiny_tokenizer, tmp_path, monkeypatch):
    trainer = _trainer(tiny_tokenizer, tmp_path, [_tree(), {"name": "sibling_auc", "holdout": 0.5, "gate": 1.0},
                                                  {"name": "awr", "min_shift": 0.0, "margin": 0.0},
                                                  {"name": "self_imitation", "min_weight": 0.01}, "clone_wins"])
    seen = _keep_trees(trainer, monkeypatch)
    row = trainer.step()
    assert row["critic/gate_open"] == 0.0 and "awr/states" not in row  # no critic reaches 1.0
    assert row["sil/turns"] >= 1 and "actor/pg_loss" in row
    won = {}
    for ep, parent in zip(seen["tree"].episodes, seen["tree"].parent):
        if parent >= 0 and ep.success:
            won.setdefault(ep.task_id, []).append(ep)
    best = trainer.plugins.get("clone_wins").best
    assert won and set(best) == set(won) and row["clone/episodes"] == len(won)
    for task, eps in won.items():  # the highest return, then the fewest turns
        top = max(eps, key=lambda e: (e.total_reward, -len(e.turns)))
        assert (best[task].total_reward, len(best[task].turns)) == (top.total_reward, len(top.turns))


def test_self_imitation_weighs_wins_by_what_the_critic_did_not_expect(tiny_tokenizer, tmp_path):
    trainer = _trainer(tiny_tokenizer, tmp_path, [_tree(), {"name": "self_imitation", "min_weight": 0.01}])
    trainer.step()
    sil = trainer.plugins.get("self_imitation")
    assert sil.wins and all(e["value"] > 0 and len(e["turn"].turns) == 1 for e in sil.wins)
    v = trainer.critic.value(torch.cat([e["s"] for e in sil.wins])).tolist()
    for e, value in zip(sil.wins, v):  # a win the critic already expects (V >= R) is not cloned
        e["value"] = value
    assert sil.actor_rows(trainer, {}) == ([], [])
    zero = _trainer(tiny_tokenizer, tmp_path / "zero", [_tree(), {"name": "self_imitation", "baseline": "zero",
                                                                  "weight": 2.0, "min_weight": 0.01}])
    zero.step()
    wins = zero.plugins.get("self_imitation").wins
    rows, weights = zero.plugins.get("self_imitation").actor_rows(zero, {})
    assert sorted(weights) == pytest.approx(sorted(2.0 * e["value"] for e in wins))  # V = 0: weight 2 R
    assert sum(len(r.turns) for r in rows) == len(wins)  # an episode's turns share a row


def test_no_op_leaves_train_the_critic_as_dead_ends_and_never_pair(tiny_tokenizer, tmp_path, monkeypatch):
    def run(out, no_ops):
        trainer = _trainer(tiny_tokenizer, out, [_tree(width=3, no_ops=no_ops)], policy_cls=NonsenseFirst)
        seen = _keep_trees(trainer, monkeypatch)
        return trainer, trainer.step(), seen["tree"]

    plain, row0, _ = run(tmp_path / "plain", False)
    trainer, row, tree = run(tmp_path / "kept", True)
    leaves = [i for i, e in enumerate(tree.episodes) if is_no_op(e)]
    assert row0["search/no_op_leaves"] == 0 and row["search/no_op_leaves"] == len(leaves) > 0
    assert row["search/branches"] == row0["search/branches"]
    assert len(trainer.buffer) == len(plain.buffer) + len(leaves)  # one turn a leaf
    assert len(trainer.plugins.get("tree").siblings) == len(plain.plugins.get("tree").siblings)
    done = trainer.buffer.data["done"][: len(trainer.buffer)]
    assert int(done.sum()) == int(plain.buffer.data["done"][: len(plain.buffer)].sum()) + len(leaves)


def test_critic_ranked_search_plays_the_replies_the_critic_rates_highest(tiny_tokenizer, tmp_path, monkeypatch):
    trainer = _trainer(tiny_tokenizer, tmp_path, [_tree(width=2), {"name": "critic_rank", "pool": 8}], iterations=2)
    seen = _keep_trees(trainer, monkeypatch)
    plug, calls = trainer.plugins.get("critic_rank"), []
    ranker = plug.ranker

    def spy(tr):
        out = ranker(tr)
        if out is not None:
            rank = out["rank"]

            def ranked(points, replies):
                scores = rank(points, replies)
                (traj, j), us = points[0], replies[0]  # a score is min(Q1, Q2) under the critic as it stands
                assert scores[0][0] == pytest.approx(tr.reply_values(traj.prompt_ids(j), [us[0].action_ids])[0], abs=1e-5)
                calls.append((points, replies, scores))
                return scores

            out["rank"] = ranked
        return out

    trainer.plugins.get("tree").rank = spy
    first = trainer.step()
    assert not calls and "search/ranked_points" not in first  # no critic fitted yet: the policy's order
    second = trainer.step()
    assert calls and second["search/ranked_points"] == sum(len(p) for p, _, _ in calls)
    tree = seen["tree"]
    points, replies, scores = calls[0]
    for (traj, j), us, xs in zip(points, replies, scores):  # the two rated highest were played there
        node = next(i for i, e in enumerate(tree.episodes) if e is traj)
        played = {tree.episodes[i].turns[j].action_text for i in range(len(tree.episodes))
                  if tree.parent[i] == node and tree.branch_turn[i] == j}
        assert played == {u.text for u in keep_top(us, xs, 2)}


def test_expert_auc_logs_how_the_critic_ranks_the_oracles_move(policy, tmp_path):
    trainer = ArcherTrainer(policy, ENV, _cfg(["expert_auc"], critic_encoder="top:1", critic_window=8), out_dir=tmp_path)
    trainer.setup()
    assert trainer.env.kwargs["expert_labels"] is True
    row = trainer.step()
    assert 0.0 <= row["critic/expert_rate"] <= 1.0


def test_plugin_state_survives_a_checkpoint(tiny_tokenizer, tmp_path):
    plugins = [_tree(), {"name": "awr", "min_shift": 0.0, "margin": 0.0}, "self_imitation", "clone_wins"]
    trainer = _trainer(tiny_tokenizer, tmp_path / "a", plugins)
    trainer.step()
    state = trainer.plugins.state_dict()
    twin = _trainer(tiny_tokenizer, tmp_path / "b", plugins)
    twin.plugins.load_state_dict(state)
    assert twin.plugins.get("tree").screened == trainer.plugins.get("tree").screened
    assert [e["turns"][0].to_dict() for e in twin.plugins.get("awr").memory] == \
        [e["turns"][0].to_dict() for e in trainer.plugins.get("awr").memory]
    assert {k: v.to_dict() for k, v in twin.plugins.get("clone_wins").best.items()} == \
        {k: v.to_dict() for k, v in trainer.plugins.get("clone_wins").best.items()}


def test_clone_greedy_remembers_the_screens_own_wins(tiny_tokenizer, tmp_path):
    won_root = Trajectory("3", [Turn("3")], outcome=1.0)
    won_branch = Trajectory("5", [Turn("1"), Turn("5")], outcome=1.0)
    tree = Tree([won_root, Trajectory("5", [Turn("1")]), won_branch], [-1, -1, 1], [0, 0, 1])
    for greedy, kept in ((False, {"5"}), (True, {"3", "5"})):
        trainer = _trainer(tiny_tokenizer, tmp_path / str(greedy), [_tree(), {"name": "clone_wins", "greedy": greedy}])
        plug = trainer.plugins.get("clone_wins")
        plug.on_turns(trainer, tree, None, {})
        assert set(plug.best) == kept


def test_expert_replay_joins_a_likelihood_update_and_never_makes_one_alone(tiny_tokenizer, tmp_path):
    alone = _trainer(tiny_tokenizer, tmp_path / "alone", [{"name": "expert_replay", "episodes": 2}])
    assert alone.plugins.update_actor(alone, {}) is None  # the paper's policy gradient runs instead
    joined = _trainer(tiny_tokenizer, tmp_path / "joined", [_tree(), "clone_wins", {"name": "expert_replay", "episodes": 2}])
    experts = joined.plugins.get("expert_replay").experts
    assert experts and all(e.success for e in experts)
    assert joined.plugins.get("expert_replay").actor_rows(joined, {})[1] == [1.0] * sum(len(e.turns) for e in experts)


def test_reply_scores_are_q_of_the_reply_under_the_current_critic(tiny_tokenizer, tmp_path):
    trainer = _trainer(tiny_tokenizer, tmp_path, [_tree()])
    trainer.step()
    prompt = trainer.buffer.prompt(0)
    ids = [trainer.policy.chat.encode("3"), trainer.policy.chat.encode("7")]
    by_prompt = trainer.reply_values(prompt, ids)
    s, sa = trainer.encoder.replies([prompt, prompt], ids)
    q1, q2 = trainer.critic.q_values(s, sa)
    assert by_prompt == pytest.approx(torch.minimum(q1, q2).tolist(), abs=1e-4)  # held keys/values agree with a full pass


def test_critic_probes_by_hand():
    from turngym.trainers.archer.probes import discounted_returns_after, pearson

    rewards = [[0.0, 0.0, 1.0], [0.5]]
    # gamma 0.5: turn 0 of episode 0 earns 0 + 0.5 * 0 + 0.25 * 1 = 0.25; turn 1 0.5; turn 2 1
    assert_close(discounted_returns_after([(0, 0), (0, 1), (0, 2), (1, 0)], rewards, 0.5), t([0.25, 0.5, 1.0, 0.5]))
    assert pearson(t([1.0, 2.0, 3.0]), t([2.0, 4.0, 6.0])) == pytest.approx(1.0)
    assert pearson(t([1.0, 2.0, 3.0]), t([3.0, 2.0, 1.0])) == pytest.approx(-1.0)
    assert math.isnan(pearson(t([1.0, 1.0]), t([1.0, 2.0])))


def test_critic_probes_log_calibration_before_the_critic_trains(policy, tmp_path):
    trainer = ArcherTrainer(policy, ENV, _cfg(["critic_probes"], critic_encoder="top:1", critic_window=8), out_dir=tmp_path)
    trainer.setup()
    row = trainer.step()
    assert "critic/q_mc_mae" in row and row["critic/adv_std"] >= 0.0


def test_best_of_n_imitates_the_reply_the_critic_rates_highest(policy, tmp_path, monkeypatch):
    from turngym.trainers.archer.best_of_n import best_rows

    q = t([[0.1, 0.5, 0.2], [0.3, 0.3, 0.3], [0.9, 0.0, 0.0]])
    assert best_rows(q) == [1, None, 0]  # a state whose replies all score alike has nothing to imitate
    assert best_rows(q, margin=0.25) == [None, None, 0]  # 0.5 - 0.267 = 0.233 is under the margin
    trainer = ArcherTrainer(policy, ENV, _cfg([{"name": "best_of_n", "n": 2}], critic_encoder="top:1", critic_window=8),
                            out_dir=tmp_path)
    trainer.setup()
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.step()  # the buffer fills, the critic trains, then the actor imitates the best of 2
    row = trainer.step()
    assert row["best_of_n/states"] >= trainer.cfg.actor_states and row["actor/rows"] == row["best_of_n/imitated"]
    assert "adv/mean" not in row  # the paper's policy gradient did not run
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())


def test_a_trainable_encoder_is_cross_fitted_and_opens_the_gate(tiny_tokenizer, tmp_path):
    # with a top:K encoder the cross-fit copies the encoder with the heads, so the gate reads the critic
    # the actor uses (it once read 0.0 and kept a trainable critic from ever moving the actor)
    trainer = _trainer(tiny_tokenizer, tmp_path, [_tree(), {"name": "sibling_auc", "holdout": 0.25, "gate": 0.01},
                                                  {"name": "awr", "min_shift": 0.0, "margin": 0.0, "groups": 8}],
                       critic_encoder="top:1", critic_window=8)
    row = trainer.step()
    assert row["critic/sibling_pairs_xfit"] > 0 and 0.0 <= row["critic/sibling_auc_xfit"] <= 1.0
    assert row["critic/gate_open"] == float(row["critic/sibling_auc_xfit"] >= 0.01)
