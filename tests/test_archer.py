"""ArCHer's wiring, checked on numbers worked by hand: the replay transitions a packed batch gives
(reward, done, next state), the replay buffer, the critic's windows, and the TD loss the trainer and
the probe script run; then, on the tiny model, when the advantages are computed, the fresh-action V
target, the oracle-move AUC, and the critic's own top blocks (critic_encoder=top:K)."""

from __future__ import annotations

import copy
import math
import time
from types import SimpleNamespace

import pytest
import torch
from fixtures_model import build_tiny_model
from torch.testing import assert_close

import turngym
from turngym.trainers import archer
from turngym.trainers import functional as Fn
from turngym.trainers.actor import frozen_copy, reference_pass
from turngym.trainers.archer import (ArcherConfig, ArcherTrainer, ReplayBuffer, UtteranceCritic, make_target,
                                     policy_action_rows, td_loss)
from turngym.rollout.branching import keep_top
from turngym.trainers.critic_encoder import TrunkTopEncoder
from turngym.trainers.sequences import pack_batch
from turngym.types import TokenRecord, Trajectory, Turn, Utterance

ENV = "tests/Guess-v0"


def t(x):
    return torch.tensor(x, dtype=torch.float32)


def test_transitions_chain_turns_of_one_episode_and_end_at_its_last_turn():
    # episode 0 has turns 0, 1, 2; episode 1's turn 0 carried no tokens (a scripted opening), so
    # the batch holds its turn 1 only: it is the last turn there, and nothing bootstraps across episodes
    batch = SimpleNamespace(turn_refs=[(0, 0), (0, 1), (0, 2), (1, 1)])
    rewards = [[0.0, 0.5, 1.0], [-0.1, 0.2]]
    s = t([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0], [4.0, 4.0]])
    r, done, nxt = Fn.turn_transitions(batch.turn_refs, rewards, s)
    assert_close(r, t([0.0, 0.5, 1.0, 0.2]))
    assert_close(done, t([0.0, 0.0, 1.0, 1.0]))
    assert_close(nxt, t([[2.0, 2.0], [3.0, 3.0], [0.0, 0.0], [0.0, 0.0]]))


def test_transitions_do_not_bridge_a_gap_inside_an_episode():
    batch = SimpleNamespace(turn_refs=[(0, 0), (0, 2)])  # turn 1 carried no tokens
    r, done, nxt = Fn.turn_transitions(batch.turn_refs, [[1.0, 2.0, 3.0]], t([[1.0], [3.0]]))
    assert_close(r, t([1.0, 3.0]))
    assert_close(done, t([1.0, 1.0]))  # (0, 0)'s successor is not in the batch: treated as done
    assert_close(nxt, t([[0.0], [0.0]]))


def _fill(buf, values):
    v = t(values)
    buf.add(v[:, None], v[:, None] * 10, v, torch.zeros(len(values)), v[:, None] * 100)


def test_replay_buffer_is_a_ring_and_samples_whole_transitions():
    buf = ReplayBuffer(capacity=3, feat_dim=1, seed=0)
    _fill(buf, [1.0, 2.0])
    assert len(buf) == 2 and buf.ptr == 2
    _fill(buf, [3.0, 4.0])  # 4 overwrites the oldest slot
    assert len(buf) == 3 and buf.ptr == 1
    assert_close(buf.data["s"][:, 0], t([4.0, 2.0, 3.0]))
    b = buf.sample(16)
    assert set(b["reward"].tolist()) <= {2.0, 3.0, 4.0}
    assert_close(b["sa"][:, 0], b["reward"] * 10)  # every field comes from the same transition
    assert_close(b["next_s"][:, 0], b["reward"] * 100)


def test_replay_buffer_resumes_with_the_same_contents_and_sampling():
    buf = ReplayBuffer(capacity=4, feat_dim=1, seed=3)
    _fill(buf, [1.0, 2.0, 3.0])
    buf.sample(5)
    again = ReplayBuffer(capacity=4, feat_dim=1, seed=99)
    again.load_state_dict(buf.state_dict())
    assert (len(again), again.ptr) == (3, 3)
    assert_close(again.sample(8)["reward"], buf.sample(8)["reward"])


def _windows(v):
    """Windows of width 2 and size 1 made from values ``v``: states ``v, 2v``, positions ``v, v+1``."""
    return v[:, None, None] * t([1.0, 2.0])[None, :, None], v.long()[:, None] + torch.tensor([0, 1])


def test_replay_buffer_grows_as_it_fills_and_keeps_windows_whole():
    buf = ReplayBuffer(capacity=5, feat_dim=1, seed=0)
    assert buf.data == {}  # nothing is allocated before the first transition
    for values in ([1.0, 2.0], [3.0], [4.0, 5.0, 6.0]):
        v = t(values)
        buf.add(_windows(v), _windows(v * 10), v, torch.zeros(len(v)), _windows(v * 100))
        if values == [3.0]:
            assert buf.data["s"].shape == (4, 2, 1)  # 2 rows doubled to 4
    assert buf.data["s"].shape == (5, 2, 1) and buf.data["s_pos"].dtype == torch.long  # capped at capacity
    assert len(buf) == 5 and buf.ptr == 1
    b = buf.sample(16)
    (s, s_pos), (sa, _) = b["s"], b["sa"]
    assert set(b["reward"].tolist()) <= {2.0, 3.0, 4.0, 5.0, 6.0}  # 6 overwrote 1
    assert_close(s[:, 1, 0], 2 * b["reward"])
    assert_close(s_pos, b["reward"].long()[:, None] + torch.tensor([0, 1]))
    assert_close(sa[:, 0, 0], 10 * b["reward"])
    again = ReplayBuffer(capacity=5, feat_dim=1, seed=7)
    again.load_state_dict(buf.state_dict())
    assert_close(again.sample(8)["next_s"][1], buf.sample(8)["next_s"][1])
    with pytest.raises(ValueError, match="fields"):
        buf.add(t([[1.0]]), t([[1.0]]), t([1.0]), t([0.0]), t([[1.0]]))  # features into a buffer of windows


def test_windows_gather_the_last_w_states_by_hand():
    hidden = torch.arange(1.0, 9.0).reshape(2, 4, 1)  # row 0: 1 2 3 4, row 1: 5 6 7 8
    states, pos = Fn.gather_windows(hidden, torch.tensor([[0, 1], [1, 3]]), width=3)
    # row 0 ends at position 1: one slot before the sequence's start; row 1 ends at 3: positions 1..3
    assert_close(pos, torch.tensor([[-1, 0, 1], [1, 2, 3]]))
    assert_close(states[..., 0], t([[0.0, 1.0, 2.0], [6.0, 7.0, 8.0]]))  # padding slots hold zeros
    assert_close(Fn.window_positions(torch.tensor([0, 5]), 2), torch.tensor([[-1, 0], [4, 5]]))


def test_window_attention_mask_is_causal_over_real_tokens_by_hand():
    T, F = True, False
    padded = Fn.window_attention_mask(torch.tensor([[-1, -1, 0, 1]]))
    # padding queries see only themselves (a finite softmax), real queries the real keys up to them
    assert torch.equal(padded, torch.tensor([[[[T, F, F, F], [F, T, F, F], [F, F, T, F], [F, F, T, T]]]]))
    full = Fn.window_attention_mask(torch.tensor([[4, 5, 6]]))
    assert torch.equal(full, torch.tensor([[[[T, F, F], [T, T, F], [T, T, T]]]]))


def _constant_critic(q1: float, q2: float, v: float) -> UtteranceCritic:
    """A critic whose heads output constants: last layers' weights 0, biases the values."""
    critic = UtteranceCritic(feat_dim=2, hidden_dim=4)
    with torch.no_grad():
        for head, value in ((critic.q1, q1), (critic.q2, q2), (critic.v, v)):
            head.net[-1].weight.zero_()
            head.net[-1].bias.fill_(value)
    return critic


def test_td_loss_by_hand():
    critic = _constant_critic(q1=1.0, q2=0.0, v=0.5)
    target = make_target(_constant_critic(q1=0.8, q2=0.6, v=2.0))
    b = {"s": torch.randn(2, 2), "sa": torch.randn(2, 2), "next_s": torch.randn(2, 2),
         "reward": t([1.0, 0.0]), "done": t([0.0, 1.0])}
    loss, stats = td_loss(critic, target, b, gamma=0.5)
    # y_Q = r + 0.5 * (1 - done) * V_target = [1 + 0.5 * 2, 0] = [2, 0]
    # Q1 = 1: ((1-2)^2 + (1-0)^2) / 2 = 1 ; Q2 = 0: (4 + 0) / 2 = 2
    # y_V = min(Q1_target, Q2_target) = 0.6 ; V = 0.5: (0.1)^2 = 0.01
    assert_close(loss, t(1.0 + 2.0 + 0.01))
    assert stats["critic/q_loss"] == 3.0 and abs(stats["critic/v_loss"] - 0.01) < 1e-6
    assert stats["critic/target_mean"] == 1.0 and stats["critic/td_error"] == 1.0
    loss.backward()
    assert critic.q1.net[-1].bias.grad is not None and target.q1.net[-1].bias.grad is None


def test_td_loss_fits_v_to_the_action_it_is_told():
    torch.manual_seed(0)
    critic, target = UtteranceCritic(feat_dim=2, hidden_dim=4), make_target(UtteranceCritic(feat_dim=2, hidden_dim=4))
    b = {k: torch.randn(3, 2) for k in ("s", "sa", "next_s", "v_sa")} | {"reward": t([1.0, 0.0, 0.5]), "done": t([0.0, 1.0, 0.0])}
    _, fresh = td_loss(critic, target, b, gamma=0.9, v_action="v_sa")
    _, recorded = td_loss(critic, target, b, gamma=0.9)
    _, swapped = td_loss(critic, target, {**b, "sa": b["v_sa"]}, gamma=0.9)  # V's target: Q_target(s, a')
    assert fresh["critic/v_loss"] == pytest.approx(swapped["critic/v_loss"])
    assert fresh["critic/v_loss"] != pytest.approx(recorded["critic/v_loss"])
    assert fresh["critic/q_loss"] == pytest.approx(recorded["critic/q_loss"])  # Q still fits the recorded action


def test_replay_buffer_keeps_fresh_action_features_with_their_transition():
    buf = ReplayBuffer(capacity=4, feat_dim=1, seed=0, v_action=True)
    v = t([1.0, 2.0])
    buf.add(v[:, None], v[:, None], v, torch.zeros(2), v[:, None], v_sa=v[:, None] * -1)
    b = buf.sample(8)
    assert_close(b["v_sa"][:, 0], -b["reward"])
    again = ReplayBuffer(capacity=4, feat_dim=1, v_action=True)
    again.load_state_dict(buf.state_dict())
    assert_close(again.data["v_sa"], buf.data["v_sa"])
    with pytest.raises(ValueError, match="v_sa"):
        buf.add(v[:, None], v[:, None], v, torch.zeros(2), v[:, None])


# ----- on the tiny model and the toy env ----------------------------------------------------------
def _cfg(**kw):
    """The on-policy variant: sampled episodes, PPO actor on this iteration's batch."""
    base = dict(iterations=1, episodes_per_iter=4, num_envs=4, max_new_tokens=12, critic_updates=4,
                critic_warmup=0, kl_coef=0.01, minibatch_size=2, checkpoint_every=1, collect="sample",
                actor_loss="ppo", critic_gate=0.0, v_target="buffer_action")
    return ArcherConfig(**{**base, **kw})


def _step_spying(trainer, monkeypatch):
    """Run one step; return the critic before it, the features the advantages were computed on,
    and the per-token advantages the actor received."""
    seen, advantages, update = {}, trainer._advantages, archer.actor_update

    def spy_advantages(*feats):
        seen["feats"] = feats
        return advantages(*feats)

    def spy_update(model, opt, batch, token_adv, *rest, **kw):
        seen.update(batch=batch, adv=token_adv)
        return update(model, opt, batch, token_adv, *rest, **kw)

    monkeypatch.setattr(trainer, "_advantages", spy_advantages)
    monkeypatch.setattr(archer, "actor_update", spy_update)
    before = copy.deepcopy(trainer.critic)
    trainer.step()
    return before, seen


def _token_advantages(critic, feats, batch):
    s, sa, *_ = feats
    with torch.no_grad():
        adv = Fn.utterance_advantage(Fn.double_q_min(*critic.q_values(s, sa)), critic.value(s))
    return Fn.broadcast_to_tokens(Fn.center(adv), batch.token_turn)


@pytest.mark.parametrize("timing", ["before", "after"])
def test_advantages_come_from_the_critic_before_or_after_its_updates_on_the_batch(policy, tmp_path, monkeypatch, timing):
    trainer = ArcherTrainer(policy, ENV, _cfg(advantage_timing=timing), out_dir=tmp_path)
    trainer.setup()
    before, seen = _step_spying(trainer, monkeypatch)
    pre = _token_advantages(before, seen["feats"], seen["batch"])
    post = _token_advantages(trainer.critic, seen["feats"], seen["batch"])
    assert not torch.allclose(pre, post)  # the TD updates moved the critic
    assert_close(seen["adv"], pre if timing == "before" else post)


def test_center_advantages_off_keeps_the_raw_mean(policy, tmp_path, monkeypatch):
    trainer = ArcherTrainer(policy, ENV, _cfg(center_advantages=False), out_dir=tmp_path)
    trainer.setup()
    before, seen = _step_spying(trainer, monkeypatch)
    s, sa, *_ = seen["feats"]
    with torch.no_grad():
        raw = Fn.utterance_advantage(Fn.double_q_min(*before.q_values(s, sa)), before.value(s))
    assert_close(seen["adv"], Fn.broadcast_to_tokens(raw, seen["batch"].token_turn))


def test_gae_advantage_trains_the_actor(policy, tmp_path):
    trainer = ArcherTrainer(policy, ENV, _cfg(advantage="gae", gae_lambda=0.5, actor_lr=1e-2), out_dir=tmp_path)
    trainer.setup()
    row = trainer.step()
    assert row["actor/active"] == 1.0 and math.isfinite(row["actor/pg_loss"])
    with pytest.raises(ValueError, match="gae_lambda"):
        _cfg(advantage="gae", gae_lambda=1.5)


def test_env_labels_steps_with_the_oracle_move_of_the_state_they_left():
    env = turngym.make(ENV, expert_labels=True)
    env.reset(seed=0, options={"task_id": "3"})
    fmt = env.unwrapped.format
    *_, info = env.step(fmt.render_call(turngym.ToolCall("x", "guess", {"number": 2})))
    assert info["expert_match"] is False and '"number": 3' in info["expert_action"]
    *_, info = env.step("I think it is " + fmt.render_call(turngym.ToolCall("y", "guess", {"number": 3})))
    assert info["expert_match"] is True  # other text and call ids aside, the same call
    plain = turngym.make(ENV)
    plain.reset(seed=0, options={"task_id": "3"})
    assert "expert_match" not in plain.step("hello")[-1]


def test_expert_auc_ranks_oracle_moves_and_skips_unlabelled_turns():
    trajs = [Trajectory("1", turns=[Turn("a", info={"expert_match": True}), Turn("b", info={"expert_match": False}),
                                    Turn("c", info={"expert_match": None})])]
    got = ArcherTrainer._expert_auc(None, trajs, [(0, 0), (0, 1), (0, 2)], t([0.5, 0.1, 9.0]))
    assert got == {"critic/auc_expert": 1.0, "critic/expert_rate": 0.5}
    assert ArcherTrainer._expert_auc(None, [Trajectory("1", turns=[Turn("a")])], [(0, 0)], t([0.0])) == {}


def test_auc_expert_is_logged_every_iteration(policy, tmp_path):
    trainer = ArcherTrainer(policy, ENV, _cfg(), out_dir=tmp_path)
    trainer.setup()
    row = trainer.step()
    assert 0.0 <= row["critic/expert_rate"] <= 1.0
    rate = row["critic/expert_rate"]
    if 0.0 < rate < 1.0:  # both kinds of turn: the AUC is defined and logged
        assert 0.0 <= row["critic/auc_expert"] <= 1.0
    else:
        assert "critic/auc_expert" not in row


def test_fresh_action_v_target_stores_a_prime_and_resumes_exactly(policy, tiny_tokenizer, tmp_path):
    from turngym.agents.hf import HFPolicy

    def make(out, iterations):
        pol = HFPolicy(build_tiny_model(tiny_tokenizer), tiny_tokenizer)
        return ArcherTrainer(pol, ENV, _cfg(v_target="fresh_action", iterations=iterations), out_dir=tmp_path / out)

    full = make("full", 2)
    t0 = time.perf_counter()
    rows = full.train(progress=False)
    n, data = len(full.buffer), full.buffer.data
    assert n > 0 and data["v_sa"][:n].abs().sum() > 0
    assert not torch.equal(data["v_sa"][:n], data["sa"][:n])  # a' is not the recorded action
    print(f"fresh_action: 2 iterations in {time.perf_counter() - t0:.2f}s")
    make("killed", 1).train(progress=False)
    resumed = make("killed", 2)
    resumed.setup()
    resumed.load(tmp_path / "killed" / "checkpoint")
    nxt = resumed.step()
    for key in ("rollout/return", "critic/q_loss", "critic/v_loss", "actor/pg_loss", "adv/mean"):
        assert nxt[key] == pytest.approx(rows[1][key], rel=1e-5, abs=1e-6), key


# ----- the critic's own top blocks (critic_encoder=top:K) -----------------------------------------
@pytest.mark.parametrize("k", [1, 2])
def test_top_k_encoder_over_a_whole_prefix_is_the_reference_final_hidden_state(tiny_model, k):
    ref = frozen_copy(tiny_model.model)

    def traj(task, pairs):
        rec = TokenRecord()
        return Trajectory(task, turns=[Turn("x", span=rec.add_turn(p, a, [0.0] * len(a))) for p, a in pairs], record=rec)

    first = [11, 12, 13, 14, 15]
    trajs = [traj("a", [(first, [16, 17]), (first + [16, 17, 18, 19], [20, 21, 22])]),
             traj("b", [([31, 32], [33])])]  # a shorter row: right padding in the batch
    batch = pack_batch(trajs, pad_id=0)
    encoder = TrunkTopEncoder(ref, k)
    _, final = reference_pass(ref, batch, True)
    _, trunk = reference_pass(ref, batch, True, hidden_layer=encoder.trunk_layer)
    at = torch.cat([batch.state_pos, batch.action_pos])
    width = batch.input_ids.shape[1] + 2  # every window covers its whole prefix, after padding slots
    with torch.no_grad():
        phi = encoder(*Fn.gather_windows(trunk, at, width))
        short = encoder(*Fn.gather_windows(trunk, at, 2))
    assert_close(phi, final[at[:, 0], at[:, 1]], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(short, phi, atol=1e-3)  # a 2-token window does see less (the test has teeth)


def _top_cfg(**kw):
    return _cfg(critic_encoder="top:1", critic_window=8, critic_batch_size=16, **kw)


def test_top_k_critic_trains_its_own_blocks_and_leaves_the_reference(policy, tmp_path):
    trainer = ArcherTrainer(policy, ENV, _top_cfg(advantage="gae"), out_dir=tmp_path)
    trainer.setup()
    encoder, ref = trainer.critic.encoder, trainer.ref
    assert encoder.trunk_layer == 1 and trainer.critic_opt.param_groups[1]["lr"] == 1e-5
    assert all(torch.equal(a, b) for a, b in zip(encoder.blocks[0].parameters(), ref.model.layers[1].parameters()))
    ref_before, enc_before = copy.deepcopy(ref.state_dict()), copy.deepcopy(encoder.state_dict())
    target_before = copy.deepcopy(trainer.critic_target.encoder.state_dict())
    row = trainer.step()
    assert math.isfinite(row["critic/q_loss"]) and row["actor/active"] == 1.0
    after, target_after = encoder.state_dict(), trainer.critic_target.encoder.state_dict()
    assert all(not torch.equal(v, after[k]) for k, v in enc_before.items())  # every block weight and the norm
    assert any(not torch.equal(v, target_after[k]) for k, v in target_before.items())  # Polyak-averaged
    assert all(torch.equal(v, ref.state_dict()[k]) for k, v in ref_before.items())
    s, pos = trainer.buffer.sample(3)["s"]
    assert s.shape == (3, 8, 64) and pos.shape == (3, 8)
    with pytest.raises(ValueError, match="token_baseline"):
        _top_cfg(token_baseline=True)
    with pytest.raises(ValueError, match="top:K"):
        _cfg(critic_encoder="top:x")
    with pytest.raises(ValueError, match="branch_pick"):
        _cfg(branch_pick="first")


def test_top_k_critic_with_fresh_actions_resumes_exactly(tiny_tokenizer, tmp_path):
    from turngym.agents.hf import HFPolicy

    def make(out, iterations):
        pol = HFPolicy(build_tiny_model(tiny_tokenizer), tiny_tokenizer)
        cfg = _top_cfg(v_target="fresh_action", advantage="td", iterations=iterations, episodes_per_iter=2, num_envs=2)
        return ArcherTrainer(pol, ENV, cfg, out_dir=tmp_path / out)

    rows = make("full", 2).train(progress=False)
    make("killed", 1).train(progress=False)
    resumed = make("killed", 2)
    resumed.setup()
    resumed.load(tmp_path / "killed" / "checkpoint")
    assert len(resumed.critic_opt.state) == len(list(resumed.critic.parameters()))  # the encoder's Adam moments too
    assert resumed.buffer.data["v_sa_pos"].shape[1:] == (8,)  # a' is stored as a window too
    nxt = resumed.step()
    for key in ("critic/q_loss", "critic/v_loss", "critic/td_error", "actor/pg_loss", "adv/mean"):
        assert nxt[key] == pytest.approx(rows[1][key], rel=1e-5, abs=1e-6), key


# ----- tree rollouts and the AWR actor (the defaults) ---------------------------------------------
def _tree_cfg(**kw):
    base = dict(iterations=1, episodes_per_iter=4, num_envs=4, max_new_tokens=6, critic_updates=8,
                branch_points=1, branch_width=8, branch_depth=1, branch_by="state_key", critic_holdout=0.25,
                critic_gate=0.0, actor_groups=8, awr_min_shift=0.0, awr_margin=0.0, minibatch_size=4, actor_lr=1e-3, autocast="none")
    return ArcherConfig(**{**base, **kw})


def _tree_trainer(tiny_tokenizer, out, **kw):
    from fixtures_model import EveryGuess

    policy = EveryGuess(build_tiny_model(tiny_tokenizer), tiny_tokenizer, generation_dtype=torch.float32)
    return ArcherTrainer(policy, ENV, _tree_cfg(**kw), env_kwargs={"tool_format": "text"}, out_dir=out)


def _keep_trees(trainer, monkeypatch) -> dict:
    """Wrap the trainer's tree collection so a test can read the last tree (``seen["tree"]``)."""
    seen, collect = {}, trainer._collect_tree

    def spy():
        seen["tree"], metrics = collect()
        return seen["tree"], metrics

    monkeypatch.setattr(trainer, "_collect_tree", spy)
    return seen


def test_tree_archer_buffers_each_turn_once_scores_siblings_and_trains_the_actor(tiny_tokenizer, tmp_path, monkeypatch):
    trainer = _tree_trainer(tiny_tokenizer, tmp_path)
    trainer.setup()
    seen = _keep_trees(trainer, monkeypatch)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    row = trainer.step()
    tree = seen["tree"]
    assert len(tree.episodes) > len(tree.roots) and tree.sibling_groups()
    # a branch adds only its own turns: the buffer holds each held-in turn once
    held_in = [i for i, e in enumerate(tree.episodes) if e.task_id not in trainer.heldout_tasks]
    assert len(trainer.buffer) == sum(len(tree.own_turns(i)) for i in held_in)
    assert len(trainer.memory) == len(tree.sibling_groups()) == row["search/sibling_groups"]
    assert [len(e["turns"]) for e in trainer.memory] == [len(g) for g in tree.sibling_groups()]
    assert row["actor/active"] == 1.0 and row["actor/informative_states"] > 0 and math.isfinite(row["actor/pg_loss"])
    assert row["critic/sibling_pairs_xfit"] > 0 and 0.0 <= row["critic/sibling_auc_xfit"] <= 1.0
    assert row["critic/sibling_auc_xfit_low"] <= row["critic/sibling_auc_xfit"] <= row["critic/sibling_auc_xfit_high"]
    # the roots that branched lost, so every pair is at a lost episode's fork
    assert row["critic/sibling_pairs_xfit_lost"] == row["critic/sibling_pairs_xfit"]
    assert row["critic/sibling_auc_xfit_lost"] == row["critic/sibling_auc_xfit"]
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters() if n in before)


def test_branch_wins_searches_from_every_root(tiny_tokenizer, tmp_path, monkeypatch):
    trainer = _tree_trainer(tiny_tokenizer, tmp_path, branch_wins=True, iterations=1)
    trainer.setup()
    calls, search = [], trainer.collector.tree_rollout
    monkeypatch.setattr(trainer.collector, "tree_rollout", lambda *a, **kw: calls.append(kw) or search(*a, **kw))
    trainer.step()
    assert [kw["from_wins"] for kw in calls] == [True]


def test_critic_no_ops_trains_the_critic_on_refused_replies_as_dead_ends(tiny_tokenizer, tmp_path, monkeypatch):
    from fixtures_model import NonsenseFirst
    from turngym.rollout.branching import is_no_op

    def run(out, **kw):
        policy = NonsenseFirst(build_tiny_model(tiny_tokenizer), tiny_tokenizer, generation_dtype=torch.float32)
        trainer = ArcherTrainer(policy, ENV, _tree_cfg(branch_width=3, **kw), env_kwargs={"tool_format": "text"}, out_dir=out)
        trainer.setup()
        seen = _keep_trees(trainer, monkeypatch)
        return trainer, trainer.step(), seen["tree"]

    plain, row0, _ = run(tmp_path / "plain")
    trainer, row, tree = run(tmp_path / "kept", critic_no_ops=True)
    leaves = [i for i, e in enumerate(tree.episodes) if is_no_op(e)]
    assert row0["search/no_op_leaves"] == 0 and row["search/no_op_leaves"] == len(leaves) > 0
    # the search and the actor's states are the same; only the critic's buffer grows, by one turn a leaf
    assert row["search/branches"] == row0["search/branches"] and len(trainer.memory) == len(plain.memory)
    held_in = [i for i in leaves if tree.episodes[i].task_id not in trainer.heldout_tasks]
    assert held_in and len(trainer.buffer) == len(plain.buffer) + len(held_in)
    # each leaf's turn is a dead end: done, its reward (0, a failed game's), nothing to bootstrap from
    done, reward = trainer.buffer.data["done"][: len(trainer.buffer)], trainer.buffer.data["reward"][: len(trainer.buffer)]
    assert int(done.sum()) == int(plain.buffer.data["done"][: len(plain.buffer)].sum()) + len(held_in)
    assert float(reward.sum()) == float(plain.buffer.data["reward"][: len(plain.buffer)].sum())


def test_policy_action_rows_by_hand():
    # episode 0: a root of 3 turns; episode 1 forks it at turn 1; episode 2 forks episode 1 at turn 2
    refs = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)]
    parent, branch_turn = [-1, 0, 1], [0, 1, 2]
    # shared-prefix turns are played too: (1, 0) is the branch's own turn, not its parent's
    assert policy_action_rows(refs, parent, branch_turn).tolist() == [0, 1, 2, 3, 1, 5, 6, 7, 5]
    # a parent whose turn is missing (the parent ended earlier): the turn stands for itself
    assert policy_action_rows([(0, 0), (1, 0), (1, 1)], [-1, 0], [0, 1]).tolist() == [0, 1, 2]


def test_tree_v_target_reads_the_parents_reply_at_a_forced_turn(tiny_tokenizer, tmp_path):
    trainer = _tree_trainer(tiny_tokenizer, tmp_path)
    trainer.setup()
    tree, _ = trainer._collect_tree()
    enc = trainer._encode(tree.episodes)
    row = {ref: i for i, ref in enumerate(enc.refs)}
    v_sa = trainer._v_action_features(tree, tree.episodes, enc)
    for i in range(len(tree.roots), len(tree.episodes)):
        p, j = tree.parent[i], tree.branch_turn[i]
        assert_close(v_sa[row[(i, j)]], enc.sa[row[(p, j)]])  # forced runner-up: V reads the parent's reply
        if j + 1 < len(tree.episodes[i].turns):
            assert_close(v_sa[row[(i, j + 1)]], enc.sa[row[(i, j + 1)]])  # after the fork: its own greedy reply


def test_tree_encode_in_chunks_matches_one_batch(tiny_tokenizer, tmp_path):
    trainer = _tree_trainer(tiny_tokenizer, tmp_path, num_envs=3)
    trainer.setup()
    tree, _ = trainer._collect_tree()
    chunked, whole = trainer._encode(tree.episodes), trainer._encode(tree.episodes, whole=True)
    assert chunked.refs == whole.refs
    assert_close(chunked.s, whole.s, atol=1e-4, rtol=1e-4)
    assert_close(chunked.sa, whole.sa, atol=1e-4, rtol=1e-4)


def test_tree_critic_gate_holds_the_actor_until_the_sibling_auc_clears_it(tiny_tokenizer, tmp_path):
    trainer = _tree_trainer(tiny_tokenizer, tmp_path, critic_gate=1.0, critic_holdout=0.5)
    trainer.setup()
    row = trainer.step()
    evidence = row.get("critic/sibling_auc_xfit", row.get("critic/sibling_auc", 0.0))
    assert row["actor/active"] == float(evidence >= 1.0)
    assert ("actor/pg_loss" in row) == bool(row["actor/active"])  # a closed gate trains nothing


def test_tree_archer_resumes_exactly(tiny_tokenizer, tmp_path):
    full = _tree_trainer(tiny_tokenizer, tmp_path / "full", iterations=2)
    rows = full.train(progress=False)
    _tree_trainer(tiny_tokenizer, tmp_path / "killed", iterations=1).train(progress=False)
    resumed = _tree_trainer(tiny_tokenizer, tmp_path / "killed", iterations=2)
    resumed.setup()
    resumed.load(tmp_path / "killed" / "checkpoint")
    assert len(resumed.memory) > 0 and resumed.screened
    nxt = resumed.step()
    for key in ("rollout/success", "search/branches", "critic/q_loss", "actor/pg_loss"):
        assert nxt[key] == pytest.approx(rows[1][key], rel=1e-5, abs=1e-6), key


def test_tree_config_is_validated():
    with pytest.raises(ValueError, match="collect"):
        ArcherConfig(collect="beam")
    with pytest.raises(ValueError, match="one process"):
        ArcherConfig(group_size=4)
    with pytest.raises(ValueError, match="critic_gate"):
        ArcherConfig(collect="sample")  # the gate needs sibling pairs
    with pytest.raises(ValueError, match="pg_loss"):
        ArcherConfig(pg_loss="ppo")
    with pytest.raises(ValueError, match="collect=tree"):
        ArcherConfig(collect="sample", critic_gate=0)  # AWR needs siblings
    assert ArcherConfig().pg_loss == "nll"
    assert ArcherConfig(collect="sample", critic_gate=0, actor_loss="ppo").collect == "sample"


def test_tree_awr_with_returns_trains_without_the_critic(tiny_tokenizer, tmp_path):
    # no critic reaches a gate of 1.0; the returns rank the siblings, so the gate does not apply
    trainer = _tree_trainer(tiny_tokenizer, tmp_path, awr_values="returns", critic_gate=1.0)
    trainer.setup()
    row = trainer.step()
    assert row["actor/active"] == 1.0 and row["actor/informative_states"] > 0


def test_tree_awr_skips_states_where_the_target_matches_the_policy(tiny_tokenizer, tmp_path):
    trainer = _tree_trainer(tiny_tokenizer, tmp_path, awr_min_shift=0.999)  # no state moves that much
    trainer.setup()
    row = trainer.step()
    assert row["actor/informative_states"] == 0 and "actor/pg_loss" not in row


def test_tree_awr_never_targets_a_reply_the_env_rejected(tiny_tokenizer, tmp_path):
    trainer = _tree_trainer(tiny_tokenizer, tmp_path)
    trainer.setup()
    assert trainer.step()["actor/informative_states"] > 0
    for e in trainer.memory:  # every reply but the policy's own was rejected: no state has a valid alternative
        own = int(e["logp"].argmax())
        for k, t in enumerate(e["turns"]):
            t.turns[0].info["action_valid"] = k == own
    row = trainer._awr_update()
    assert row["actor/informative_states"] == 0 and "actor/pg_loss" not in row


def test_tree_awr_margin_leaves_states_the_critic_cannot_separate(tiny_tokenizer, tmp_path):
    trainer = _tree_trainer(tiny_tokenizer, tmp_path, awr_margin=5.0)  # rewards are 0/1: no margin reaches 5
    trainer.setup()
    row = trainer.step()
    assert row["actor/informative_states"] == 0 and "actor/pg_loss" not in row


def test_tree_awr_self_imitation_clones_own_turns_that_won(tiny_tokenizer, tmp_path):
    trainer = _tree_trainer(tiny_tokenizer, tmp_path, self_imitation=1.0, awr_min_weight=0.01)
    trainer.setup()
    row = trainer.step()
    assert trainer.wins and all(e["value"] > 0 and len(e["turn"].turns) == 1 for e in trainer.wins)
    assert row["actor/sil_memory"] == len(trainer.wins) and 1 <= row["actor/sil_turns"] <= len(trainer.wins)
    # a win the critic already expects (V >= R) is not cloned: weight (R - V)+ = 0
    v = trainer.critic.value(trainer.critic.encode(torch.stack([e["s"] for e in trainer.wins])))
    for e, value in zip(trainer.wins, v.tolist()):
        e["value"] = value
    assert trainer._self_imitation_rows() == ([], [])
    # the wins survive a checkpoint
    state = trainer._extra_state()
    twin = _tree_trainer(tiny_tokenizer, tmp_path / "twin", self_imitation=1.0)
    twin.setup()
    twin._load_extra_state(state)
    assert [e["turn"].to_dict() for e in twin.wins] == [e["turn"].to_dict() for e in trainer.wins]


def test_self_imitation_without_a_baseline_weighs_each_win_by_its_return(tiny_tokenizer, tmp_path):
    # sil_baseline=zero: V = 0, so a win the critic already expects is still cloned, at weight R
    trainer = _tree_trainer(tiny_tokenizer, tmp_path, self_imitation=2.0, awr_min_weight=0.01, sil_baseline="zero")
    trainer.setup()
    trainer.step()
    assert trainer.wins
    v = trainer.critic.value(trainer.critic.encode(torch.stack([e["s"] for e in trainer.wins])))
    for e, value in zip(trainer.wins, v.tolist()):
        e["value"] = max(value, 0.5)
    rows, weights = trainer._self_imitation_rows()
    assert sum(len(t.turns) for t in rows) == len(trainer.wins) == len(weights)  # an episode's turns share a row
    assert sorted(weights) == pytest.approx(sorted(2.0 * e["value"] for e in trainer.wins))
    with pytest.raises(ValueError, match="sil_baseline"):
        _tree_cfg(sil_baseline="mean")


def test_a_closed_gate_stops_the_sibling_targets_not_self_imitation(tiny_tokenizer, tmp_path):
    # no critic reaches a gate of 1.0: the critic's ranking trains nothing, the confirmed wins still do
    trainer = _tree_trainer(tiny_tokenizer, tmp_path, self_imitation=1.0, awr_min_weight=0.01, critic_gate=1.0)
    trainer.setup()
    row = trainer.step()
    assert row["actor/active"] == 0.0 and row["actor/states"] == 0
    assert row["actor/sil_turns"] >= 1 and "actor/pg_loss" in row


def test_clone_wins_keeps_each_tasks_best_branch_success_and_clones_it_with_a_closed_gate(tiny_tokenizer, tmp_path,
                                                                                          monkeypatch):
    # branch BC's update inside ArCHer: the search's best success per task, weight 1 on its valid
    # turns, trained even while the critic's gate is closed (no critic reaches 1.0)
    trainer = _tree_trainer(tiny_tokenizer, tmp_path, clone_wins=True, critic_gate=1.0)
    trainer.setup()
    seen = _keep_trees(trainer, monkeypatch)
    row = trainer.step()
    tree = seen["tree"]
    won = {}
    for ep, parent in zip(tree.episodes, tree.parent):
        if parent >= 0 and ep.success:
            won.setdefault(ep.task_id, []).append(ep)
    assert won, "the tiny policy's search should find a success"
    assert set(trainer.best) == set(won)
    for task, eps in won.items():  # the highest return, then the fewest turns
        best = max(eps, key=lambda e: (e.total_reward, -len(e.turns)))
        assert (trainer.best[task].total_reward, len(trainer.best[task].turns)) == (best.total_reward, len(best.turns))
    assert row["actor/active"] == 0.0 and row["actor/states"] == 0
    assert row["actor/clone_episodes"] == len(won) and "actor/pg_loss" in row
    clones, weights = trainer._clone_rows()
    assert [c.task_id for c in clones] == sorted(won)
    assert len(weights) == sum(len(c.turns) for c in clones) and set(weights) <= {0.0, 1.0}
    # the clones survive a checkpoint
    twin = _tree_trainer(tiny_tokenizer, tmp_path / "twin", clone_wins=True)
    twin.setup()
    twin._load_extra_state(trainer._extra_state())
    assert {k: v.to_dict() for k, v in twin.best.items()} == {k: v.to_dict() for k, v in trainer.best.items()}
    with pytest.raises(ValueError, match="clone_wins"):
        _tree_cfg(clone_wins=True, actor_loss="ppo")


def test_clone_greedy_remembers_the_screens_own_wins(tiny_tokenizer, tmp_path):
    from turngym.rollout.branching import Tree

    won_root = Trajectory("3", [Turn("3")], outcome=1.0)
    won_branch = Trajectory("5", [Turn("1"), Turn("5")], outcome=1.0)
    tree = Tree([won_root, Trajectory("5", [Turn("1")]), won_branch], [-1, -1, 1], [0, 0, 1])
    for greedy, kept in ((False, {"5"}), (True, {"3", "5"})):
        trainer = _tree_trainer(tiny_tokenizer, tmp_path / str(greedy), clone_wins=True, clone_greedy=greedy)
        trainer._remember_best(tree)
        assert set(trainer.best) == kept
    with pytest.raises(ValueError, match="clone_wins"):
        _tree_cfg(clone_greedy=True)


@pytest.mark.parametrize("encoder", ["reference", "top:1"])  # the prompt's forward once per point / per reply
def test_critic_ranked_search_plays_the_replies_the_critic_rates_highest(tiny_tokenizer, tmp_path, monkeypatch, encoder):
    trainer = _tree_trainer(tiny_tokenizer, tmp_path, branch_rank="critic", branch_width=2, branch_pool=8,
                            iterations=2, critic_encoder=encoder, critic_window=8)
    trainer.setup()
    seen = _keep_trees(trainer, monkeypatch)
    calls, rank = [], trainer._rank_replies
    monkeypatch.setattr(trainer, "_rank_replies", lambda p, r: calls.append((p, r, rank(p, r))) or calls[-1][2])
    first = trainer.step()
    assert first["search/critic_ranked"] == 0.0 and not calls  # no critic fitted yet: the policy's order
    second = trainer.step()
    assert second["search/critic_ranked"] == 1.0 and calls
    assert second["search/ranked_points"] == sum(len(p) for p, _, _ in calls)
    off = sum(i >= 2 for _, _, xs in calls for x in xs for i in sorted(range(8), key=lambda i: -x[i])[:2])
    assert second["search/ranked_off_policy"] == off
    tree = seen["tree"]
    points, replies, scores = calls[0]
    assert all(len(us) == 8 for us in replies) and all(math.isfinite(x) for xs in scores for x in xs)
    for (traj, j), us, xs in zip(points, replies, scores):  # the two rated highest were played there
        node = next(i for i, e in enumerate(tree.episodes) if e is traj)
        played = {tree.episodes[i].turns[j].action_text for i in range(len(tree.episodes))
                  if tree.parent[i] == node and tree.branch_turn[i] == j}
        assert played == {u.text for u in keep_top(us, xs, 2)}
    # a candidate's score is min(Q1, Q2) of that reply as the critic reads it inside a played episode
    i = next(i for i, p in enumerate(tree.parent) if p >= 0)
    parent, j = tree.episodes[tree.parent[i]], tree.branch_turn[i]
    enc = trainer._encode([tree.episodes[i]])
    k = enc.refs.index((0, j))
    _, q = trainer._advantages(enc.s, enc.sa, torch.zeros(len(enc.refs)), torch.ones(len(enc.refs)), enc.s)
    reply = Utterance(tree.episodes[i].turns[j].action_text, tree.episodes[i].action_ids(j), [])
    assert rank([(parent, j)], [[reply]])[0][0] == pytest.approx(float(q[k]), abs=1e-4)
    # and what acting with the critic ranks a turn's replies by (critic_guided): the same Q from bare ids
    assert trainer.reply_values(parent.prompt_ids(j), [reply.action_ids])[0] == pytest.approx(float(q[k]), abs=1e-4)
    # with a prior, the policy's own log-prob of the reply joins its Q
    trainer.cfg.branch_rank_prior = 0.5
    reply.logprobs = [-1.0, -3.0]
    assert rank([(parent, j)], [[reply]])[0][0] == pytest.approx(float(q[k]) - 2.0, abs=1e-4)
    with pytest.raises(ValueError, match="branch_pool"):
        _tree_cfg(branch_rank="critic", branch_width=8, branch_pool=8)
    with pytest.raises(ValueError, match="branch_rank_prior"):
        _tree_cfg(branch_rank_prior=-1.0)


def test_self_imitation_is_off_by_default_and_needs_awr(tiny_tokenizer, tmp_path):
    trainer = _tree_trainer(tiny_tokenizer, tmp_path)
    trainer.setup()
    assert "actor/sil_turns" not in trainer.step() and trainer.wins == []
    with pytest.raises(ValueError, match="self_imitation"):
        _tree_cfg(self_imitation=1.0, actor_loss="ppo")


def test_held_out_tasks_are_independent_of_the_screen_order():
    from turngym.trainers.archer import heldout_tasks
    from turngym.rollout.schedule import screen_order

    tasks = [f"q-{i:03d}" for i in range(522)]
    held = heldout_tasks(tasks, 0.125, seed=0)
    assert 40 < len(held) < 95 and held == heldout_tasks(tasks, 0.125, seed=0)
    first = set(screen_order(tasks, set(), {}, seed=0, iteration=0, n=64))
    assert len(held & first) < 20  # about 8 expected; a shuffle seeded like the screen's gave all 64
    assert heldout_tasks(tasks, 0.0, seed=0) == set()


def test_replay_buffer_clone_is_independent():
    buf = ReplayBuffer(capacity=8, feat_dim=1, seed=0, v_action=True)
    v = t([1.0, 2.0])
    buf.add(v[:, None], v[:, None], v, torch.zeros(2), v[:, None], v_sa=v[:, None])
    twin = buf.clone()
    twin.add(v[:, None], v[:, None], v, torch.zeros(2), v[:, None], v_sa=v[:, None])
    assert len(buf) == 2 and len(twin) == 4
    same = buf.clone()
    assert_close(buf.sample(16)["reward"], same.sample(16)["reward"])  # the same RNG state: the same draws
