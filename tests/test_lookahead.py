"""Greedy decoding with prompt-lookup drafts (``agents/lookahead.py``): the drafts by hand, and the
same tokens, log-probs and caches as one token per forward."""

from __future__ import annotations

import torch
from fixtures_model import build_tiny_model

from turngym.agents.base import SamplingParams
from turngym.agents.hf import HFPolicy
from turngym.agents.lookahead import draft


def test_drafts_by_hand():
    # the last 3 tokens (5, 6, 7) occurred before, followed by 8, 9
    assert draft([5, 6, 7, 8, 9, 1, 5, 6, 7], 2) == [8, 9]
    # the latest earlier occurrence wins
    assert draft([1, 2, 3, 1, 2, 4, 1, 2], 5) == [4, 1, 2]
    # no 3-gram or 2-gram match: the last token alone
    assert draft([9, 4, 8, 7, 3, 8], 1) == [7]
    # longer n-grams first: (2, 3) matches at the start although 3 alone occurs later
    assert draft([2, 3, 5, 3, 6, 2, 3], 1) == [5]
    assert draft([1, 2, 3], 4) == [] and draft([7], 3) == [] and draft([1, 1], 0) == []
    # a byte pattern that straddles two tokens is no match: 256, 0 holds the bytes of 1 at offset 1
    assert draft([256, 0, 7, 1], 2) == []
    assert draft([4, 4, 4], 3) == [4]  # the tail's own occurrence does not count


def _policies(tiny_tokenizer):
    """Two policies over one tiny model that mostly answers token t with t + 1 (its blocks barely
    change a token's embedding, and the head row of v is the embedding of v - 1), so a prompt that
    holds runs of consecutive ids gets drafts that are partly right."""
    model = build_tiny_model(tiny_tokenizer)
    with torch.no_grad():
        model.lm_head.weight.copy_(model.model.embed_tokens.weight.roll(1, dims=0))
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(0.05)
            layer.mlp.down_proj.weight.mul_(0.05)
    one = HFPolicy(model, tiny_tokenizer, generation_dtype=torch.float32, draft_tokens=0)
    drafted = HFPolicy(model, tiny_tokenizer, generation_dtype=torch.float32, draft_tokens=4)
    return one, drafted


def test_drafted_greedy_decoding_picks_the_same_tokens_as_one_at_a_time(tiny_tokenizer):
    one, drafted = _policies(tiny_tokenizer)
    prompts = [[10, 11, 12, 13, 77, 78, 10], [300, 301, 302, 303, 304, 305, 306, 5, 300], list(range(20, 60)),
               [900, 5, 901, 902, 6, 903, 904, 905, 7, 8, 900]]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    want, want_caches = one.generate(prompts, greedy, [[]] * 4)
    got, got_caches = drafted.generate(prompts, greedy, [[]] * 4)
    assert want[0].action_ids[:4] == [11, 12, 13, 14]  # the model counts up
    assert 0 < drafted.stats["accepted"] < drafted.stats["drafted"]  # some drafts kept, some cut off
    assert drafted.stats["decode_steps"] < one.stats["decode_steps"]
    for p, w, d, wc, dc in zip(prompts, want, got, want_caches, got_caches):
        assert d.action_ids == w.action_ids and d.finish_reason == w.finish_reason
        torch.testing.assert_close(torch.tensor(d.logprobs), torch.tensor(w.logprobs), atol=1e-4, rtol=1e-4)
        # the cache holds the prompt and the reply but its last token, nothing rejected
        assert dc.ids == wc.ids == (p + d.action_ids)[:-1]
        for kw, kd in zip(wc.keys, dc.keys):
            torch.testing.assert_close(kd[:, : len(wc.ids)], kw[:, : len(wc.ids)], atol=1e-4, rtol=1e-4)


def test_sampling_does_not_draft(tiny_tokenizer):
    _, drafted = _policies(tiny_tokenizer)
    drafted.generate([[5, 6, 7] * 5], SamplingParams(temperature=1.0, max_new_tokens=8, seed=0), [[]])
    assert drafted.stats.get("drafted", 0) == 0
