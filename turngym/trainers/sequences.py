"""Trajectories to padded token batches, and the forward pass that scores them.

An episode's ``TokenRecord`` holds its tokens once: turn k's prompt is a prefix of turn k+1's (see
``turngym.agents.chat``), so a whole episode is ONE training sequence, and a single forward over it
scores every action token of every turn. The record splits into several sequences (segments) only
where that property broke while it was sampled; ``pack_batch`` only pads them.

The forward applies the LM head only at action positions: full-vocabulary logits for every token
of a long episode would cost gigabytes and buy nothing.

A fit that makes several passes over the same episodes with the lower blocks frozen (``trainable:
top:K``) computes those blocks' output once (``frozen_prefix``) and every pass runs only the
trainable blocks on it: on SmolLM2 with K=8 of 30 that was most of an update's forward.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from turngym.agents.packed import attention_shape, block_forward
from turngym.trainers import functional as Fn
from turngym.types import TokenRecord, Trajectory


@dataclass
class PackedBatch:
    """Episodes as padded sequences.

    Attributes:
        input_ids: ``(B, T)`` right-padded.
        attention_mask: ``(B, T)``.
        score_mask: ``(B, T)`` bool; True at position p when token p+1 is a policy token
            (the hidden state at p predicts it).
        targets: ``(B, T)`` the token each scored position predicts (``input_ids`` shifted left).
        old_logprobs: ``(M,)`` log-probs recorded at sampling time (model at temperature 1) of the
            scored tokens, in mask order.
        token_turn: ``(M,)`` flat turn index of each scored token.
        state_pos, action_pos: ``(N, 2)`` ``(row, position)`` of each turn's last prompt token and
            last action token (critic features are read there).
        turn_refs: ``(trajectory index, turn index)`` of each flat turn.
        prefix: ``(model id, k, hidden)``: the output of that model's first ``k`` blocks at every
            position, ``(B, T, H)``, computed once (``frozen_prefix``); ``score`` on that model then
            runs only the blocks above (any other model, e.g. a reference, runs them all).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    score_mask: torch.Tensor
    targets: torch.Tensor
    old_logprobs: torch.Tensor
    token_turn: torch.Tensor
    state_pos: torch.Tensor
    action_pos: torch.Tensor
    turn_refs: list[tuple[int, int]] = field(default_factory=list)
    prefix: tuple[int, int, torch.Tensor] | None = field(default=None, repr=False)

    @property
    def num_tokens(self) -> int:
        return int(self.score_mask.sum())

    def select_rows(self, rows: list[int]) -> tuple[PackedBatch, torch.Tensor]:
        """The sub-batch of some rows (for minibatches), turn indices renumbered, and the
        ``(M,)`` bool mask of this batch's scored tokens that it keeps (to slice per-token arrays)."""
        keep_turn = torch.isin(self.state_pos[:, 0], torch.tensor(rows))
        old_turn_ids = torch.nonzero(keep_turn).squeeze(-1)
        remap = torch.full((len(self.turn_refs),), -1, dtype=torch.long)
        remap[old_turn_ids] = torch.arange(len(old_turn_ids))
        row_map = torch.full((self.input_ids.shape[0],), -1, dtype=torch.long)
        row_map[torch.tensor(rows)] = torch.arange(len(rows))
        tok_row = torch.nonzero(self.score_mask)[:, 0]
        keep_tok = torch.isin(tok_row, torch.tensor(rows))
        width = int(self.attention_mask[rows].sum(dim=1).max())

        def repos(pos: torch.Tensor) -> torch.Tensor:
            p = pos[keep_turn].clone()
            p[:, 0] = row_map[p[:, 0]]
            return p

        sub = PackedBatch(
            input_ids=self.input_ids[rows, :width],
            attention_mask=self.attention_mask[rows, :width],
            score_mask=self.score_mask[rows, :width],
            targets=self.targets[rows, :width],
            old_logprobs=self.old_logprobs[keep_tok],
            token_turn=remap[self.token_turn[keep_tok]],
            state_pos=repos(self.state_pos),
            action_pos=repos(self.action_pos),
            turn_refs=[r for r, k in zip(self.turn_refs, keep_turn.tolist()) if k],
            prefix=None if self.prefix is None else (*self.prefix[:2], self.prefix[2][rows, :width]),
        )
        return sub, keep_tok


def pack_batch(trajectories: list[Trajectory], pad_id: int) -> PackedBatch:
    """Every turn that has tokens, from each trajectory's ``TokenRecord``, padded (turns without
    tokens, a scripted agent's, are skipped).

    Raises:
        ValueError: no turn in ``trajectories`` has tokens.
    """
    items = [(t.record, [(k, turn.span) for k, turn in enumerate(t.turns) if turn.span is not None])
             for t in trajectories]
    return pack_records(items, pad_id)


def nest_turns(turns: list[Trajectory], weights: list[float]) -> tuple[list[Trajectory], list[float]]:
    """One-turn records (``TokenRecord.branch`` of an episode's turns) folded into the fewest rows:
    a turn whose record is a prefix of another's is scored inside that one's row (same positions,
    same tokens), so an episode's turns cost one forward over the episode, not one per turn.

    Args:
        turns: Trajectories of one turn each, with a record that ends where the turn's action ends.
        weights: One per turn.

    Returns:
        The host trajectories (each with its nested turns, in record order) and their turns'
        weights, flat in that order.
    """
    order = sorted(range(len(turns)), key=lambda i: -len(turns[i].record.ids))
    hosts: list[tuple[Trajectory, list[int]]] = []  # (longest record, members)
    for i in order:
        rec, (s, e) = turns[i].record, turns[i].turns[0].span
        home = next((h for h in hosts if h[0].task_id == turns[i].task_id  # cheap before the id comparison
                     and h[0].record.ids[: len(rec.ids)] == rec.ids
                     and h[0].record.logprobs[s:e] == rec.logprobs[s:e]), None)  # the same sample, not a replay
        if home is None:
            hosts.append((turns[i], [i]))
        else:
            home[1].append(i)
    out, out_w = [], []
    for host, members in hosts:
        members.sort(key=lambda i: turns[i].turns[0].span[0])
        out.append(Trajectory(host.task_id, turns=[turns[i].turns[0] for i in members], record=host.record))
        out_w += [weights[i] for i in members]
    return out, out_w


def pack_records(items: list[tuple[TokenRecord | None, list[tuple[int, tuple[int, int]]]]], pad_id: int) -> PackedBatch:
    """Records as padded rows, one per segment that holds a scored span; nothing is re-derived.

    Args:
        items: Per record, the ``(turn index, span)`` pairs to score (a trajectory's turns; or one
            branch's new action, ``TokenRecord.branch``). ``turn_refs`` are ``(item index, turn index)``.
        pad_id: The padding token.

    Raises:
        ValueError: no item has a span.
    """
    rows: list[tuple[TokenRecord, int, int]] = []  # (record, segment start, end)
    spans: list[tuple[int, int, int, int, int]] = []  # (item, turn, row, start, end), positions in the row
    for ti, (rec, turns) in enumerate(items):
        by_seg: dict[int, list[tuple[int, tuple[int, int]]]] = {}
        for k, span in turns:
            by_seg.setdefault(rec.segment_start(span[0]), []).append((k, span))
        for seg, members in by_seg.items():
            r = len(rows)
            rows.append((rec, seg, max(e for _, (_, e) in members)))
            spans += [(ti, k, r, s - seg, e - seg) for k, (s, e) in members]
    if not rows:
        raise ValueError("no turn has token ids: was the policy an LLM policy that records tokens?")
    width = max(end - seg for _, seg, end in rows)
    B = len(rows)
    input_ids = torch.full((B, width), pad_id, dtype=torch.long)
    attention = torch.zeros((B, width), dtype=torch.long)
    policy_tok = torch.zeros((B, width), dtype=torch.bool)
    lp = torch.zeros((B, width), dtype=torch.float32)
    turn_of = torch.full((B, width), -1, dtype=torch.long)
    for r, (rec, seg, end) in enumerate(rows):
        n = end - seg
        input_ids[r, :n] = torch.tensor(rec.ids[seg:end])
        attention[r, :n] = 1
        lp[r, :n] = torch.tensor(rec.logprobs[seg:end], dtype=torch.float32)
    state_pos, action_pos = [], []
    for flat, (ti, k, r, s, e) in enumerate(spans):
        policy_tok[r, s:e] = True  # the scored tokens are exactly the given spans
        turn_of[r, s:e] = flat
        state_pos.append((r, s - 1))
        action_pos.append((r, e - 1))
    # position p scores token p+1: shift the token-level masks left by one
    score_mask = torch.zeros_like(policy_tok)
    score_mask[:, :-1] = policy_tok[:, 1:]
    targets = torch.zeros_like(input_ids)
    targets[:, :-1] = input_ids[:, 1:]
    shifted_lp = torch.zeros_like(lp)
    shifted_lp[:, :-1] = lp[:, 1:]
    shifted_turn = torch.full_like(turn_of, -1)
    shifted_turn[:, :-1] = turn_of[:, 1:]
    return PackedBatch(
        input_ids=input_ids,
        attention_mask=attention,
        score_mask=score_mask,
        targets=targets,
        old_logprobs=shifted_lp[score_mask],
        token_turn=shifted_turn[score_mask],
        state_pos=torch.tensor(state_pos, dtype=torch.long).reshape(-1, 2),
        action_pos=torch.tensor(action_pos, dtype=torch.long).reshape(-1, 2),
        turn_refs=[(ti, k) for ti, k, *_ in spans],
    )


@dataclass
class ScoredBatch:
    """What one forward gives: per scored token ``(M,)`` log-probs and entropies, and optionally
    hidden states ``(B, T, H)`` (critic features): the final ones, or the input of one block."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None = None
    hidden: torch.Tensor | None = None


def backbone_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The decoder backbone (embeddings, ``layers``, ``norm``, ``rotary_emb``) and the LM head of an
    HF causal LM (Llama, Qwen2, SmolLM, Mistral...), through a PEFT wrapper if there is one."""
    core = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT wraps the model
    return core.base_model, core.get_output_embeddings()


def score(model: torch.nn.Module, batch: PackedBatch, *, entropy: bool = False, hidden: bool = False,
          hidden_layer: int | None = None) -> ScoredBatch:
    """Log-probs of the policy tokens under ``model``, from one forward over each sequence.

    With ``hidden``, also the ``(B, T, H)`` hidden states: the final (normed) ones, or with
    ``hidden_layer=i`` the input of block ``i`` (the output of the first ``i`` blocks), taken in
    passing from the same forward.

    ``logits = lm_head(last_hidden_state)`` is evaluated only where ``score_mask`` is set. This
    matches the model's own logits for decoder LMs whose head is a plain projection (Llama,
    Qwen2, SmolLM, Mistral...); ``tests/test_trainer_sequences.py`` checks it against ``model(...)``.

    A model sharded by ``trainers.actor.shard_model`` carries this computation as its registered
    FSDP forward method ``score_forward``: the backbone and head are submodules, and FSDP gathers
    the root's parameters (embeddings, final norm, head) and reduces their gradients only around
    a forward of the root.
    """
    device = next(model.parameters()).device
    args = (batch.input_ids.to(device), batch.attention_mask.to(device), batch.score_mask.to(device),
            batch.targets.to(device), entropy, hidden, hidden_layer)
    if batch.prefix is not None and batch.prefix[0] == id(model) and not hidden:  # run the blocks above it
        _, k, h0 = batch.prefix
        logprobs, ent, h = score_forward(model, *args, prefix=(k, h0.to(device)))
    else:
        forward = getattr(model, "score_forward", None) or functools.partial(score_forward, model)
        logprobs, ent, h = forward(*args)
    return ScoredBatch(logprobs=logprobs, entropy=ent, hidden=h)


def score_forward(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, mask: torch.Tensor,
                  targets: torch.Tensor, entropy: bool, hidden: bool, hidden_layer: int | None = None,
                  prefix: tuple[int, torch.Tensor] | None = None) -> tuple:
    """``score``'s forward on device tensors: ``(logprobs (M,), entropy (M,) or None, hidden or None)``;
    with ``prefix = (k, (B, T, H) hidden)``, from the output of block k-1 on (no ``hidden``)."""
    backbone, head = backbone_and_head(model)
    real = attention_mask.bool()
    if not hidden:  # only real positions are read: a right-padded batch runs the causal kernel
        attention_mask = causal_kernel_mask(attention_mask)
    if prefix is not None:
        k, h0 = prefix
        if attention_mask is None and packed_blocks_agree(model, k):
            # the rows' real tokens end to end, so the blocks multiply no padding (a quarter of
            # a clone fit's padded tokens); ``mask`` lies on real tokens, in the same row-major order
            h = packed_blocks(backbone, k, h0[real][None], real.sum(1).tolist())[0]
            logits = head(h[mask[real]])
        else:
            with _only_blocks(backbone, k, None):
                h = backbone(inputs_embeds=h0, attention_mask=attention_mask, use_cache=False).last_hidden_state
            logits = head(h[mask])
        logprobs, ent = Fn.token_logprobs_and_entropy(logits, targets[mask], entropy)
        return logprobs, ent, None
    kept: list[torch.Tensor] = []
    hook = None
    if hidden and hidden_layer is not None:
        # a pre-hook keeps one block's input; output_hidden_states would hold all N + 1 of them
        def keep(_module, args, kwargs):
            kept.append(args[0] if args else kwargs["hidden_states"])

        hook = backbone.layers[hidden_layer].register_forward_pre_hook(keep, with_kwargs=True)
    try:
        out = backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    finally:
        if hook is not None:
            hook.remove()
    h = out.last_hidden_state
    logits = head(h[mask])  # (M, V): the head runs only where a policy token is predicted
    logprobs, ent = Fn.token_logprobs_and_entropy(logits, targets[mask], entropy)
    return logprobs, ent, None if not hidden else kept[0] if hook is not None else h


def causal_kernel_mask(attention_mask: torch.Tensor) -> torch.Tensor | None:
    """``None`` for a right-padded batch (each row real tokens, then padding), else the mask.

    Under causal attention a real token never sees the padding after it, so a right-padded batch
    gives the same outputs at every real position without a mask; without one, attention runs the
    causal kernel, which skips the masked half (SDPA on a CPU: 1.7x faster forward and backward
    than the same mask given explicitly). Outputs at padded positions differ: read none of them.
    """
    if attention_mask.shape[1] > 1 and bool((attention_mask[:, 1:] > attention_mask[:, :-1]).any()):
        return attention_mask  # a row with padding before a real token
    return None


# ----- the frozen lower blocks, computed once per fit ------------------------------------------------
@contextlib.contextmanager
def _only_blocks(backbone: torch.nn.Module, start: int, stop: int | None):
    """Inside: ``backbone``'s forward runs blocks ``start:stop`` only, from ``inputs_embeds`` (taken as
    the input of block ``start``); with ``stop`` set, its output is that block's raw output (no final
    norm). Positions, the causal mask and rotary embeddings are made by the backbone as usual."""
    layers, norm = backbone.layers, backbone.norm
    backbone.layers = torch.nn.ModuleList(list(layers)[start:stop])
    if stop is not None:
        backbone.norm = torch.nn.Identity()
    try:
        yield
    finally:
        backbone.layers, backbone.norm = layers, norm


def frozen_blocks(model: torch.nn.Module) -> int:
    """How many of the model's lowest blocks are frozen together with its embeddings and compute the
    same thing in training as in eval mode (no dropout), so their output can be computed once per fit.
    0 for a PEFT (LoRA) or FSDP-sharded model, trainable embeddings, or a model whose blocks the
    split forward does not reproduce (``_split_agrees``)."""
    if hasattr(model, "peft_config") or hasattr(model, "score_forward"):
        return 0
    backbone, _ = backbone_and_head(model)
    layers = getattr(backbone, "layers", None)
    embed = model.get_input_embeddings()
    if layers is None or any(p.requires_grad for p in embed.parameters()):
        return 0
    if float(getattr(backbone.config, "attention_dropout", 0.0) or 0.0) > 0:
        return 0
    k = 0
    for block in layers:
        if any(p.requires_grad for p in block.parameters()):
            break
        if any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in block.modules()):
            break
        k += 1
    if k == 0 or k == len(layers) or not _split_agrees(model, k):
        return 0
    return k


_AGREES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {k or ("packed", start, stop): agrees}


@torch.no_grad()
def _probe_once(model: torch.nn.Module, key: Any, check: Any) -> bool:
    """``check(backbone, device, generator) -> bool`` run once per model and ``key``, in eval mode on
    fp32 probe inputs; False when it raises (a model of another layout)."""
    seen = _AGREES.setdefault(model, {})
    if key not in seen:
        backbone, _ = backbone_and_head(model)
        training = model.training
        model.eval()
        try:
            seen[key] = bool(check(backbone, next(model.parameters()).device, torch.Generator().manual_seed(0)))
        except (AttributeError, TypeError, ValueError, RuntimeError):
            seen[key] = False
        finally:
            model.train(training)
    return seen[key]


def _probe_rows(device: torch.device) -> torch.Tensor:
    """The probes' ``(2, 9)`` real-token mask: the second row shorter, right-padded as ``pack_batch`` pads."""
    real = torch.ones(2, 9, dtype=torch.bool, device=device)
    real[1, 6:] = False
    return real


def _split_agrees(model: torch.nn.Module, k: int) -> bool:
    """Whether blocks 0:k then k: (``_only_blocks``) give the model's own forward, on a short padded
    probe batch in fp32 (once per model and k)."""
    def check(backbone, device, g):
        ids = torch.randint(0, model.get_input_embeddings().weight.shape[0], (2, 9), generator=g).to(device)
        real = _probe_rows(device)
        attn = real.long()
        want = backbone(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state
        with _only_blocks(backbone, 0, k):
            h = backbone(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state
        with _only_blocks(backbone, k, None):
            got = backbone(inputs_embeds=h, attention_mask=attn, use_cache=False).last_hidden_state
        return torch.allclose(got[real], want[real], atol=1e-4, rtol=1e-4)

    return _probe_once(model, k, check)


def packed_blocks(backbone: torch.nn.Module, start: int, h: torch.Tensor, lens: list[int],
                  stop: int | None = None) -> torch.Tensor:
    """Blocks ``start:stop`` over rows packed end to end: ``h`` is ``(1, sum(lens), hidden)``, the
    input of block ``start`` for each row's real tokens in turn; with ``stop=None`` the final norm
    follows (as ``_only_blocks``). Each row attends causally within itself (one attention call per
    row and block) and its positions restart at 0, so every real position gets what the padded
    forward gives it, and no padding is multiplied (a quarter of a clone fit's padded tokens).
    ``packed_blocks_agree`` checks that on the model before it is used."""
    pos = torch.cat([torch.arange(n, device=h.device) for n in lens])[None]
    cos, sin = backbone.rotary_emb(h, pos)
    cos, sin = cos[:, None], sin[:, None]
    shape = attention_shape(backbone.config)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float) -> torch.Tensor:
        return torch.cat([torch.nn.functional.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=scaling,
                                                                           enable_gqa=True)
                          for qi, ki, vi in zip(q.split(lens, 2), k.split(lens, 2), v.split(lens, 2))], 2)

    for layer in list(backbone.layers)[start:stop]:
        h = block_forward(layer, h, cos, sin, shape, functools.partial(attend, scaling=layer.self_attn.scaling))
    return backbone.norm(h) if stop is None else h


def packed_blocks_agree(model: torch.nn.Module, start: int, stop: int | None = None) -> bool:
    """Whether ``packed_blocks`` gives the model's own blocks ``start:stop`` on a right-padded probe
    batch in fp32 (once per model and split; a model of another layout falls back to padding)."""
    def check(backbone, device, g):
        vocab, width = model.get_input_embeddings().weight.shape
        real = _probe_rows(device)
        if start == 0:  # from token ids: the caller embeds with ``embed_tokens`` alone
            ids = torch.randint(0, vocab, (2, 9), generator=g).to(device)
            inputs, h0 = {"input_ids": ids}, backbone.embed_tokens(ids)
        else:
            h0 = torch.randn(2, 9, width, generator=g).to(device)
            inputs = {"inputs_embeds": h0}
        with _only_blocks(backbone, start, stop):
            want = backbone(**inputs, use_cache=False).last_hidden_state[real]
        got = packed_blocks(backbone, start, h0[real][None], real.sum(1).tolist(), stop)[0]
        return torch.allclose(got.float(), want.float(), atol=1e-4, rtol=1e-4)

    return _probe_once(model, ("packed", start, stop), check)


@torch.no_grad()
def frozen_prefix(model: torch.nn.Module, batch: PackedBatch, chunk_rows: int, autocast: Any = None,
                  on_chunk: Any = None) -> PackedBatch:
    """``batch`` carrying the output of the model's frozen lower blocks (``frozen_blocks``) at every
    position (``PackedBatch.prefix``), computed now, ``chunk_rows`` rows at a time (each chunk cut to
    its longest row, as ``select_rows`` cuts a micro-batch); ``batch`` itself when no block is frozen.

    Args:
        model: The trained model (its frozen blocks' weights must not change while the batch is used).
        batch: The episodes of a fit.
        chunk_rows: Rows per forward.
        autocast: A context-manager factory for the forward (the update's mixed precision), or None.
        on_chunk: Called as ``on_chunk(rows_done, rows)`` after each chunk (a progress bar's postfix).
    """
    k = frozen_blocks(model)
    if k == 0:
        return batch
    backbone, _ = backbone_and_head(model)
    device = next(model.parameters()).device
    packed = packed_blocks_agree(model, 0, k)
    out = None
    training = model.training
    model.eval()  # no dropout either way (frozen_blocks checked); eval skips nothing else
    try:
        for i in range(0, batch.input_ids.shape[0], max(1, chunk_rows)):
            rows = list(range(i, min(batch.input_ids.shape[0], i + chunk_rows)))
            width = int(batch.attention_mask[rows].sum(dim=1).max())
            ids = batch.input_ids[rows, :width].to(device)
            attn = causal_kernel_mask(batch.attention_mask[rows, :width].to(device))
            with (autocast() if autocast is not None else contextlib.nullcontext()):
                if attn is None and packed:  # the rows' real tokens end to end (padding stays zero)
                    real = batch.attention_mask[rows, :width].to(device).bool()
                    flat = packed_blocks(backbone, 0, backbone.embed_tokens(ids[real])[None], real.sum(1).tolist(), k)[0]
                    h = flat.new_zeros(len(rows), width, flat.shape[-1])
                    h[real] = flat
                else:
                    with _only_blocks(backbone, 0, k):
                        h = backbone(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state
            if out is None:
                out = h.new_zeros(batch.input_ids.shape[0], batch.input_ids.shape[1], h.shape[-1])
            out[i : i + len(rows), :width] = h
            if on_chunk is not None:
                on_chunk(i + len(rows), batch.input_ids.shape[0])
    finally:
        model.train(training)
    return dataclasses.replace(batch, prefix=(id(model), k, out))


def join_prefixes(batch: PackedBatch, parts: list[PackedBatch]) -> PackedBatch:
    """``batch`` (``pack_batch`` of some episodes) carrying the prefixes of ``parts`` (each the
    ``pack_batch`` of one of those episodes, in the same order, with ``frozen_prefix``); ``batch``
    itself when a part has none."""
    if not parts or any(p.prefix is None for p in parts):
        return batch
    width = batch.input_ids.shape[1]
    hidden = torch.cat([torch.nn.functional.pad(p.prefix[2][:, :width], (0, 0, 0, width - min(width, p.prefix[2].shape[1])))
                        for p in parts])
    if hidden.shape[0] != batch.input_ids.shape[0]:
        raise ValueError(f"the parts hold {hidden.shape[0]} rows, the batch {batch.input_ids.shape[0]}")
    return dataclasses.replace(batch, prefix=(*parts[0].prefix[:2], hidden))
