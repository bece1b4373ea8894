"""ArCHer's wiring, checked on numbers worked by hand: the replay transitions a packed batch gives
(reward, done, next state), the replay buffer, and the TD loss the trainer and the probe script run."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch.testing import assert_close

from turngym.trainers.archer import ReplayBuffer, UtteranceCritic, make_target, td_loss, transitions


def t(x):
    return torch.tensor(x, dtype=torch.float32)


def test_transitions_chain_turns_of_one_episode_and_end_at_its_last_turn():
    # episode 0 has turns 0, 1, 2; episode 1's turn 0 carried no tokens (a scripted opening), so
    # the batch holds its turn 1 only: it is the last turn there, and nothing bootstraps across episodes
    batch = SimpleNamespace(turn_refs=[(0, 0), (0, 1), (0, 2), (1, 1)])
    rewards = [[0.0, 0.5, 1.0], [-0.1, 0.2]]
    s = t([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0], [4.0, 4.0]])
    r, done, nxt = transitions(batch, rewards, s)
    assert_close(r, t([0.0, 0.5, 1.0, 0.2]))
    assert_close(done, t([0.0, 0.0, 1.0, 1.0]))
    assert_close(nxt, t([[2.0, 2.0], [3.0, 3.0], [0.0, 0.0], [0.0, 0.0]]))


def test_transitions_do_not_bridge_a_gap_inside_an_episode():
    batch = SimpleNamespace(turn_refs=[(0, 0), (0, 2)])  # turn 1 carried no tokens
    r, done, nxt = transitions(batch, [[1.0, 2.0, 3.0]], t([[1.0], [3.0]]))
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
    assert_close(buf.s[:, 0], t([4.0, 2.0, 3.0]))
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
