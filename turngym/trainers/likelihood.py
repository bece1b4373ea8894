"""The likelihood update SFT and branch BC share: one optimizer step of the weighted NLL.

    loss = -mean_t(w_t log pi(a_t | s_t)) + kl_coef * KL_k3(pi || ref)

over the policy tokens of some episodes (``w_t`` = 1 on every token for SFT; for branch BC, 1 on
the valid turns of the episodes it clones and 0 on the turns the env refused). A step may be split
into micro-batches (gradient accumulation), each weighted by its share of the step's tokens, so the
accumulated gradient is the one of the token mean over the whole step. With a frozen reference
model and ``kl_coef`` > 0 the KL guard is applied on the same tokens.

The recipes choose which episodes make a step and in what order (SFT: shuffled passes over its
demonstrations; branch BC: minibatches of its memory); this module only fits them.
"""

from __future__ import annotations

import torch

from turngym.clock import CLOCK
from turngym.trainers import functional as Fn
from turngym.trainers.actor import autocast, reference_pass
from turngym.trainers.sequences import PackedBatch, score


@CLOCK.timed("update")
def likelihood_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    chunks: list[tuple[PackedBatch, torch.Tensor]], *, lr: float, max_grad_norm: float,
                    autocast_mode: str = "none", ref: torch.nn.Module | None = None, kl_coef: float = 0.0,
                    entropy: bool = False) -> dict[str, float]:
    """One optimizer step of the weighted NLL (plus the KL guard) over the micro-batches ``chunks``.

    Args:
        model: The trained model, in train mode.
        optimizer: Its optimizer; its learning rate is set to ``lr`` for this step.
        chunks: Per micro-batch, the packed episodes and ``(M,)`` weights of their scored tokens.
        lr: This step's learning rate (a warm-up is the caller's schedule).
        max_grad_norm: Gradient clipping.
        autocast_mode: ``auto`` | ``bf16`` | ``none`` for the forwards (``actor.autocast``).
        ref: A frozen reference model; with ``kl_coef`` > 0 its log-probs anchor the update.
        kl_coef: Weight of ``KL_k3(pi || ref)``.
        entropy: Also compute and return the policy's mean token entropy (costs a (M, V) pass).

    Returns:
        The step's ``loss`` (the weighted NLL), ``kl``, ``logprob_drift`` (mean |log pi - recorded|),
        ``grad_norm``, and ``entropy`` when asked: token-share-weighted over the micro-batches.

    Raises:
        ValueError: ``kl_coef`` > 0 without a reference model.
    """
    if kl_coef > 0 and ref is None:
        raise ValueError("kl_coef > 0 needs a reference model")
    optimizer.zero_grad(set_to_none=True)
    shares = Fn.token_share([int(batch.score_mask.sum()) for batch, _ in chunks])
    stats: dict[str, float] = {}
    for (batch, weights), share in zip(chunks, shares):
        with autocast(model, autocast_mode):
            out = score(model, batch, entropy=entropy)
        w = weights.to(out.logprobs.device)
        ones = torch.ones_like(w)
        nll = Fn.weighted_nll_loss(out.logprobs, w, ones)
        loss, kl = nll, torch.zeros(())
        if ref is not None and kl_coef > 0:
            ref_logprobs = reference_pass(ref, batch, False, autocast_mode)[0].to(w.device)
            kl = Fn.masked_mean(Fn.kl_k3(out.logprobs, ref_logprobs), ones)
            loss = loss + kl_coef * kl
        (share * loss).backward()
        part = {"loss": nll.item(), "kl": kl.item(),
                "logprob_drift": (out.logprobs.detach() - batch.old_logprobs.to(w.device)).abs().mean().item()}
        if entropy:
            part["entropy"] = out.entropy.mean().item()
        for k, v in part.items():
            stats[k] = stats.get(k, 0.0) + share * v
    params = [p for p in model.parameters() if p.requires_grad]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()
    stats["grad_norm"] = float(grad_norm)
    return stats


def optimizer_steps(optimizer: torch.optim.Optimizer) -> int:
    """Steps the optimizer has taken (its own counter, so a resumed run continues a warm-up)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return int(optimizer.state.get(params[0], {}).get("step", 0)) if params else 0

