"""ArCHer's core (``trainers/archer/core.py``) checked on numbers worked by hand: the TD targets with
the fresh-action V target, the double-Q and double-V minimum, the Polyak update, the actor's advantage
at a buffer state, the replay transitions and buffer, the critic's windows; then, on the tiny model,
that an iteration trains the critic's own blocks and the actor, and that a resumed run continues
exactly."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from fixtures_model import build_tiny_model
from torch import nn
from torch.testing import assert_close

from turngym.trainers.actor import frozen_copy, reference_pass
from turngym.trainers.archer import ArcherConfig, ArcherTrainer
from turngym.trainers.archer import core as archer_core
from turngym.trainers.archer.critic import (ReplayBuffer, UtteranceCritic, advantage, double_min, make_target, polyak,
                                            soft_update, td_loss, td_target)
from turngym.trainers.archer.encoder import TrunkTopEncoder, gather_windows, window_attention_mask, window_positions
from turngym.trainers.archer.turns import returns_after, transitions
from turngym.trainers.sequences import pack_batch
from turngym.types import TokenRecord, Trajectory, Turn

ENV = "tests/Guess-v0"


def t(x):
    return torch.tensor(x, dtype=torch.float32)


# ----- the math, by hand ------------------------------------------------------------------------
def test_td_target_double_min_advantage_and_polyak_by_hand():
    assert_close(td_target(t([1.0, 0.0]), t([2.0, 5.0]), t([0.0, 1.0]), gamma=0.5), t([2.0, 0.0]))
    assert_close(double_min(t([1.0, -2.0]), t([0.5, 3.0])), t([0.5, -2.0]))
    # A = min(Q1, Q2) - min(V1, V2) = min(0.9, 0.7) - min(0.2, 0.4) = 0.5 ; min(0, 1) - min(-1, 2) = 1
    assert_close(advantage(t([0.9, 0.0]), t([0.7, 1.0]), t([0.2, -1.0]), t([0.4, 2.0])), t([0.5, 1.0]))
    assert_close(polyak(t([1.0, 0.0]), t([3.0, 10.0]), tau=0.1), t([1.2, 1.0]))
    target, online = nn.Linear(1, 1, bias=False), nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        target.weight.fill_(1.0)
        online.weight.fill_(3.0)
    soft_update(target, online, tau=0.25)
    assert target.weight.detach().item() == pytest.approx(1.5)  # 0.25 * 3 + 0.75 * 1


class _Probe(UtteranceCritic):
    """Q1(s, a) = sum(a), Q2(s, a) = 2 sum(a) + q2_shift, V1(s) = v1, V2(s) = sum(s): known by hand."""

    def __init__(self, v1: float, q2_shift: float = 0.0) -> None:
        super().__init__(feat_dim=2, hidden_dim=2)
        self.scale = nn.Parameter(torch.ones(()))  # the differentiable part
        self.v1_value, self.q2_shift = v1, q2_shift

    def q_values(self, s, sa):
        return self.scale * sa.sum(-1), 2 * sa.sum(-1) + self.q2_shift

    def values(self, s):
        return torch.full(s.shape[:1], self.v1_value) * self.scale, s.sum(-1)


def test_td_loss_fits_q_to_the_bootstrapped_reward_and_v_to_q_of_the_fresh_reply_by_hand():
    critic, target = _Probe(v1=0.5), make_target(_Probe(v1=2.0))
    b = {"s": t([[1.0, 0.0], [0.0, 0.0]]), "sa": t([[1.0, 1.0], [0.0, 1.0]]), "reward": t([1.0, 0.0]),
         "done": t([0.0, 1.0]), "next_s": t([[1.0, 1.0], [5.0, 5.0]]), "fresh_sa": t([[3.0, 0.0], [1.0, 0.0]])}
    loss, stats = td_loss(critic, target, b, gamma=0.5)
    # y_Q1 = r + 0.5 (1 - done) V1_target(s') = [1 + 0.5 * 2, 0] = [2, 0]; Q1 = sum(sa) = [2, 1]: MSE 0.5
    # y_Q2 = r + 0.5 (1 - done) V2_target(s') = [1 + 0.5 * 2, 0] = [2, 0]; Q2 = 2 sum(sa) = [4, 2]: MSE 4
    # y_V1 = Q1_target(s, a') = sum(a') = [3, 1]; V1 = 0.5: MSE (6.25 + 0.25) / 2 = 3.25
    # y_V2 = Q2_target(s, a') = 2 sum(a') = [6, 2]; V2 = sum(s) = [1, 0]: MSE (25 + 4) / 2 = 14.5
    assert_close(loss, t(0.5 + 4.0 + 3.25 + 14.5))
    assert stats["critic/q_loss"] == pytest.approx(4.5) and stats["critic/v_loss"] == pytest.approx(17.75)
    # V's target reads the fresh reply a', not the recorded one: with a' = a, y_V1 = [2, 1], MSE (2.25 + 0.25)/2
    _, recorded = td_loss(critic, target, {**b, "fresh_sa": b["sa"]}, gamma=0.5)
    assert recorded["critic/v_loss"] == pytest.approx(1.25 + (9 + 4) / 2)
    loss.backward()
    assert critic.scale.grad is not None and target.scale.grad is None


def test_transitions_chain_an_episodes_turns_and_stop_at_gaps_by_hand():
    # episode 0 has turns 0, 1, 2; episode 1's turn 0 carried no tokens, so only its turn 1 is here
    refs = [(0, 0), (0, 1), (0, 2), (1, 1)]
    rewards = [[0.0, 0.5, 1.0], [-0.1, 0.2]]
    s = t([[1.0], [2.0], [3.0], [4.0]])
    r, done, nxt = transitions(refs, rewards, s)
    assert_close(r, t([0.0, 0.5, 1.0, 0.2]))
    assert_close(done, t([0.0, 0.0, 1.0, 1.0]))
    assert_close(nxt, t([[2.0], [3.0], [0.0], [0.0]]))
    assert_close(returns_after(refs, rewards), t([1.5, 1.5, 1.0, 0.2]))
    r, done, nxt = transitions([(0, 0), (0, 2)], [[1.0, 2.0, 3.0]], t([[1.0], [3.0]]))  # turn 1 missing
    assert_close(done, t([1.0, 1.0])) and assert_close(nxt, t([[0.0], [0.0]]))


# ----- the replay buffer ------------------------------------------------------------------------
def _fill(buf, values):
    v = t(values)
    buf.add(v[:, None], v[:, None] * 10, v, torch.zeros(len(values)), v[:, None] * 100, [[int(x)] for x in values])


def test_replay_buffer_is_a_ring_of_whole_transitions_with_their_prompts():
    buf = ReplayBuffer(capacity=3, seed=0)
    _fill(buf, [1.0, 2.0])
    _fill(buf, [3.0, 4.0])  # 4 overwrites the oldest slot
    assert len(buf) == 3 and buf.ptr == 1
    assert_close(buf.data["s"][:, 0], t([4.0, 2.0, 3.0]))
    rows = buf.sample_rows(16)
    assert set(buf.get("reward", rows).tolist()) <= {2.0, 3.0, 4.0}
    assert_close(buf.get("sa", rows)[:, 0], buf.get("reward", rows) * 10)  # every field of one transition
    assert [buf.prompt(int(i)) for i in rows] == [[int(x)] for x in buf.get("reward", rows).tolist()]
    again = ReplayBuffer(capacity=3, seed=99)
    again.load_state_dict(buf.state_dict())
    assert_close(again.get("reward", again.sample_rows(8)), buf.get("reward", buf.sample_rows(8)))


def test_replay_buffer_keeps_windows_whole_in_bf16():
    buf = ReplayBuffer(capacity=5, seed=0, store_dtype=torch.bfloat16)
    for values in ([1.0, 2.0], [3.0]):
        v = t(values)
        win = (v[:, None, None] * t([1.0, 2.0])[None, :, None], v.long()[:, None] + torch.tensor([0, 1]))
        buf.add(win, win, v, torch.zeros(len(v)), win, [[0]] * len(v))
    assert buf.data["s"].dtype == torch.bfloat16 and buf.data["s_pos"].dtype == torch.long
    s, pos = buf.get("s", torch.tensor([2]))
    assert s.dtype == torch.float32 and s[0, :, 0].tolist() == [3.0, 6.0] and pos.tolist() == [[3, 4]]
    with pytest.raises(ValueError, match="fields"):
        buf.add(t([[1.0]]), t([[1.0]]), t([1.0]), t([0.0]), t([[1.0]]), [[0]])  # features into a buffer of windows


# ----- windows ----------------------------------------------------------------------------------
def test_windows_and_their_attention_by_hand():
    hidden = torch.arange(2 * 4, dtype=torch.float32).reshape(2, 4, 1)
    states, pos = gather_windows(hidden, torch.tensor([[0, 1], [1, 3]]), width=3)
    assert pos.tolist() == [[-1, 0, 1], [1, 2, 3]] and states[:, :, 0].tolist() == [[0.0, 0.0, 1.0], [5.0, 6.0, 7.0]]
    assert window_positions(torch.tensor([0, 5]), 2).tolist() == [[-1, 0], [4, 5]]
    mask = window_attention_mask(torch.tensor([[-1, 0, 1]]))[0, 0]
    assert mask.tolist() == [[True, False, False], [False, True, False], [False, True, True]]


@pytest.mark.parametrize("k", [1, 2])
def test_top_k_encoder_over_a_whole_prefix_is_the_reference_final_hidden_state(tiny_model, k):
    ref = frozen_copy(tiny_model.model)

    def traj(task, pairs):
        rec = TokenRecord()
        return Trajectory(task, turns=[Turn("x", span=rec.add_turn(p, a, [0.0] * len(a))) for p, a in pairs], record=rec)

    first = [11, 12, 13, 14, 15]
    batch = pack_batch([traj("a", [(first, [16, 17]), (first + [16, 17, 18, 19], [20, 21, 22])]),
                        traj("b", [([31, 32], [33])])], pad_id=0)
    encoder = TrunkTopEncoder(ref, k)
    _, final = reference_pass(ref, batch, True)
    _, trunk = reference_pass(ref, batch, True, hidden_layer=encoder.trunk_layer)
    at = torch.cat([batch.state_pos, batch.action_pos])
    with torch.no_grad():
        phi = encoder(*gather_windows(trunk, at, batch.input_ids.shape[1] + 2))
        short = encoder(*gather_windows(trunk, at, 2))
    assert_close(phi, final[at[:, 0], at[:, 1]], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(short, phi, atol=1e-3)  # a 2-token window sees less (the test has teeth)


# ----- the trainer on the tiny model ----------------------------------------------------------------
def _cfg(**kw):
    base = dict(iterations=1, episodes_per_iter=4, num_envs=4, max_new_tokens=8, critic_epochs=4, critic_states=6,
                critic_batch_size=4, actor_states=3, actor_epochs=2, warmup_iters=0, critic_encoder="top:1",
                critic_window=8, trainable="all", actor_lr=1e-3, autocast="none")
    return ArcherConfig(**{**base, **kw})


def test_an_iteration_trains_the_critics_own_blocks_and_the_actor_and_leaves_the_reference(policy, tmp_path):
    trainer = ArcherTrainer(policy, ENV, _cfg(), out_dir=tmp_path)
    trainer.setup()
    encoder, ref = trainer.critic.encoder, trainer.ref
    assert encoder.trunk_layer == 1 and trainer.critic_opt.param_groups[1]["lr"] == 1e-5
    ref_before, enc_before = copy.deepcopy(ref.state_dict()), copy.deepcopy(encoder.state_dict())
    target_before = copy.deepcopy(trainer.critic_target.state_dict())
    actor_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    row = trainer.step()
    assert math.isfinite(row["critic/q_loss"]) and math.isfinite(row["actor/pg_loss"]) and row["actor/active"] == 1.0
    assert len(trainer.buffer) == int(row["rollout/env_steps"])  # every turn, once
    after = encoder.state_dict()
    assert all(not torch.equal(v, after[k]) for k, v in enc_before.items())  # every block weight and the norm
    assert any(not torch.equal(v, trainer.critic_target.state_dict()[k]) for k, v in target_before.items())
    assert all(torch.equal(v, ref.state_dict()[k]) for k, v in ref_before.items())
    assert any(not torch.equal(actor_before[n], p) for n, p in trainer.model.named_parameters())
    s, pos = trainer.buffer.get("s", torch.tensor([0, 1]))
    assert s.shape == (2, 8, 64) and pos.shape == (2, 8)


def test_warm_up_iterations_train_the_critic_alone(policy, tmp_path):
    trainer = ArcherTrainer(policy, ENV, _cfg(warmup_iters=1), out_dir=tmp_path)
    trainer.setup()
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    row = trainer.step()
    assert row["actor/active"] == 0.0 and "actor/pg_loss" not in row and "critic/q_loss" in row
    assert all(torch.equal(before[n], p) for n, p in trainer.model.named_parameters())


def test_the_actor_gets_min_q_minus_min_v_of_a_fresh_reply_at_buffer_states(policy, tmp_path, monkeypatch):
    """The actor's advantage at a buffer state, by hand: a critic whose Q and V are known constants."""
    trainer = ArcherTrainer(policy, ENV, _cfg(actor_epochs=1), out_dir=tmp_path)
    trainer.setup()
    trainer.step()  # fills the buffer
    probe = _Probe(v1=0.25, q2_shift=-100.0)  # Q2 < Q1 and V1 < V2 here: both minimums are exercised
    sampled, seen = [], {}
    replies = trainer.sample_replies

    def spy_replies(prompts, offset=0, groups=None):
        out = replies(prompts, offset, groups)
        sampled.append((prompts, out))
        return out

    monkeypatch.setattr(trainer, "sample_replies", spy_replies)
    monkeypatch.setattr(trainer.encoder, "replies", lambda prompts, ids, groups=None: (
        torch.full((len(ids), 2), 1000.0), torch.tensor([[float(len(a)), 0.0] for a in ids])))
    trainer.critic = probe
    monkeypatch.setattr(archer_core, "actor_update", lambda model, opt, batch, token_adv, *a, **kw: seen.update(
        batch=batch, adv=token_adv) or {"actor/pg_loss": 0.0})
    trainer.update_actor()
    prompts, gens = sampled[-1]
    held = [trainer.buffer.prompt(i) for i in range(len(trainer.buffer))]
    assert len(prompts) >= trainer.cfg.actor_states and all(p in held for p in prompts)  # whole episodes of the buffer
    # min(Q1, Q2) = min(n, 2n - 100) = 2n - 100 for a reply of n tokens; min(V1, V2) = min(0.25, 1000) = 0.25
    expect = [2 * len(g.action_ids) - 100 - 0.25 for g in gens if g.action_ids]
    batch = seen["batch"]
    for turn, row_adv in enumerate(expect):  # every token of a' carries its reply's advantage
        tokens = seen["adv"][batch.token_turn == turn]
        assert_close(tokens, torch.full_like(tokens, row_adv))
    assert int((batch.token_turn >= 0).sum()) == sum(len(g.action_ids) for g in gens)


def test_v_targets_read_fresh_replies_sampled_at_buffer_states(policy, tmp_path, monkeypatch):
    trainer = ArcherTrainer(policy, ENV, _cfg(), out_dir=tmp_path)
    trainer.setup()
    trainer.step()
    seen = {}
    fit = trainer.fit_critic
    monkeypatch.setattr(trainer, "fit_critic", lambda c, tg, o, pool: seen.update(pool=pool) or fit(c, tg, o, pool))
    trainer.update_critic()
    pool = seen["pool"]
    assert pool["reward"].shape[0] >= trainer.cfg.critic_states  # whole episodes, at least that many states
    assert pool["fresh_sa"][0].shape == pool["sa"][0].shape  # a' encoded as the recorded replies are


def test_an_episodes_states_share_their_prefix_and_give_what_one_record_each_gives(policy, tmp_path):
    trainer = ArcherTrainer(policy, ENV, _cfg(), out_dir=tmp_path)
    trainer.setup()
    trainer.step()
    episodes = trainer.buffer.sample_episodes(6)
    prompts = [trainer.buffer.prompt(i) for g in episodes for i in g]
    groups, start = [], 0
    for g in episodes:
        groups.append(list(range(start, start + len(g))))
        start += len(g)
    assert any(len(g) > 1 for g in groups)  # several states of one episode, each prompt extending the last
    for g in groups:
        assert all(prompts[b][: len(prompts[a])] == prompts[a] for a, b in zip(g, g[1:]))
    alone = trainer.sample_replies(prompts, offset=7)
    shared = trainer.sample_replies(prompts, offset=7, groups=groups)
    unique = [i for i, p in enumerate(prompts) if prompts.count(p) == 1]  # a repeated prompt's draws go by batch order
    assert unique and [shared[i].action_ids for i in unique] == [alone[i].action_ids for i in unique]  # less prefill
    ids = [g.action_ids for g in alone]
    for a, b in zip(trainer.encoder.replies(prompts, ids), trainer.encoder.replies(prompts, ids, groups)):
        assert_close(a[0], b[0], atol=1e-4, rtol=1e-4)  # the windows' states
        assert torch.equal(a[1], b[1])  # and positions


def test_a_resumed_run_continues_exactly(tiny_tokenizer, tmp_path):
    from turngym.agents.hf import HFPolicy

    def make(out, iterations):
        pol = HFPolicy(build_tiny_model(tiny_tokenizer), tiny_tokenizer, generation_dtype=torch.float32)
        return ArcherTrainer(pol, ENV, _cfg(iterations=iterations, episodes_per_iter=2, num_envs=2), out_dir=tmp_path / out)

    rows = make("full", 2).train(progress=False)
    make("killed", 1).train(progress=False)
    resumed = make("killed", 2)
    resumed.setup()
    resumed.load(tmp_path / "killed" / "checkpoint")
    assert len(resumed.critic_opt.state) == len(list(resumed.critic.parameters()))  # the encoder's moments too
    nxt = resumed.step()
    for key in ("rollout/success", "critic/q_loss", "critic/v_loss", "actor/pg_loss", "adv/mean"):
        assert nxt[key] == pytest.approx(rows[1][key], rel=1e-5, abs=1e-6), key


def test_config_is_checked_before_any_cpu_is_spent():
    with pytest.raises(ValueError, match="critic_encoder"):
        ArcherConfig(critic_encoder="top:x")
    with pytest.raises(ValueError, match="critic_encoder_lr"):
        ArcherConfig(critic_encoder="reference", critic_encoder_lr=1e-3)  # no encoder trains: read by nothing
    with pytest.raises(ValueError, match="tau"):
        ArcherConfig(tau=0.0)
    with pytest.raises(ValueError, match="unknown ArCHer plug-in"):
        ArcherConfig(plugins=["beam"])
    with pytest.raises(ValueError, match="needs"):
        ArcherConfig(plugins=["awr"])  # awr reads the tree's sibling groups
    with pytest.raises(ValueError, match="awr: beta"):
        ArcherConfig(plugins=["tree", {"name": "awr", "beta": 0}])
