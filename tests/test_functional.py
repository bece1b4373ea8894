"""Every pure trainer function against numbers worked out by hand."""

import math

import pytest
import torch
from torch.testing import assert_close

from turngym.trainers import functional as Fn
from turngym.trainers.gigpo import gigpo_advantages, gigpo_step_advantages
from turngym.trainers.grpo import grpo_advantages
from turngym.trainers.reinforce import reinforce_advantages
from turngym.trainers.rloo import rloo_advantages

t = torch.tensor


def test_clipped_pg_loss_by_hand():
    old = torch.zeros(1, 3)
    new = torch.log(t([[1.5, 0.5, 1.0]]))
    adv = t([[1.0, 1.0, -2.0]])
    # token terms: min(1.5, 1.2)=1.2 ; min(0.5, 0.8)=0.5 ; -2 -> mean -0.1 -> loss 0.1
    loss, clip_frac = Fn.clipped_pg_loss(new, old, adv, torch.ones(1, 3), clip_coef=0.2)
    assert_close(loss, t(0.1))
    assert_close(clip_frac, t(2 / 3))
    masked, _ = Fn.clipped_pg_loss(new, old, adv, t([[1.0, 0.0, 0.0]]), clip_coef=0.2)
    assert_close(masked, t(-1.2))
    vanilla, _ = Fn.clipped_pg_loss(new, old, adv, torch.ones(1, 3), clip_coef=0.0)
    assert_close(vanilla, t(-(1.5 + 0.5 - 2.0) / 3))


def test_kl_k3_and_entropy():
    # r = log .25 - log .5 = -log 2 ; exp(r) - r - 1 = 0.5 + 0.693147 - 1
    assert_close(Fn.kl_k3(t([math.log(0.5)]), t([math.log(0.25)])), t([0.5 + math.log(2) - 1]))
    assert_close(Fn.kl_k3(t([-1.0]), t([-1.0])), t([0.0]))


def test_token_logprobs_and_entropy_by_hand():
    logits = torch.zeros(2, 4)
    logits[0, 1] = math.log(3)  # row 0: p = (1, 3, 1, 1) / 6
    logp, ent = Fn.token_logprobs_and_entropy(logits, torch.tensor([1, 2]), entropy=True)
    assert_close(logp, t([math.log(0.5), math.log(0.25)]))
    # row 0: -(3 * 1/6 log 1/6 + 1/2 log 1/2) ; row 1: uniform over 4 -> log 4
    assert_close(ent, t([-(0.5 * math.log(1 / 6) + 0.5 * math.log(0.5)), math.log(4)]))
    assert Fn.token_logprobs_and_entropy(logits, torch.tensor([0, 0]))[1] is None


def test_discounted_returns():
    assert_close(Fn.discounted_returns(t([0.0, 0.0, 1.0]), 0.5), t([0.25, 0.5, 1.0]))


def test_reinforce_rloo_grpo():
    r = t([[1.0, 0.0, 0.0, 1.0]])
    assert_close(reinforce_advantages(t([1.0, 3.0])), t([-1.0, 1.0]))
    # leave-one-out means: 1/3, 2/3, 2/3, 1/3
    assert_close(rloo_advantages(r), t([[2 / 3, -2 / 3, -2 / 3, 2 / 3]]))
    # mean .5, population std .5
    assert_close(grpo_advantages(r, eps=0.0), t([[1.0, -1.0, -1.0, 1.0]]))
    assert_close(grpo_advantages(r, scale_by_std=False), t([[0.5, -0.5, -0.5, 0.5]]))
    assert_close(grpo_advantages(t([[1.0, 1.0]])), t([[0.0, 0.0]]))  # all equal -> no signal


def test_gigpo_step_groups():
    # bucket (g,s): returns [1, 0] -> [1, -1]; (g,t) and (h,s) are singletons -> 0
    a = gigpo_step_advantages(t([1.0, 0.0, 0.5, 2.0]), ["g", "g", "g", "h"], ["s", "s", "t", "s"], eps=0.0)
    assert_close(a, t([1.0, -1.0, 0.0, 0.0]))


def test_gigpo_combines_episode_and_step_levels():
    # episode adv (GRPO over [1, 0]) = [1, -1]; steps (ep0,a,.81) (ep0,b,.9) (ep1,a,0)
    # step adv: bucket a -> [1, -1], bucket b -> 0 ; A = A_E + 0.5 * A_S
    a = gigpo_advantages(
        t([[1.0, 0.0]]), t([0.81, 0.9, 0.0]), t([0, 0, 1]), ["g"] * 3, ["a", "b", "a"], step_weight=0.5
    )
    assert_close(a, t([1.5, 1.0, -1.5]), atol=1e-5, rtol=0)


def test_masked_mean_handles_empty_masks():
    assert_close(Fn.masked_mean(t([1.0, 2.0]), t([0.0, 0.0])), t(0.0))
    assert_close(Fn.masked_mean(t([1.0, 3.0]), t([1.0, 1.0])), t(2.0))



def test_per_turn_values_broadcast_to_their_scored_tokens():
    per_turn = t([0.5, -1.0, 2.0])
    token_turn = torch.tensor([0, 0, 1, 2, 2])  # utterance 0 has 2 tokens, 1 has 1, 2 has 2
    assert_close(Fn.broadcast_to_tokens(per_turn, token_turn), t([0.5, 0.5, -1.0, 2.0, 2.0]))


def test_warmup_lr_ramps_linearly_then_holds():
    assert [Fn.warmup_lr(1e-4, k, 4) for k in range(6)] == [
        1e-4 * 0.25, 1e-4 * 0.5, 1e-4 * 0.75, 1e-4, 1e-4, 1e-4]
    assert Fn.warmup_lr(1e-4, 0, 0) == 1e-4  # no warm-up
