"""The token-level actor: which parameters train, the frozen reference, and the policy-gradient step.

ArCHer and the critic-free family differ only in how they turn rewards into per-utterance
advantages (their own files); both end an iteration with ``actor_update``: their loss (``LOSSES``:
PPO's clipped surrogate on the log-probs recorded at sampling time, or ``-A log pi`` for cloning),
with the utterance's advantage on each of its tokens, plus KL and entropy guards, over minibatches
of whole episodes. SFT and branch BC fit likelihoods instead (``likelihood.py``).
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch

from turngym.agents.packed import native_bf16
from turngym.clock import CLOCK
from turngym.trainers import functional as Fn
from turngym.trainers.distributed import DistContext, is_sharded
from turngym.trainers.sequences import PackedBatch, frozen_prefix, score, score_forward


def prepare_trainable(model: torch.nn.Module, trainable: str, lora_r: int = 16, lora_alpha: int = 32) -> torch.nn.Module:
    """Set which parameters train: ``all``, ``lora`` (PEFT adapters on every linear layer) or
    ``top:K`` (the last K transformer blocks and the final norm).

    ``top:K`` makes backward stop at block N-K: on a CPU it is the cheapest way to adapt a model
    (about 7x cheaper than ``all`` for K=8 of SmolLM2's 30 blocks, measured on 2 cores).

    Returns:
        The model to train (a PEFT wrapper for ``lora``, else ``model`` itself).
    """
    if trainable == "lora":
        from peft import LoraConfig, get_peft_model

        lcfg = LoraConfig(r=lora_r, lora_alpha=lora_alpha, target_modules="all-linear", task_type="CAUSAL_LM")
        return get_peft_model(model, lcfg)
    for p in model.parameters():
        p.requires_grad_(trainable == "all")
    if trainable.startswith("top:"):
        k = int(trainable.split(":")[1])
        layers = _blocks(model)
        for block in layers[len(layers) - k :]:
            for p in block.parameters():
                p.requires_grad_(True)
        norm = getattr(model.base_model, "norm", None)
        if norm is not None:
            for p in norm.parameters():
                p.requires_grad_(True)
    elif trainable != "all":
        raise ValueError(f"trainable must be all, lora or top:K, got {trainable!r}")
    return model


def shard_model(model: torch.nn.Module, ctx: DistContext) -> torch.nn.Module:
    """Shard ``model``'s parameters over the ranks with FSDP2 (``fully_shard`` on each transformer
    block, then on the root, which holds the embeddings, final norm and head); call it after
    ``prepare_trainable`` and before building the optimizer. A no-op in one process.

    The scorer (``sequences.score``) runs the backbone and head as submodules, so it is registered
    as a forward method of the root: FSDP then gathers the root's parameters around it and reduces
    their gradients after backward, as it does around ``model.forward`` (which ``generate`` calls).

    Raises:
        ValueError: a LoRA (PEFT) model; only ``trainable: all`` and ``top:K`` are sharded.
    """
    if not ctx.enabled:
        return model
    if hasattr(model, "get_base_model"):
        raise ValueError("sharding=fsdp supports trainable=all and top:K, not lora")
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    for block in _blocks(model):
        fully_shard(block)
    # The root reshards after its forward too (FSDP's default keeps it gathered): otherwise, after
    # a no-grad forward, ``model.parameters()`` would list the gathered copies, not the shards that
    # the optimizer steps.
    fully_shard(model, reshard_after_forward=True)
    model.score_forward = functools.partial(score_forward, model)
    register_fsdp_forward_method(model, "score_forward")
    return model


def actor_optimizer(model: torch.nn.Module, lr: float) -> torch.optim.AdamW:
    """AdamW over ``model``'s trainable parameters, fused into one kernel per step where torch has it
    (plain tensors on a CPU or CUDA device; a sharded model's DTensors keep the per-parameter loop):
    on a CPU torch otherwise loops over the tensors one by one, several times slower for the 73
    tensors of SmolLM2's top 8 blocks. The update is the same AdamW (``benchmarks/roofline.py``
    measures the fit)."""
    params = [p for p in model.parameters() if p.requires_grad]
    fused = bool(params) and all(p.device.type in ("cpu", "cuda") and not hasattr(p, "device_mesh") for p in params)
    return torch.optim.AdamW(params, lr=lr, fused=fused or None)


def autocast(model: torch.nn.Module, mode: str):
    """Mixed-precision context for a training forward (``bf16``), a no-op (``none``), or ``auto``:
    bf16 where the hardware computes it natively (CUDA, or a CPU with AVX512-BF16 or AMX), else none."""
    device = next(model.parameters()).device.type
    return torch.autocast(device, dtype=torch.bfloat16, enabled=use_bf16(mode, device))


def use_bf16(mode: str, device: str) -> bool:
    """Whether ``mode`` means bf16 autocast on ``device``. On a CPU without native bf16 (AVX2 only),
    torch emulates it: a 512x576 @ 576x1536 matmul measured 83x slower in bf16 than in fp32 on an
    AVX2 AMD EPYC, which made the quickstart's SFT stage about 15x slower than on a bf16 CPU."""
    if mode != "auto":
        return mode == "bf16"
    return device != "cpu" or native_bf16(device)


def _blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    for m in model.modules():
        if isinstance(m, torch.nn.ModuleList) and len(m) > 1:
            return m
    raise ValueError("cannot find the model's transformer blocks for trainable=top:K")


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """The reference: a frozen copy of the starting policy (KL anchor and critic encoder)."""
    ref = copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


@torch.no_grad()
def reference_pass(ref: torch.nn.Module, batch: PackedBatch, hidden: bool, mode: str = "none",
                   hidden_layer: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Reference log-probs ``(M,)`` of the policy tokens, and hidden states ``(B, T, H)`` (fp32) if
    asked: the final ones, or the input of block ``hidden_layer`` (``sequences.score``)."""
    with autocast(ref, mode):
        out = score(ref, batch, hidden=hidden, hidden_layer=hidden_layer)
    return out.logprobs.float(), None if out.hidden is None else out.hidden.float()


@CLOCK.timed("update")
def actor_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: PackedBatch,
    token_adv: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    cfg: Any,
    gen: torch.Generator,
    ctx: DistContext | None = None,
    *,
    loss: str = "ppo",
) -> dict[str, float]:
    """Token-level policy gradient: the given loss with per-token advantages, plus the KL and
    entropy guards, over minibatches of sequences.

    Args:
        token_adv: ``(M,)`` advantage of each scored token (its utterance's, or token-level).
        ref_logprobs: ``(M,)`` reference log-probs (needed when ``kl_coef > 0``).
        ctx: Data-parallel context: gradients are averaged over ranks before clipping. Every rank
            must hold the same number of sequences (``DistContext.shard`` gives equal shares).
        loss: ``ppo`` | ``nll`` (``LOSSES``).

    Returns:
        Mean metrics over the minibatch steps.
    """
    model.train()
    ctx = ctx or DistContext()
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {sorted(LOSSES)}, got {loss!r}")
    B = batch.input_ids.shape[0]
    params = [p for p in model.parameters() if p.requires_grad]
    sharded = is_sharded(model)
    # FSDP ranks must run the same number of forwards and backwards: no accumulation when sharded
    micro = cfg.minibatch_size if sharded else (cfg.micro_batch_size or cfg.minibatch_size)
    # the NLL loss uses no ratio, so no old log-probs either
    rescore = loss == "ppo" and rescore_old_logprobs(cfg.old_logprobs, model, cfg.autocast,
                                                     getattr(cfg, "rollout_engine", "hf"))
    scored = batch  # with the frozen lower blocks' output computed once for every pass (trainable: top:K)
    if cfg.actor_epochs > 1 or rescore:
        scored = frozen_prefix(model, batch, cfg.micro_batch_size or cfg.minibatch_size, lambda: autocast(model, cfg.autocast))
    if rescore:
        batch.old_logprobs = scored.old_logprobs = rescored_logprobs(model, scored, cfg)
    batch = scored
    sums: dict[str, float] = {}
    steps = 0
    for _ in range(cfg.actor_epochs):
        order = torch.randperm(B, generator=gen).tolist()
        i = 0
        # ranks step jointly: one with fewer sequences contributes a zero gradient to the average
        while (i < B) if not ctx.enabled else ctx.any_rank(i < B):
            optimizer.zero_grad(set_to_none=True)
            rows = sorted(order[i : i + cfg.minibatch_size])
            # gradient accumulation: micro-batches weighted by their share of the step's tokens
            chunks = [rows[j : j + micro] for j in range(0, len(rows), micro)]
            weights = Fn.token_share([int(batch.score_mask[c].sum()) for c in chunks])
            stats: dict[str, float] | None = None
            for chunk, w in zip(chunks, weights):
                part = _minibatch_backward(model, batch, chunk, token_adv, ref_logprobs, cfg, loss, w)
                stats = {k: (stats or {}).get(k, 0.0) + w * v for k, v in part.items()}
            if not rows and sharded:  # FSDP's gathers and reduce-scatters need every rank's forward and backward
                _minibatch_backward(model, batch, [0], token_adv, ref_logprobs, cfg, loss, weight=0.0)
            ctx.all_reduce_grads(params)
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)  # DTensors: the global norm
            lr = Fn.warmup_lr(cfg.actor_lr, _optimizer_steps(optimizer, params), cfg.actor_warmup_steps)
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.step()
            i += cfg.minibatch_size
            if stats is not None:
                stats["actor/grad_norm"] = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
                for k, v in stats.items():
                    sums[k] = sums.get(k, 0.0) + v
                steps += 1
    model.eval()
    return {k: v / max(steps, 1) for k, v in sums.items()}


def rescore_old_logprobs(mode: str, model: torch.nn.Module, autocast_mode: str, engine: str = "hf") -> bool:
    """Whether the PPO ratio's old log-probs are rescored with the training forward before the update.

    ``sampled`` keeps the log-probs recorded at sampling time; ``rescored`` recomputes them on the
    update's precision path; ``auto`` rescores when the update runs in bf16 or another engine
    (``engine="vllm"``) sampled. Sampling in fp32 and scoring in bf16 put the ratio away from 1
    before any update (mean |delta logp| 0.03, 0.5% of tokens past the clip, measured on the
    quickstart), so clipping then bites on noise; a second engine's kernels differ the same way.
    """
    if mode == "auto":
        return engine != "hf" or use_bf16(autocast_mode, next(model.parameters()).device.type)
    return mode == "rescored"


@torch.no_grad()
def rescored_logprobs(model: torch.nn.Module, batch: PackedBatch, cfg: Any) -> torch.Tensor:
    """``(M,)`` log-probs of the batch's policy tokens under ``model`` on the update's precision path."""
    was_training = model.training
    model.eval()
    micro = cfg.micro_batch_size or cfg.minibatch_size
    out = torch.empty_like(batch.old_logprobs)
    B = batch.input_ids.shape[0]
    for j in range(0, B, micro):
        sub, keep = batch.select_rows(list(range(j, min(B, j + micro))))
        with autocast(model, cfg.autocast):
            out[keep] = score(model, sub).logprobs.float().to(out.device)
    model.train(was_training)
    return out


def _optimizer_steps(optimizer: torch.optim.Optimizer, params: list) -> int:
    """Steps the optimizer has taken (its own counter, so a resumed run continues the warm-up)."""
    step = optimizer.state.get(params[0], {}).get("step", 0) if params else 0
    return int(step)


def ppo_loss(logprobs: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, cfg: Any) -> tuple[torch.Tensor, float]:
    """PPO's clipped surrogate on the log-probs recorded at sampling time (``Fn.clipped_pg_loss``)."""
    loss, clip_frac = Fn.clipped_pg_loss(logprobs, old, adv, torch.ones_like(adv), cfg.clip_coef)
    return loss, float(clip_frac)


def nll_loss(logprobs: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, cfg: Any) -> tuple[torch.Tensor, float]:
    """``-mean(A log pi)``: cloning the tokens with ``A > 0`` (``Fn.weighted_nll_loss``); no ratio, no clip."""
    return Fn.weighted_nll_loss(logprobs, adv, torch.ones_like(adv)), 0.0


# the policy-gradient losses by name: an algorithm names its own (``pg.Estimator.loss``)
LOSSES = {"ppo": ppo_loss, "nll": nll_loss}


def _minibatch_backward(model: torch.nn.Module, batch: PackedBatch, rows: list[int], token_adv: torch.Tensor,
                        ref_logprobs: torch.Tensor | None, cfg: Any, loss_name: str, weight: float = 1.0) -> dict[str, float]:
    """Loss of one micro-batch of sequences: the policy-gradient loss + KL guard - entropy bonus;
    runs ``backward`` on ``weight`` times it and returns the micro-batch's metrics."""
    sub, keep = batch.select_rows(rows)
    with autocast(model, cfg.autocast):
        out = score(model, sub, entropy=True)  # entropy is always logged
    adv = token_adv[keep].to(out.logprobs.device)
    old = sub.old_logprobs.to(adv.device)
    ones = torch.ones_like(adv)
    pg_loss, clip_frac = LOSSES[loss_name](out.logprobs, old, adv, cfg)
    loss = pg_loss
    kl = torch.zeros(())
    if ref_logprobs is not None:
        kl = Fn.masked_mean(Fn.kl_k3(out.logprobs, ref_logprobs[keep].to(adv.device)), ones)
        if cfg.kl_coef > 0:
            loss = loss + cfg.kl_coef * kl
    entropy = out.entropy.mean()
    if cfg.ent_coef > 0:
        loss = loss - cfg.ent_coef * entropy
    (weight * loss).backward()
    return {"actor/pg_loss": pg_loss.item(), "actor/kl": kl.item(), "actor/entropy": entropy.item(),
            "actor/clip_frac": float(clip_frac), "actor/logprob_drift": (out.logprobs.detach() - old).abs().mean().item()}


def advantage_stats(adv: torch.Tensor, prefix: str = "adv") -> dict[str, float]:
    if adv.numel() == 0:
        return {}
    return {f"{prefix}/mean": adv.mean().item(), f"{prefix}/std": adv.std(unbiased=False).item(),
            f"{prefix}/min": adv.min().item(), f"{prefix}/max": adv.max().item()}
