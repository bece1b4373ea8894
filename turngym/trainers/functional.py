"""The trainers' math as pure functions of tensors.

No ``.backward()``, no device moves, no logging: the trainers do those. Shapes use
``B`` = sequences, ``T`` = tokens, ``N`` = utterances (turns). ArCHer's critic math lives with it
(``trainers/archer/critic.py`` and its plug-ins).
Each function names the equation it implements; tests check them on numbers worked by hand.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

def broadcast_to_tokens(per_turn: torch.Tensor, token_turn: torch.Tensor) -> torch.Tensor:
    """Give every scored token its utterance's value: ``out[m] = per_turn[token_turn[m]]``.

    Args:
        per_turn: ``(N,)`` one value per utterance (flat over the batch).
        token_turn: ``(M,)`` long; the flat utterance index of each scored token (``PackedBatch.token_turn``).

    Returns:
        ``(M,)``.
    """
    return per_turn[token_turn]


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
