"""Packed inference for Llama-style decoders: no padding, one KV buffer per conversation.

``HFPolicy``'s batched path lays a batch out as one padded rectangle: every row is padded to the
longest new segment, and HF's attention materialises a mask over the longest cache and copies the
key/value heads for grouped-query attention. On a CPU that made a TextWorld evaluation prefill at
about 250 tokens/s while the same model's dense forward runs at about 650.

``PackedLM`` runs the same weights another way:

- the batch's new tokens are concatenated into one sequence, so every linear layer (most of the
  compute) multiplies exactly the real tokens;
- attention runs per row against that row's own cache (``SlotCache``: a buffer per layer with room
  to grow, written in place), with grouped-query heads shared instead of copied;
- logits are computed only at each row's last position.

It calls the model's own modules (embeddings, norms, projections, rotary embedding, MLP), so a
training step that changes the weights is seen at once. Whether a model's layers really compute
what this loop assumes is not guessed from its class name: ``PackedLM.build`` runs a probe prompt
through both this loop and the model's own forward and keeps the packed path only when their
logits agree (``HFPolicy`` falls back to its batched path otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

PROBE_TOLERANCE = 1e-3  # max |logit difference| between the packed loop and the model's forward (fp32: ~1e-5)


@dataclass
class SlotCache:
    """One conversation's keys/values: per layer a ``(kv_heads, capacity, head_dim)`` buffer whose
    first ``len(ids)`` slots hold the tokens ``ids`` (everything run through the model so far).

    ``owner`` is the conversation that may append to it in place; anyone else copies first.
    """

    ids: list[int]
    epoch: int
    keys: list[torch.Tensor] = field(repr=False)
    values: list[torch.Tensor] = field(repr=False)
    owner: int = 0

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[1] if self.keys else 0


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class PackedLM:
    """The packed forward over a Llama-style ``*ForCausalLM`` (Llama, Qwen2, SmolLM2, ...).

    Args:
        model: The causal LM; its modules are used in place, never copied.
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        self.base = model.model
        cfg = model.config.get_text_config(decoder=True)
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.layers = list(self.base.layers)

    @classmethod
    def build(cls, model: Any) -> "PackedLM | None":
        """A ``PackedLM`` when ``model`` has the Llama layout and the probe agrees, else ``None``."""
        try:
            packed = cls(model)
            return packed if packed.probe() else None
        except (AttributeError, TypeError, ValueError, RuntimeError):
            return None

    @torch.no_grad()
    def probe(self) -> bool:
        """Run a short prompt in two packed rows (one a continuation of a cache) and through the
        model's own forward; True when the last-token logits agree within ``PROBE_TOLERANCE``."""
        device = next(self.model.parameters()).device
        vocab = self.model.get_input_embeddings().weight.shape[0]
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, vocab, (11,), generator=g).tolist()
        was_training = self.model.training
        self.model.eval()
        try:
            want = self.model(input_ids=torch.tensor([ids], device=device)).logits[0, -1].float()
            a, b = self.new_cache(0), self.new_cache(0)
            self.forward([a], [ids[:6]])
            got = self.forward([a, b], [ids[6:], ids])
        finally:
            self.model.train(was_training)
        return bool((got - want).abs().max() <= PROBE_TOLERANCE)

    # ----- caches ---------------------------------------------------------------------------
    def new_cache(self, epoch: int, capacity: int = 256, owner: int = 0) -> SlotCache:
        p = next(self.model.parameters())
        shape = (self.n_kv, capacity, self.head_dim)
        return SlotCache([], epoch, [p.new_empty(shape) for _ in self.layers], [p.new_empty(shape) for _ in self.layers], owner)

    def fork(self, cache: SlotCache, keep: int, capacity: int, owner: int) -> SlotCache:
        """A copy of ``cache``'s first ``keep`` tokens, owned by ``owner``, with room for ``capacity``."""
        out = self.new_cache(cache.epoch, max(capacity, keep), owner)
        for dst, src in zip(out.keys + out.values, cache.keys + cache.values):
            dst[:, :keep] = src[:, :keep]
        out.ids = list(cache.ids[:keep])
        return out

    @staticmethod
    def _reserve(cache: SlotCache, need: int) -> None:
        """Grow ``cache``'s buffers (doubling) so ``need`` slots fit."""
        if need <= cache.capacity:
            return
        cap = max(need, 2 * cache.capacity)
        n = len(cache.ids)
        for buf in (cache.keys, cache.values):
            for i, old in enumerate(buf):
                new = old.new_empty(old.shape[0], cap, old.shape[2])
                new[:, :n] = old[:, :n]
                buf[i] = new

    # ----- the forward ----------------------------------------------------------------------
    @torch.no_grad()
    def forward(self, caches: list[SlotCache], new: list[list[int]]) -> torch.Tensor:
        """Run each row's ``new`` tokens after its cached ones; append them to the caches.

        Args:
            caches: One cache per row, each appended to in place (callers fork shared ones first).
            new: Per row, at least one new token id.

        Returns:
            ``(B, V)`` fp32 logits at each row's last new token.
        """
        lens = [len(x) for x in new]
        if min(lens) < 1:
            raise ValueError("every row needs at least one new token")
        past = [len(c.ids) for c in caches]
        for c, p, n in zip(caches, past, lens):
            self._reserve(c, p + n)
        device = caches[0].keys[0].device
        ids = torch.tensor([t for x in new for t in x], device=device)[None]
        pos = torch.cat([torch.arange(p, p + n) for p, n in zip(past, lens)]).to(device)[None]
        ends = torch.tensor(lens).cumsum(0).tolist()
        starts = [e - n for e, n in zip(ends, lens)]
        # row i's query j (absolute position past_i + j) sees cached slots 0 .. past_i + j
        masks = [None if n == 1 else (torch.arange(p + n, device=device)[None] <= (p + torch.arange(n, device=device))[:, None])
                 for p, n in zip(past, lens)]
        h = self.base.embed_tokens(ids)
        cos, sin = self.base.rotary_emb(h, pos)
        cos, sin = cos[:, None], sin[:, None]  # (1, 1, N, D): broadcast over heads
        total = ids.shape[1]
        for li, layer in enumerate(self.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(1, total, self.n_heads, self.head_dim).transpose(1, 2)
            k = attn.k_proj(x).view(1, total, self.n_kv, self.head_dim).transpose(1, 2)
            v = attn.v_proj(x).view(1, total, self.n_kv, self.head_dim).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin  # RoPE (Su et al., 2021), as the model's own layer applies it
            k = k * cos + _rotate_half(k) * sin
            outs = []
            for c, p, n, s, e, m in zip(caches, past, lens, starts, ends, masks):
                c.keys[li][:, p : p + n] = k[0, :, s:e]
                c.values[li][:, p : p + n] = v[0, :, s:e]
                o = F.scaled_dot_product_attention(q[:, :, s:e], c.keys[li][None, :, : p + n], c.values[li][None, :, : p + n],
                                                   attn_mask=m, scale=attn.scaling, enable_gqa=True)
                outs.append(o[0].transpose(0, 1).reshape(n, -1))
            h = h + attn.o_proj(torch.cat(outs)[None])
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        for c, x in zip(caches, new):
            c.ids.extend(x)
        last = self.base.norm(h[0, [e - 1 for e in ends]])
        return self.model.lm_head(last).float()
