"""Acting with the critic (``trainers.archer.acting``): the choice rule by hand, a critic that knows the
answer winning through a policy that does not, an indifferent critic leaving greedy play untouched,
and the chosen replies recorded token for token, with or without the KV cache kept across turns."""

from __future__ import annotations

import pytest
import torch

from turngym.agents.base import SamplingParams
from turngym.agents.hf import HFPolicy
from turngym.rollout import EpisodeSpec, make_env_factory, rollout
from turngym.trainers.archer.acting import CriticGuidedPolicy, pick_reply
from turngym.trainers.archer.critic_rank import reply_scores

from fixtures_model import EveryGuess, build_tiny_model

ENV = "tests/Guess-v0"
TEXT = {"tool_format": "text"}  # the whole reply is the guess
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=6)


def _play(policy, tasks=("2", "3", "4")):
    specs = [EpisodeSpec(t, 7) for t in tasks]
    return rollout(policy, make_env_factory(ENV, **TEXT), specs, sampling=GREEDY, progress=False)


def test_pick_reply_by_hand():
    assert pick_reply([0.1, 0.5, 0.3]) == 1
    assert pick_reply([0.1, 0.5, 0.3], margin=0.3) == 1  # 0.5 > 0.1 + 0.3
    assert pick_reply([0.1, 0.5, 0.3], margin=0.4) == 0  # 0.5 is not above 0.1 + 0.4
    assert pick_reply([0.2, 0.7, 0.7]) == 1  # the first of equals
    assert pick_reply([0.4, 0.4, 0.1]) == 0  # a tie with the policy's own reply keeps it
    assert pick_reply([0.0]) == 0


def test_a_critic_that_knows_the_answer_wins_through_the_policy(tiny_tokenizer):
    policy = EveryGuess(build_tiny_model(tiny_tokenizer), tiny_tokenizer, generation_dtype=torch.float32)
    alone = _play(policy)
    assert not any(t.success for t in alone)  # the tiny random model guesses no secret

    def knows(secret):  # Q = 1 for the reply that names the task's secret, else 0
        return lambda prompt, replies: [float(tiny_tokenizer.decode(ids).startswith(secret)) for ids in replies]

    for task in ("2", "3", "4"):
        guided = CriticGuidedPolicy(policy, knows(task), k=8)
        (traj,) = _play(guided, (task,))
        assert traj.success and len(traj.turns) == 1 and guided.stats == {"turns": 1, "moved": 1}
        want = policy.chat.encode(task) + sorted(policy.chat.end_token_ids)[:1]
        assert traj.action_ids(0) == want and traj.turns[0].action_text == task
        assert traj.action_logprobs(0) == [0.0] * len(want)  # the runner-up's own recorded log-probs


def test_an_indifferent_critic_leaves_greedy_play_alone(tiny_tokenizer):
    policy = HFPolicy(build_tiny_model(tiny_tokenizer), tiny_tokenizer, generation_dtype=torch.float32)
    alone = _play(policy)
    guided = CriticGuidedPolicy(policy, lambda prompt, replies: [0.0] * len(replies), k=3)
    played = _play(guided)
    assert guided.stats["moved"] == 0 and guided.stats["turns"] == sum(len(t.turns) for t in played)
    for a, b in zip(alone, played):
        assert [a.action_ids(j) for j in range(len(a.turns))] == [b.action_ids(j) for j in range(len(b.turns))]


@pytest.mark.parametrize("reuse_cache", [True, False])
def test_a_played_runner_up_is_recorded_as_if_sampled(tiny_tokenizer, reuse_cache):
    # the critic always prefers the last runner-up: every turn is replaced, and the next turn's prompt
    # extends the record with exactly the played reply; the KV cache kept from the greedy reply changes
    # nothing (the same replies with the cache off)
    model = build_tiny_model(tiny_tokenizer)
    policy = HFPolicy(model, tiny_tokenizer, generation_dtype=torch.float32, reuse_cache=reuse_cache)
    guided = CriticGuidedPolicy(policy, lambda prompt, replies: [float(i) for i in range(len(replies))], k=2)
    played = _play(guided)
    assert guided.stats["moved"] == guided.stats["turns"] == sum(len(t.turns) for t in played)
    for traj in played:
        for j in range(len(traj.turns)):
            prompt, action = traj.prompt_ids(j), traj.action_ids(j)
            greedy = policy.generate([prompt], GREEDY, [[]])[0][0].action_ids  # what plain play would say
            runner_ups = policy.alternatives([prompt], [greedy], 2, max_new_tokens=6)[0]
            assert action == runner_ups[-1].action_ids != greedy
            if j + 1 < len(traj.turns):
                assert traj.prompt_ids(j + 1)[: len(prompt) + len(action)] == prompt + action
    if reuse_cache:
        fresh = CriticGuidedPolicy(HFPolicy(model, tiny_tokenizer, generation_dtype=torch.float32, reuse_cache=False),
                                   guided.values, k=2)
        again = _play(fresh)
        assert [[t.action_ids(j) for j in range(len(t.turns))] for t in again] == \
               [[t.action_ids(j) for j in range(len(t.turns))] for t in played]


def test_critic_guided_acting_needs_runner_ups():
    with pytest.raises(ValueError, match="runner-up"):
        CriticGuidedPolicy(object(), lambda p, r: [], k=2)
    with pytest.raises(ValueError, match="k >= 1"):
        CriticGuidedPolicy(object(), lambda p, r: [], k=0)


def test_reply_scores_by_hand():
    # values 0.2, 0.9; log-probs sum to -0.1 and -3.0: with prior 0.5 the runner-up scores 0.9 - 1.5 = -0.6
    assert reply_scores([0.2, 0.9], [[-0.05, -0.05], [-1.0, -2.0]], 0.5) == pytest.approx([0.15, -0.6])
    assert reply_scores([0.2, 0.9], [[-0.05], [-3.0]], 0.0) == [0.2, 0.9]
    assert pick_reply(reply_scores([0.2, 0.9], [[-0.1], [-3.0]], 0.5)) == 0  # the prior keeps the actor's reply


def test_runner_ups_are_scored_from_the_greedy_replys_cache(tiny_tokenizer, monkeypatch):
    # the same replies whether alternatives starts from the turn's held KV cache or prefills the
    # history again; with the cache, every turn after the first prefills fewer tokens
    def played(held):
        policy = HFPolicy(build_tiny_model(tiny_tokenizer), tiny_tokenizer, generation_dtype=torch.float32)
        assert policy.packed is not None  # the engine that forks a held cache
        if not held:
            monkeypatch.setattr(policy, "held_cache", lambda conv: None)
        guided = CriticGuidedPolicy(policy, lambda prompt, replies: [float(i) for i in range(len(replies))], k=2)
        trajs = _play(guided)
        return [[t.action_ids(j) for j in range(len(t.turns))] for t in trajs], policy.stats["prefill_tokens"]

    with_cache, prefilled = played(True)
    again, prefilled_again = played(False)
    assert with_cache == again and max(len(t) for t in with_cache) > 1
    assert prefilled < prefilled_again
