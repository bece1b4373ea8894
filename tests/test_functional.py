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


def test_td_target_with_terminals():
    # 1 + 0.9*2 = 2.8 ; terminal -> 0 ; 0.5 + 0.9*4 = 4.1
    assert_close(Fn.td_target(t([1.0, 0.0, 0.5]), t([2.0, 3.0, 4.0]), t([0.0, 1.0, 0.0]), 0.9), t([2.8, 0.0, 4.1]))


def test_double_q_min_and_advantage():
    q = Fn.double_q_min(t([1.0, 5.0]), t([2.0, 3.0]))
    assert_close(q, t([1.0, 3.0]))
    assert_close(Fn.utterance_advantage(q, t([0.5, 4.0])), t([0.5, -1.0]))


def test_polyak_update():
    assert_close(Fn.polyak(t([0.0]), t([10.0]), 0.1), t([1.0]))
    assert_close(Fn.polyak(t([1.0, 2.0]), t([3.0, 6.0]), 0.5), t([2.0, 4.0]))


def test_utterance_advantage_broadcast_to_its_scored_tokens():
    per_turn = t([0.5, -1.0, 2.0])
    token_turn = torch.tensor([0, 0, 1, 2, 2])  # utterance 0 has 2 tokens, 1 has 1, 2 has 2
    assert_close(Fn.broadcast_to_tokens(per_turn, token_turn), t([0.5, 0.5, -1.0, 2.0, 2.0]))


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


def test_hl_gauss_categorical_value():
    support = t([0.0, 1.0])
    assert_close(Fn.hl_gauss_target(t([0.0, 0.5]), support, sigma=0.01), t([[1.0, 0.0], [0.5, 0.5]]))
    assert_close(Fn.categorical_expectation(torch.zeros(1, 2), support), t([0.5]))
    assert_close(Fn.categorical_value_loss(torch.zeros(1, 2), t([0.5]), support, 0.01), t(math.log(2)))


def test_masked_mean_handles_empty_masks():
    assert_close(Fn.masked_mean(t([1.0, 2.0]), t([0.0, 0.0])), t(0.0))
    assert_close(Fn.masked_mean(t([1.0, 3.0]), t([1.0, 1.0])), t(2.0))


def test_td_advantage_by_hand():
    r = torch.tensor([0.0, 1.0, 0.0])
    v = torch.tensor([0.5, 0.8, 0.2])
    v_next = torch.tensor([0.8, 9.0, 0.4])  # the middle turn ends the episode: its V(s') is ignored
    done = torch.tensor([0.0, 1.0, 0.0])
    # 0 + .9*.8 - .5 = .22;  1 - .8 = .2;  0 + .9*.4 - .2 = .16
    torch.testing.assert_close(Fn.td_advantage(r, v, v_next, done, 0.9), torch.tensor([0.22, 0.2, 0.16]))


def test_warmup_lr_ramps_linearly_then_holds():
    assert [Fn.warmup_lr(1e-4, k, 4) for k in range(6)] == [
        1e-4 * 0.25, 1e-4 * 0.5, 1e-4 * 0.75, 1e-4, 1e-4, 1e-4]
    assert Fn.warmup_lr(1e-4, 0, 0) == 1e-4  # no warm-up


# two episodes laid end to end: turns 0-2, then 3-4 (gamma = 0.5)
GAE_R, GAE_V = t([0.0, 0.0, 1.0, 0.0, 0.5]), t([0.5, 0.2, 0.4, 0.1, 0.3])
GAE_NEXT, GAE_DONE = t([0.2, 0.4, 0.0, 0.3, 0.0]), t([0.0, 0.0, 1.0, 0.0, 1.0])


def test_gae_advantages_by_hand():
    # deltas: 0 + .5*.2 - .5 = -.4 ; .5*.4 - .2 = 0 ; 1 - .4 = .6 ; .5*.3 - .1 = .05 ; .5 - .3 = .2
    # gamma * lam = .25, reset at each done: A4 = .2 ; A3 = .05 + .25*.2 = .1 ; A2 = .6 ;
    # A1 = 0 + .25*.6 = .15 ; A0 = -.4 + .25*.15 = -.3625
    got = Fn.gae_advantages(GAE_R, GAE_V, GAE_NEXT, GAE_DONE, gamma=0.5, lam=0.5)
    assert_close(got, t([-0.3625, 0.15, 0.6, 0.1, 0.2]))


def test_gae_lambda_0_is_the_td_advantage_and_lambda_1_the_return_minus_v():
    assert_close(Fn.gae_advantages(GAE_R, GAE_V, GAE_NEXT, GAE_DONE, 0.5, 0.0),
                 Fn.td_advantage(GAE_R, GAE_V, GAE_NEXT, GAE_DONE, 0.5))
    # returns: episode 0 [.25, .5, 1], episode 1 [.25, .5]; minus V
    mc = torch.cat([Fn.discounted_returns(GAE_R[:3], 0.5), Fn.discounted_returns(GAE_R[3:], 0.5)])
    assert_close(mc, t([0.25, 0.5, 1.0, 0.25, 0.5]))
    assert_close(Fn.gae_advantages(GAE_R, GAE_V, GAE_NEXT, GAE_DONE, 0.5, 1.0), mc - GAE_V)
    assert_close(mc - GAE_V, t([-0.25, 0.3, 0.6, 0.15, 0.2]))


def test_center_subtracts_the_batch_mean_only():
    assert_close(Fn.center(t([1.0, 2.0, 6.0])), t([-2.0, -1.0, 3.0]))  # mean 3, std untouched
    assert_close(Fn.center(t([0.7])), t([0.7]))


def test_auc_by_hand_with_ties_and_unknown_labels():
    scores = t([0.9, 0.5, 0.5, 0.1, 0.3])
    labels = t([1.0, 1.0, 0.0, 0.0, float("nan")])  # the last turn has no label and is left out
    # pairs (pos, neg): (.9,.5) 1 ; (.9,.1) 1 ; (.5,.5) tie 1/2 ; (.5,.1) 1 -> 3.5 / 4
    assert Fn.auc(scores, labels) == 0.875
    assert Fn.auc(t([0.1, 0.2]), t([0.0, 1.0])) == 1.0 and Fn.auc(t([0.2, 0.1]), t([0.0, 1.0])) == 0.0
    assert math.isnan(Fn.auc(scores, t([1.0] * 5))) and math.isnan(Fn.auc(scores, t([0.0] * 5)))


def test_sibling_auc_by_hand():
    # group A: values 1 > 0 > 0 (the first earned more): scores 0.9, 0.1, 0.5 -> pairs (0,1) right, (0,2) right
    # group B: values 0, 1: scores 0.3, 0.3 -> one tie = 1/2.  AUC = (1 + 1 + 0.5) / 3
    scores = torch.tensor([0.9, 0.1, 0.5, 0.3, 0.3])
    values = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0])
    auc, pairs = Fn.sibling_auc(scores, values, [[0, 1, 2], [3, 4]])
    assert pairs == 3
    torch.testing.assert_close(auc, 2.5 / 3)
    assert math.isnan(Fn.sibling_auc(scores, torch.zeros(5), [[0, 1]])[0])  # equal values: no pair


def test_sibling_auc_interval_resamples_states_by_hand():
    # the groups above: A has 2 of 2 pairs right, B 0.5 of 1. Resampling the 2 states gives AA (AUC 1)
    # with p = 1/4, AB or BA (2.5/3) with 1/2, BB (0.5) with 1/4: the 2.5% and 97.5% quantiles are 0.5 and 1
    scores = torch.tensor([0.9, 0.1, 0.5, 0.3, 0.3])
    values = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0])
    assert Fn.sibling_auc_interval(scores, values, [[0, 1, 2], [3, 4]]) == (0.5, 1.0)
    assert Fn.sibling_auc_interval(scores, values, [[0, 1, 2]]) == (1.0, 1.0)  # one state: nothing varies
    assert all(math.isnan(x) for x in Fn.sibling_auc_interval(scores, torch.zeros(5), [[0, 1]]))


def test_sibling_awr_weights_by_hand():
    # one state, greedy reply p=0.9 (A=0) and a runner-up p=0.1 that earned more (A=0.2), beta=0.1:
    # pi* ~ 0.9 * e^0 : 0.1 * e^2  ->  w = (0.9, 0.1 e^2) / (0.9 + 0.1 e^2)
    logp = torch.log(torch.tensor([0.9, 0.1, 0.5, 0.5, 1.0]))
    adv = torch.tensor([0.0, 0.2, 0.0, 0.0, 3.0])
    w = Fn.sibling_awr_weights(logp, adv, [[0, 1], [2, 3]], beta=0.1)
    z = 0.9 + 0.1 * math.exp(2.0)
    torch.testing.assert_close(w, torch.tensor([0.9 / z, 0.1 * math.exp(2.0) / z, 0.5, 0.5, 0.0]))


def test_self_imitation_weights_by_hand():
    # won (R=1) where V said 0.25 -> 0.75 x 2 = 1.5; won where V said 1.1 -> 0; lost (R=0) where V said 0.3 -> 0
    w = Fn.self_imitation_weights(torch.tensor([1.0, 1.0, 0.0]), torch.tensor([0.25, 1.1, 0.3]), 2.0)
    torch.testing.assert_close(w, torch.tensor([1.5, 0.0, 0.0]))


def test_sibling_margins_by_hand():
    # state 1: own reply (highest log pi) has A=0.1, the others 0.4 and -0.2 -> margin 0.4 - 0.1 = 0.3
    # state 2: own A=0.5 beats its only other (0.2) -> -0.3;  state 3: a lone reply -> -inf
    logp = torch.log(torch.tensor([0.2, 0.7, 0.1, 0.6, 0.4, 1.0]))
    adv = torch.tensor([0.4, 0.1, -0.2, 0.5, 0.2, 9.0])
    margins = Fn.sibling_margins(logp, adv, [[0, 1, 2], [3, 4], [5]])
    assert margins[:2] == pytest.approx([0.3, -0.3]) and margins[2] == float("-inf")
    # the 0.4 reply was rejected by the env: state 1's best valid other is -0.2 -> -0.3
    valid = torch.tensor([False, True, True, True, True, True])
    assert Fn.sibling_margins(logp, adv, [[0, 1, 2], [3, 4], [5]], valid)[0] == pytest.approx(-0.3)
