"""The likelihood update SFT and branch BC share: its loss is the mean NLL of the weighted tokens,
micro-batching does not change the step, and the KL guard needs a reference."""

from __future__ import annotations

import copy

import pytest
import torch
from fixtures_model import guess_demonstrations

from turngym.trainers.likelihood import likelihood_step, optimizer_steps
from turngym.trainers.sequences import pack_batch, score


@pytest.fixture
def demos(policy):
    return guess_demonstrations(policy)


def test_the_loss_is_the_mean_nll_of_the_weighted_tokens(policy, demos):
    model = policy.model
    batch = pack_batch(demos, policy.pad_id)
    with torch.no_grad():
        logprobs = score(model, batch).logprobs
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    half = (torch.arange(batch.num_tokens) % 2).float()  # every other token
    stats = likelihood_step(model, opt, [(batch, half)], lr=1e-3, max_grad_norm=1.0)
    torch.testing.assert_close(torch.tensor(stats["loss"]), -(logprobs * half).sum() / batch.num_tokens)
    assert stats["kl"] == 0.0 and optimizer_steps(opt) == 1 and opt.param_groups[0]["lr"] == 1e-3


def test_micro_batches_make_the_same_step_as_one_batch(policy, demos):
    one, two = copy.deepcopy(policy.model), copy.deepcopy(policy.model)
    batch = pack_batch(demos, policy.pad_id)
    ones = torch.ones(batch.num_tokens)
    whole = likelihood_step(one, torch.optim.SGD(one.parameters(), lr=0.1), [(batch, ones)], lr=0.1, max_grad_norm=1e9)
    chunks = []
    for rows in ([0, 1], [2, 3]):
        sub, keep = batch.select_rows(rows)
        chunks.append((sub, ones[keep]))
    split = likelihood_step(two, torch.optim.SGD(two.parameters(), lr=0.1), chunks, lr=0.1, max_grad_norm=1e9)
    assert split["loss"] == pytest.approx(whole["loss"], rel=1e-5)
    for a, b in zip(one.parameters(), two.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_the_kl_guard_needs_a_reference_and_pulls_toward_it(policy, demos):
    batch = pack_batch(demos, policy.pad_id)
    ones = torch.ones(batch.num_tokens)
    model = policy.model
    with pytest.raises(ValueError, match="reference"):
        likelihood_step(model, torch.optim.SGD(model.parameters(), lr=0.1), [(batch, ones)], lr=0.1, max_grad_norm=1.0,
                        kl_coef=0.5)
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.01 * torch.randn_like(p))  # a reference away from the policy: KL > 0
    guarded, plain = copy.deepcopy(model), copy.deepcopy(model)
    stats = likelihood_step(guarded, torch.optim.SGD(guarded.parameters(), lr=0.1), [(batch, ones)], lr=0.1,
                            max_grad_norm=1e9, ref=ref, kl_coef=1.0)
    likelihood_step(plain, torch.optim.SGD(plain.parameters(), lr=0.1), [(batch, ones)], lr=0.1, max_grad_norm=1e9)
    assert stats["kl"] > 0
    assert any(not torch.allclose(a, b) for a, b in zip(guarded.parameters(), plain.parameters()))
