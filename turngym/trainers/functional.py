"""The trainers' math as pure functions of tensors.

No ``.backward()``, no device moves, no logging: the trainers do those. Shapes use
``B`` = sequences, ``T`` = tokens, ``N`` = utterances (turns), ``K`` = value-support atoms.
Each function names the equation it implements; tests check them on numbers worked by hand.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F

# ----- critic (ArCHer high level) ------------------------------------------------------------


def turn_transitions(turn_refs: list[tuple[int, int]], rewards: list[list[float]], s_feat: torch.Tensor):
    """The replay transitions of a batch's flat turns: ``(N,)`` reward, ``(N,)`` done and ``(N, H)``
    next-state features (the next flat turn's ``s_feat`` when it is the same episode's next turn; else
    zeros and done, since a turn whose successor carries no tokens has nothing to bootstrap from).

    Args:
        turn_refs: ``(trajectory, turn)`` of each flat turn, in order (``PackedBatch.turn_refs``).
        rewards: Per trajectory, per turn (after the reward transforms).
        s_feat: ``(N, H)`` state features of each flat turn.
    """
    n = len(turn_refs)
    r = torch.tensor([rewards[ti][k] for ti, k in turn_refs], dtype=torch.float32)
    done = torch.ones(n)
    next_feat = torch.zeros_like(s_feat)
    for i in range(n - 1):
        (ti, k), (tj, kj) = turn_refs[i], turn_refs[i + 1]
        if ti == tj and kj == k + 1:
            done[i] = 0.0
            next_feat[i] = s_feat[i + 1]
    return r, done, next_feat


def window_positions(end: torch.Tensor, width: int) -> torch.Tensor:
    """Positions of the ``width`` tokens that end at each ``end``: ``end - width + 1, ..., end``, with
    -1 for the slots before the sequence's start (padding, always on the left).

    Args:
        end: ``(N,)`` long, the position each window ends at (its last token).

    Returns:
        ``(N, W)`` long.
    """
    pos = end[:, None] - (width - 1) + torch.arange(width, device=end.device)
    return torch.where(pos >= 0, pos, -1)


def gather_windows(hidden: torch.Tensor, at: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows of hidden states ending at ``at``: the critic's ``top:K`` encoder input.

    Args:
        hidden: ``(B, T, H)`` one sequence per row, position = column (right padding only).
        at: ``(N, 2)`` long ``(row, position)`` of each window's last token.

    Returns:
        ``(N, W, H)`` states (zeros in padding slots) and their ``(N, W)`` positions (``window_positions``).
    """
    pos = window_positions(at[:, 1], width)
    states = hidden[at[:, :1], pos.clamp_min(0)]
    return torch.where((pos >= 0)[..., None], states, 0.0), pos


def window_attention_mask(pos: torch.Tensor) -> torch.Tensor:
    """Causal attention inside each window over its real tokens: query ``i`` sees key ``j`` when
    ``j <= i`` and ``j`` is real (``pos >= 0``). A padding query sees itself only, so that no softmax
    row is empty (its output is never read).

    Args:
        pos: ``(N, W)`` window positions, -1 = padding.

    Returns:
        ``(N, 1, W, W)`` bool, True = attend (one mask for every head).
    """
    w = pos.shape[1]
    causal = torch.ones(w, w, dtype=torch.bool, device=pos.device).tril()
    real_key = (pos >= 0)[:, None, :]  # (N, 1, W)
    return (causal & (real_key | torch.eye(w, dtype=torch.bool, device=pos.device)))[:, None]


def td_target(reward: torch.Tensor, next_value: torch.Tensor, done: torch.Tensor, gamma: float) -> torch.Tensor:
    """One-step TD target ``y = r + gamma * (1 - done) * V_target(s')``.

    Args:
        reward, next_value, done: ``(N,)``; ``done`` is 1.0 where the episode ended at this turn.
    """
    return reward + gamma * (1.0 - done.float()) * next_value


def double_q_min(q1: torch.Tensor, q2: torch.Tensor) -> torch.Tensor:
    """Clipped double-Q: ``min(Q1, Q2)`` elementwise, against over-estimation (Fujimoto et al. 2018)."""
    return torch.minimum(q1, q2)


def polyak(target: torch.Tensor, online: torch.Tensor, tau: float) -> torch.Tensor:
    """Soft target update ``theta_target <- tau * theta + (1 - tau) * theta_target``."""
    return tau * online + (1.0 - tau) * target


def utterance_advantage(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """ArCHer's utterance-level advantage ``A(s, a) = Q(s, a) - V(s)``, shape ``(N,)``."""
    return q - v


def td_advantage(reward: torch.Tensor, value: torch.Tensor, next_value: torch.Tensor, done: torch.Tensor,
                 gamma: float) -> torch.Tensor:
    """One-step TD advantage ``A = r + gamma * (1 - done) * V(s') - V(s)``, shape ``(N,)``.

    It reads the action's effect off what actually followed it (the reward and the next state's
    value) instead of off Q's action features: with few samples per state a critic learns V well
    before it learns how Q varies with the action.
    """
    return td_target(reward, next_value, done, gamma) - value


def gae_advantages(rewards: torch.Tensor, values: torch.Tensor, next_values: torch.Tensor, dones: torch.Tensor,
                   gamma: float, lam: float) -> torch.Tensor:
    """Generalised advantage estimation (Schulman et al. 2016) over the turns of flat episodes, ``(N,)``.

        delta_t = r_t + gamma * (1 - done_t) * V(s_{t+1}) - V(s_t)
        A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1}

    ``lam = 0`` is the one-step TD advantage (``td_advantage``); ``lam = 1`` is the discounted
    return minus ``V(s_t)`` (the deltas telescope).

    Args:
        rewards, values, next_values, dones: ``(N,)`` per flat turn, episodes laid end to end in
            turn order; ``dones[t] = 1`` where turn ``t + 1`` does not continue turn ``t``'s episode.
    """
    delta = td_advantage(rewards, values, next_values, dones, gamma)
    keep = gamma * lam * (1.0 - dones.float())
    out = torch.empty_like(delta)
    running = torch.zeros((), dtype=delta.dtype)
    for t in range(delta.shape[0] - 1, -1, -1):
        running = delta[t] + keep[t] * running
        out[t] = running
    return out


def center(x: torch.Tensor) -> torch.Tensor:
    """``x - mean(x)`` over the batch (no std scaling), shape kept; a single element is left as is."""
    return x - x.mean() if x.numel() > 1 else x


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """ROC AUC: P(score of a positive > score of a negative), ties counting 1/2.

    Args:
        scores: ``(N,)``.
        labels: ``(N,)``; 1 = positive, 0 = negative, anything else (e.g. NaN = unknown) is ignored.

    Returns:
        The AUC, or NaN when there is no positive or no negative.
    """
    pos, neg = scores[labels == 1], scores[labels == 0]
    if pos.numel() == 0 or neg.numel() == 0:
        return float("nan")
    diff = pos[:, None] - neg[None, :]  # (P, Q)
    wins = (diff > 0).float() + 0.5 * (diff == 0).float()
    return float(wins.mean())


def sibling_auc(scores: torch.Tensor, values: torch.Tensor, groups: list[list[int]], eps: float = 1e-6) -> tuple[float, int]:
    """How often the scores rank the better of two sibling actions first.

    Siblings are different actions from one state (a tree rollout's branches at one turn); an
    action's value is what its episode earned from there on. Over every pair of siblings whose
    values differ by more than ``eps``, count 1 when the better one scores higher, 1/2 on a tie.

    Args:
        scores: ``(N,)`` e.g. the critic's ``Q(s, a) - V(s)``.
        values: ``(N,)`` e.g. the return after each action.
        groups: Row indices of each sibling group.

    Returns:
        ``(auc, pairs)``: the fraction (NaN without a pair) and the number of pairs counted.
    """
    wins, pairs = _sibling_counts(scores, values, groups, eps)
    total = int(pairs.sum())
    return (float(wins.sum()) / total if total else float("nan")), total


def _sibling_counts(scores: torch.Tensor, values: torch.Tensor, groups: list[list[int]],
                    eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per group, the ranking wins (ties 1/2) and the pairs counted (``sibling_auc``'s terms)."""
    wins, pairs = torch.zeros(len(groups), dtype=torch.float64), torch.zeros(len(groups), dtype=torch.float64)
    for n, g in enumerate(groups):
        idx = torch.tensor(g, dtype=torch.long)
        s, v = scores[idx], values[idx]
        better = (v[:, None] - v[None, :]) > eps  # (G, G): row's action earned more than column's
        ds = s[:, None] - s[None, :]
        wins[n] = float(((ds > 0).float() + 0.5 * (ds == 0).float())[better].sum())
        pairs[n] = float(better.sum())
    return wins, pairs


def sibling_auc_interval(scores: torch.Tensor, values: torch.Tensor, groups: list[list[int]], *, level: float = 0.95,
                         resamples: int = 2000, seed: int = 0, eps: float = 1e-6) -> tuple[float, float]:
    """A bootstrap interval for ``sibling_auc``, resampling sibling groups (states), not pairs: the
    pairs of one state share its actions, so they are not independent. With about 40 pairs an AUC
    of 0.75 is typically 0.6 to 0.9, so one iteration's AUC above or below a gate says little alone.

    Returns:
        ``(low, high)``, percentile bounds at ``level``; NaN for both without a pair.
    """
    wins, pairs = _sibling_counts(scores, values, groups, eps)
    keep = pairs > 0
    wins, pairs = wins[keep], pairs[keep]
    if not len(pairs):
        return float("nan"), float("nan")
    gen = torch.Generator().manual_seed(seed)
    pick = torch.randint(0, len(pairs), (resamples, len(pairs)), generator=gen)
    aucs = wins[pick].sum(1) / pairs[pick].sum(1)
    tail = (1 - level) / 2
    return float(torch.quantile(aucs, tail)), float(torch.quantile(aucs, 1 - tail))


def sibling_margins(logp: torch.Tensor, adv: torch.Tensor, groups: list[list[int]],
                    valid: torch.Tensor | None = None) -> list[float]:
    """How far the critic ranks each state's best other (valid) sibling above the policy's own reply.

    The policy's own reply at a state is the sibling it gave the highest likelihood (the greedy
    reply a tree's runner-ups were forced beside). A state whose margin is small holds no evidence
    that another reply is better: among siblings that all earned the same, the differences are the
    critic's noise, and a weighted likelihood would still raise the runner-ups toward them.

    Args:
        logp: ``(N,)`` log pi(a_i | s) of each action.
        adv: ``(N,)`` A(s, a_i).
        groups: Row indices of the actions of each state.
        valid: ``(N,)`` bool, which actions may be preferred (the env accepted them); all by default.

    Returns:
        One margin per group, ``max_{i != own, valid} A_i - A_own`` (``-inf`` when no other is valid).
    """
    out = []
    for g in groups:
        own = max(g, key=lambda r: float(logp[r]))
        others = [float(adv[r]) for r in g if r != own and (valid is None or bool(valid[r]))]
        out.append(max(others) - float(adv[own]) if others else float("-inf"))
    return out


def sibling_awr_weights(logp: torch.Tensor, adv: torch.Tensor, groups: list[list[int]], beta: float) -> torch.Tensor:
    """Advantage-weighted targets over the sibling actions of each state.

    AWR (Peng et al., 2019) moves the policy toward pi*(a|s) proportional to pi(a|s) exp(A(s, a) / beta).
    Its usual estimator weights samples a ~ pi by exp(A / beta); a tree's runner-up replies are
    forced, not sampled (after SFT pi gives them ~0.003), so that estimator would raise every
    runner-up's likelihood, losers included. Here pi* is formed exactly on the actions seen at a state:

        w_i = softmax_{i in group}(log pi(a_i | s) + A_i / beta)

    and the actor's likelihood is weighted by ``w`` (each state's weights sum to 1).

    Args:
        logp: ``(N,)`` log pi(a_i | s) of each action, as recorded when it was sampled or forced.
        adv: ``(N,)`` A(s, a_i) (within a group only differences matter: V(s) cancels).
        groups: Row indices of the actions of each state.
        beta: Temperature, in the advantage's units.

    Returns:
        ``(N,)`` weights; rows in no group get 0.
    """
    w = torch.zeros_like(adv)
    for g in groups:
        idx = torch.tensor(g, dtype=torch.long)
        w[idx] = torch.softmax(logp[idx] + adv[idx] / beta, dim=0)
    return w


def self_imitation_weights(returns: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """Self-imitation (Oh et al., 2018): clone the agent's own past actions where they earned more
    than the critic expected, ``scale * max(R - V(s), 0)``.

    Args:
        returns: ``(N,)`` what each action's episode earned after it (R).
        values: ``(N,)`` the critic's V(s) at the action's state.
        scale: the term's weight.

    Returns:
        ``(N,)`` non-negative weights: 0 where the episode earned no more than V.
    """
    return scale * (returns - values).clamp(min=0.0)


def broadcast_to_tokens(per_turn: torch.Tensor, token_turn: torch.Tensor) -> torch.Tensor:
    """Give every scored token its utterance's value: ``out[m] = per_turn[token_turn[m]]``.

    Args:
        per_turn: ``(N,)`` one value per utterance (flat over the batch).
        token_turn: ``(M,)`` long; the flat utterance index of each scored token (``PackedBatch.token_turn``).

    Returns:
        ``(M,)``.
    """
    return per_turn[token_turn]


def hl_gauss_target(value: torch.Tensor, support: torch.Tensor, sigma: float) -> torch.Tensor:
    """Histogram target for a categorical value head ("Stop Regressing", Farebrother et al. 2024).

    The target distribution is a Gaussian N(value, sigma^2) integrated over the bins whose
    centres are ``support`` (evenly spaced), renormalised to the support's range.

    Args:
        value: ``(N,)`` scalar targets.
        support: ``(K,)`` bin centres, evenly spaced.

    Returns:
        ``(N, K)`` probabilities.
    """
    half = (support[1] - support[0]) / 2
    edges = torch.cat([support - half, support[-1:] + half])  # (K+1,)
    cdf = torch.special.ndtr((edges[None, :] - value[:, None]) / sigma)  # (N, K+1)
    mass = cdf[:, 1:] - cdf[:, :-1]
    return mass / mass.sum(dim=1, keepdim=True).clamp_min(1e-12)


def categorical_value_loss(logits: torch.Tensor, target: torch.Tensor, support: torch.Tensor, sigma: float) -> torch.Tensor:
    """Cross-entropy between a value head's ``(N, K)`` logits and the HL-Gauss histogram of ``target``."""
    probs = hl_gauss_target(target, support, sigma)
    return -(probs * F.log_softmax(logits, dim=-1)).sum(dim=-1).mean()


def categorical_expectation(logits: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
    """Scalar value of a categorical head: ``sum_k softmax(logits)_k * support_k``, shape ``(N,)``."""
    return (F.softmax(logits, dim=-1) * support).sum(dim=-1)


# ----- actor (token level) -------------------------------------------------------------------


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is 1 (0 if there are none)."""
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp_min(1.0)


def weighted_nll_loss(logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``-mean(A * log pi)`` over policy tokens: with ``A`` in {0, 1} the SFT loss on the chosen
    tokens (filtered BC). Unlike the surrogate's ``-rho * A`` it does not grow with the ratio, so
    several epochs over the same episodes fit them as SFT does instead of feeding back on themselves."""
    return -masked_mean(logprobs * advantages, mask)


def clipped_pg_loss(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, clip_coef: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate, per token: ``-min(rho * A, clip(rho, 1-eps, 1+eps) * A)``.

    ``rho = exp(logprobs - old_logprobs)`` uses the log-probs recorded at sampling time. With
    ``clip_coef <= 0`` it is vanilla policy gradient ``-rho * A`` (= ``-logpi * A`` in gradient
    at rho = 1).

    Args:
        logprobs: ``(B, T)`` under the current policy (requires grad).
        old_logprobs, advantages, mask: ``(B, T)``; mask is 1 on policy tokens.

    Returns:
        ``(loss, clip_fraction)``: token-mean loss and the share of tokens where clipping bit.
    """
    ratio = torch.exp(logprobs - old_logprobs)
    surrogate = ratio * advantages
    if clip_coef <= 0:
        return -masked_mean(surrogate, mask), torch.zeros(())
    clipped = torch.clamp(ratio, 1.0 - clip_coef, 1.0 + clip_coef) * advantages
    loss = -masked_mean(torch.minimum(surrogate, clipped), mask)
    clip_frac = masked_mean(((ratio - 1.0).abs() > clip_coef).float(), mask)
    return loss, clip_frac.detach()


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token KL(pi || ref) estimate ``exp(r) - r - 1`` with ``r = ref - logpi`` (Schulman's k3;
    unbiased and always >= 0 on samples from pi)."""
    r = ref_logprobs - logprobs
    return torch.exp(r) - r - 1.0


def warmup_lr(base_lr: float, steps_done: int, warmup_steps: int) -> float:
    """The learning rate of optimizer step ``steps_done + 1``: ramps linearly from
    ``base_lr / warmup_steps`` to ``base_lr`` over the first ``warmup_steps`` steps (0 = no ramp)."""
    if warmup_steps <= 0:
        return base_lr
    return base_lr * min(1.0, (steps_done + 1) / warmup_steps)


def token_logprobs_and_entropy(logits: torch.Tensor, targets: torch.Tensor,
                               entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of each target token, ``log softmax(logits)[m, targets[m]]``, and optionally the
    entropy ``-sum_v p_v log p_v`` of each position, from one fp32 log-softmax.

    Args:
        logits: ``(M, V)`` at the scored positions only (``PackedBatch.score_mask``).
        targets: ``(M,)`` long, the token each position predicts.

    Returns:
        ``(M,)`` log-probs and ``(M,)`` entropies (``None`` unless ``entropy``).
    """
    logp = F.log_softmax(logits.float(), dim=-1)
    chosen = logp.gather(-1, targets[:, None]).squeeze(-1)
    return chosen, (-(logp.exp() * logp).sum(dim=-1) if entropy else None)


# ----- shared by the critic-free family (each algorithm's own estimator lives in its file) -------


def discounted_returns(rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """``G_t = sum_{k >= t} gamma^(k - t) r_k`` for one episode, shape ``(T,)``."""
    out = torch.empty_like(rewards)
    running = torch.zeros((), dtype=rewards.dtype)
    for t in range(rewards.shape[0] - 1, -1, -1):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def equal_group_mask(returns: torch.Tensor, atol: float = 1e-8) -> torch.Tensor:
    """Which groups hold a contrast: ``(G,)`` bool, False where every return of the group is equal.

    A group whose episodes all earned the same return has zero group-relative advantage for every
    episode (RLOO, GRPO), so it costs a forward and backward and teaches nothing; DAPO's dynamic
    sampling drops such groups (Yu et al. 2025).

    Args:
        returns: ``(G, n)``.
    """
    return (returns.max(dim=-1).values - returns.min(dim=-1).values) > atol


def token_share(tokens_per_chunk: Sequence[int]) -> list[float]:
    """Loss weight of each chunk of a gradient-accumulation step: its share of the step's tokens,
    so the accumulated gradient equals the gradient of the token mean over the whole step."""
    total = sum(tokens_per_chunk)
    return [n / total if total else 0.0 for n in tokens_per_chunk]
