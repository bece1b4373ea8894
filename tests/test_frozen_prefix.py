"""The frozen lower blocks' output computed once per fit (``sequences.frozen_prefix``): the split
forward scores and trains exactly as the whole one, minibatches and joined demonstrations carry the
right rows, and it stays off where it would not be exact (all trainable, LoRA, dropout)."""

from __future__ import annotations

import copy

import pytest
import torch
from fixtures_model import build_tiny_model, guess_demonstrations

from turngym.agents.hf import HFPolicy
from turngym.trainers.actor import prepare_trainable
from turngym.trainers.likelihood import likelihood_step
from turngym.trainers.sequences import frozen_blocks, frozen_prefix, join_prefixes, pack_batch, score


@pytest.fixture
def deep(tiny_tokenizer):
    """A tiny 4-block model whose top 2 blocks train."""
    model = build_tiny_model(tiny_tokenizer, num_hidden_layers=4)
    return HFPolicy(prepare_trainable(model, "top:2"), tiny_tokenizer, generation_dtype=torch.float32)


@pytest.fixture
def demos(deep):
    return guess_demonstrations(deep)


def _shorten(batch, pad_id, cuts):
    """Cut ``cuts[row]`` tokens off the end of those rows: rows of different lengths, right-padded."""
    for r, cut in cuts.items():
        n = int(batch.attention_mask[r].sum())
        batch.attention_mask[r, n - cut:] = 0
        batch.input_ids[r, n - cut:] = pad_id
        batch.score_mask[r, n - cut - 1:] = False
    return batch


def test_the_split_forward_scores_and_steps_as_the_whole_one(deep, demos):
    model = deep.model
    assert frozen_blocks(model) == 2
    batch = pack_batch(demos, deep.pad_id)
    split = frozen_prefix(model, batch, chunk_rows=3)  # chunks cut to their own longest row
    assert split.prefix[1] == 2 and split.prefix[2].shape[:2] == batch.input_ids.shape
    with torch.no_grad():
        torch.testing.assert_close(score(model, split).logprobs, score(model, batch).logprobs, atol=1e-5, rtol=1e-5)
    whole_model, split_model = copy.deepcopy(model), model
    ones = torch.ones(batch.num_tokens)
    chunks = lambda b: [(sub, ones[keep]) for sub, keep in (b.select_rows(r) for r in ([0, 2], [1, 3]))]
    a = likelihood_step(whole_model, torch.optim.SGD([p for p in whole_model.parameters() if p.requires_grad], lr=0.1),
                        chunks(batch), lr=0.1, max_grad_norm=1e9)
    b = likelihood_step(split_model, torch.optim.SGD([p for p in split_model.parameters() if p.requires_grad], lr=0.1),
                        chunks(split), lr=0.1, max_grad_norm=1e9)
    assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
    for (name, p), q in zip(whole_model.named_parameters(), split_model.parameters()):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5, msg=name)
    assert any(p.requires_grad for p in split_model.parameters())


def test_a_prefix_serves_only_its_own_model(deep, demos):
    batch = frozen_prefix(deep.model, pack_batch(demos, deep.pad_id), chunk_rows=4)
    other = copy.deepcopy(deep.model)
    with torch.no_grad():
        for p in other.model.layers[0].parameters():
            p.add_(0.1)  # a reference whose lower blocks differ: it must run them itself
        torch.testing.assert_close(score(other, batch).logprobs, score(other, pack_batch(demos, deep.pad_id)).logprobs)


def test_joined_prefixes_match_the_prefix_of_the_joined_batch(deep, demos):
    parts = [frozen_prefix(deep.model, pack_batch([t], deep.pad_id), 1) for t in demos]
    order = [2, 0, 3]
    batch = pack_batch([demos[i] for i in order], deep.pad_id)
    joined = join_prefixes(batch, [parts[i] for i in order])
    direct = frozen_prefix(deep.model, batch, chunk_rows=1)
    real = batch.attention_mask.bool()
    torch.testing.assert_close(joined.prefix[2][real], direct.prefix[2][real], atol=1e-6, rtol=1e-5)
    assert join_prefixes(batch, []) is batch


def test_no_prefix_where_it_would_not_be_exact(tiny_tokenizer):
    model = build_tiny_model(tiny_tokenizer, num_hidden_layers=4)
    assert frozen_blocks(prepare_trainable(copy.deepcopy(model), "all")) == 0  # nothing frozen
    assert frozen_blocks(prepare_trainable(copy.deepcopy(model), "lora")) == 0  # adapters in every block
    dropout = build_tiny_model(tiny_tokenizer, num_hidden_layers=4, attention_dropout=0.1)
    assert frozen_blocks(prepare_trainable(dropout, "top:2")) == 0  # each pass would drop differently
    trained_embeddings = prepare_trainable(copy.deepcopy(model), "top:2")
    trained_embeddings.get_input_embeddings().weight.requires_grad_(True)
    assert frozen_blocks(trained_embeddings) == 0
    batch_model = prepare_trainable(copy.deepcopy(model), "all")
    ids = torch.ones(1, 4, dtype=torch.long)
    from turngym.trainers.sequences import PackedBatch

    b = PackedBatch(ids, torch.ones_like(ids), torch.zeros(1, 4, dtype=torch.bool), ids, torch.zeros(0),
                    torch.zeros(0, dtype=torch.long), torch.zeros(0, 2, dtype=torch.long), torch.zeros(0, 2, dtype=torch.long))
    assert frozen_prefix(batch_model, b, 1) is b


def test_right_padded_batches_run_without_a_mask_and_score_the_same(deep, demos):
    from turngym.trainers.sequences import causal_kernel_mask

    right = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]])
    assert causal_kernel_mask(right) is None and causal_kernel_mask(torch.ones(2, 4)) is None
    left = torch.tensor([[0, 1, 1], [1, 1, 1]])
    assert causal_kernel_mask(left) is left
    batch = _shorten(pack_batch(demos, deep.pad_id), deep.pad_id, {1: 7, 3: 12})
    with torch.no_grad():
        got = score(deep.model, batch).logprobs
        want = []
        for r in range(batch.input_ids.shape[0]):  # each row alone, unpadded, through the model itself
            n = int(batch.attention_mask[r].sum())
            logits = deep.model(input_ids=batch.input_ids[r : r + 1, :n]).logits[0].log_softmax(-1)
            m = batch.score_mask[r, :n]
            want.append(logits[m].gather(-1, batch.targets[r, :n][m][:, None])[:, 0])
    torch.testing.assert_close(got, torch.cat(want), atol=1e-5, rtol=1e-5)


def test_packed_rows_score_and_backpropagate_as_the_padded_forward(deep, demos, monkeypatch):
    from turngym.trainers import sequences

    model = deep.model
    batch = frozen_prefix(model, _shorten(pack_batch(demos, deep.pad_id), deep.pad_id, {1: 7, 3: 12}), chunk_rows=4)
    assert sequences.packed_blocks_agree(model, 2)

    def logprobs_and_grads():
        model.zero_grad()
        lp = score(model, batch).logprobs
        lp.sum().backward()
        return lp.detach(), [p.grad.clone() for p in model.parameters() if p.requires_grad]

    packed_lp, packed_grads = logprobs_and_grads()
    monkeypatch.setattr(sequences, "packed_blocks_agree", lambda *a: False)  # the padded blocks instead
    padded_lp, padded_grads = logprobs_and_grads()
    torch.testing.assert_close(packed_lp, padded_lp, atol=1e-5, rtol=1e-5)
    for a, b in zip(packed_grads, padded_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_the_frozen_blocks_run_packed_and_give_the_padded_output(deep, demos, monkeypatch):
    from turngym.trainers import sequences

    batch = _shorten(pack_batch(demos, deep.pad_id), deep.pad_id, {1: 9})
    assert sequences.packed_blocks_agree(deep.model, 0, 2)
    packed = frozen_prefix(deep.model, batch, chunk_rows=4).prefix[2]
    monkeypatch.setattr(sequences, "packed_blocks_agree", lambda *a: False)
    padded = frozen_prefix(deep.model, batch, chunk_rows=4).prefix[2]
    real = batch.attention_mask.bool()
    torch.testing.assert_close(packed[real], padded[real], atol=1e-5, rtol=1e-5)
    assert not packed[~real].any()  # padding positions stay zero
