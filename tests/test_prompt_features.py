"""The critic's reply features for prompts that grow turn by turn (``archer.encoder.PromptFeatures``):
the same hidden states a whole forward over prompt + reply gives, each prompt's forward run only past
the longest earlier prompt it extends, and the keys and values it keeps never written."""

from __future__ import annotations

import pytest
import torch
from fixtures_model import build_tiny_model
from torch.testing import assert_close

from turngym.trainers.archer.encoder import PromptFeatures
from turngym.trainers.sequences import backbone_and_head


def _whole(model, prompt: list[int], reply: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """phi(s), phi(s, a) from one forward over prompt + reply, no cache: the definition."""
    backbone, _ = backbone_and_head(model)
    with torch.no_grad():
        h = backbone(input_ids=torch.tensor([prompt + reply])).last_hidden_state[0]
    return h[len(prompt) - 1], h[len(prompt) + len(reply) - 1]


@pytest.fixture
def model(tiny_tokenizer):
    return build_tiny_model(tiny_tokenizer)


def _ids(start: int, n: int) -> list[int]:
    return [(start + 7 * i) % 200 + 5 for i in range(n)]


def _check(features, model, prompt, replies):
    s, sa = features(prompt, replies)
    assert sa.shape[0] == len(replies)
    for reply, got in zip(replies, sa):
        want_s, want_sa = _whole(model, prompt, reply)
        assert_close(s, want_s, atol=1e-5, rtol=1e-5)
        assert_close(got, want_sa, atol=1e-5, rtol=1e-5)


def test_a_growing_prompt_runs_only_its_new_tokens_and_gives_the_whole_forwards_features(model):
    features = PromptFeatures(model)
    turn1 = _ids(0, 30)
    turn2 = turn1 + _ids(100, 4) + _ids(50, 12)  # the played reply, then the next observation
    turn3 = turn2 + _ids(9, 3) + _ids(70, 9)
    replies = [_ids(1, 3), _ids(2, 5), _ids(3, 1)]  # unequal lengths: right-padded in one batch
    for prompt in (turn1, turn2, turn3):
        _check(features, model, prompt, replies)
    assert features.stats["prefilled_tokens"] == len(turn3)  # 30, then 16, then 12 new tokens
    _check(features, model, turn2, replies)  # asked again: nothing prefilled
    assert features.stats["prefilled_tokens"] == len(turn3)
    other = _ids(3, 20)  # another episode: from its first token
    _check(features, model, other, replies[:1])
    assert features.stats["prefilled_tokens"] == len(turn3) + len(other)
    assert features.stats["prompt_tokens"] == len(turn1) + 2 * len(turn2) + len(turn3) + len(other)


def test_the_kept_keys_and_values_are_never_written(model):
    features = PromptFeatures(model)
    turn1 = _ids(0, 25)
    features(turn1, [_ids(1, 4)])
    (layers, phi_s, _), = features.held.values()
    before = [(k.clone(), v.clone()) for k, v in layers]
    features(turn1 + _ids(40, 10), [_ids(2, 3), _ids(3, 6)])  # extends turn1's keys and values
    features(turn1, [_ids(4, 2)] * 3)  # reuses them for three replies
    for (k, v), (k0, v0) in zip(layers, before):
        assert torch.equal(k, k0) and torch.equal(v, v0)


def test_the_budget_drops_the_least_recently_used_prompt(model):
    one = PromptFeatures(model)
    one(_ids(0, 20), [_ids(1, 2)])
    (_, _, size), = one.held.values()  # the bytes 20 tokens' keys and values take
    budget = PromptFeatures(model, budget_mb=1)
    budget.budget = 2 * size + size // 2  # room for two prompts of 20 tokens
    a, b, c = _ids(0, 20), _ids(60, 20), _ids(120, 20)
    for p in (a, b, a, c):  # a is used again after b: b is the least recently used when c comes
        _check(budget, model, p, [_ids(5, 3)])
    assert set(budget.held) == {tuple(a), tuple(c)}
    none = PromptFeatures(model, budget_mb=0)  # nothing kept: every prompt from its first token, still exact
    _check(none, model, a, [_ids(5, 3)])
    _check(none, model, a + _ids(9, 4), [_ids(5, 3)])
    assert not none.held and none.stats["prefilled_tokens"] == 2 * len(a) + 4
