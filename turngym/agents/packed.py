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

``dtype=torch.bfloat16`` generates from a bf16 copy of the weights (``sync`` refreshes it after a
training step). On a CPU with native bf16 (AVX512-BF16, AMX) that halves the bytes every decode step
reads and doubles the matmul rate. The trainer then takes the PPO ratio's old log-probs from its
own forward (``old_logprobs: auto`` rescores when generation and update precisions differ).
"""

from __future__ import annotations

import copy
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

PROBE_TOLERANCE = 1e-3  # max |logit difference| between the packed loop and the model's forward (fp32: ~1e-5)
# Row groups (``PackedLM.row_groups``): a row's fixed cost, in new tokens (its ~90 small calls a
# forward), and how much heavier than an even share the heaviest group may be before one forward
# on all threads is the better choice (one long prefill beside a few short rows).
ROW_OVERHEAD_TOKENS = 8
MAX_GROUP_SHARE = 1.5
GROW_MIN_SLOTS = 64  # a cache that must grow gets at least this many free slots (a turn's new tokens)


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


def native_bf16(device: str | torch.device) -> bool:
    """Whether ``device`` computes bf16 natively: CUDA, or a CPU with AVX512-BF16 or AMX. A CPU
    without them (AVX2 only) emulates bf16 matmuls, measured 83x slower than fp32."""
    kind = torch.device(device).type
    if kind != "cpu":
        return kind == "cuda"
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def attention_shape(config: Any) -> tuple[int, int, int]:
    """``(query heads, key/value heads, head dim)`` of a Llama-style model's config."""
    cfg = config.get_text_config(decoder=True)
    heads = cfg.num_attention_heads
    return heads, getattr(cfg, "num_key_value_heads", None) or heads, getattr(cfg, "head_dim", None) or cfg.hidden_size // heads


def block_forward(layer: Any, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, shape: tuple[int, int, int],
                  attend: Any) -> torch.Tensor:
    """One Llama-style decoder block over a packed ``(1, N, hidden)`` sequence, from the block's own
    modules (norms, projections, MLP). ``attend(q, k, v)`` maps the rotated ``(1, heads, N, head_dim)``
    queries and ``(1, kv_heads, N, head_dim)`` keys and values to the ``(1, heads, N, head_dim)``
    attention output: the only part that depends on which tokens see which (rows, caches)."""
    heads, kv_heads, head_dim = shape
    attn, total = layer.self_attn, h.shape[1]
    x = layer.input_layernorm(h)
    q = attn.q_proj(x).view(1, total, heads, head_dim).transpose(1, 2)
    k = attn.k_proj(x).view(1, total, kv_heads, head_dim).transpose(1, 2)
    v = attn.v_proj(x).view(1, total, kv_heads, head_dim).transpose(1, 2)
    q = q * cos + _rotate_half(q) * sin  # RoPE (Su et al., 2021), as the model's own layer applies it
    k = k * cos + _rotate_half(k) * sin
    o = attend(q, k, v)
    h = h + attn.o_proj(o.transpose(1, 2).reshape(1, total, -1).to(h.dtype))
    return h + layer.mlp(layer.post_attention_layernorm(h))


class PackedLM:
    """The packed forward over a Llama-style ``*ForCausalLM`` (Llama, Qwen2, SmolLM2, ...).

    Args:
        model: The causal LM; its modules are used in place, never copied (unless ``dtype``).
        dtype: Generate from a copy of the weights in this dtype (``None``: the model's own).
    """

    def __init__(self, model: Any, dtype: torch.dtype | None = None) -> None:
        self.model = model  # the weights that train
        if dtype is not None and dtype != next(model.parameters()).dtype:
            self.runner = copy.deepcopy(model).to(dtype).eval()  # the weights that generate
            for p in self.runner.parameters():
                p.requires_grad_(False)
        else:
            self.runner = model
        self.base = self.runner.model
        self.shape = attention_shape(model.config)
        self.n_heads, self.n_kv, self.head_dim = self.shape
        self.layers = list(self.base.layers)
        self.split_rows = True  # run a batch's rows as one group per thread on a CPU (``row_groups``)

    @classmethod
    def build(cls, model: Any, dtype: torch.dtype | None = None) -> "PackedLM | None":
        """A ``PackedLM`` when ``model`` has the Llama layout and the probe agrees, else ``None``."""
        try:
            packed = cls(model, dtype)
            # The probe checks that the packed loop computes the model's function. In bf16 the loop and
            # the model's forward round in different orders and differ by up to ~5% of the largest
            # logit: one SFT checkpoint of the long protocol (seed 2) missed the bf16 tolerance by
            # 0.875 vs 0.870, fell back to the padded path and evaluated 3x slower. The loop is the same
            # code in every dtype, so an fp32 model is probed exactly, in fp32, on its own weights.
            fp32_model = next(model.parameters()).dtype == torch.float32
            checker = cls(model) if packed.runner is not model and fp32_model else packed
            return packed if checker.probe() else None
        except (AttributeError, TypeError, ValueError, RuntimeError):
            return None

    @property
    def dtype(self) -> torch.dtype:
        return next(self.runner.parameters()).dtype

    @torch.no_grad()
    def sync(self) -> None:
        """Copy the trained weights into the generating copy (no-op without one)."""
        if self.runner is not self.model:
            for dst, src in zip(self.runner.state_dict().values(), self.model.state_dict().values()):
                dst.copy_(src)

    @torch.no_grad()
    def probe(self) -> bool:
        """Run a short prompt in two packed rows (one a continuation of a cache) and through the
        generating model's own forward; True when the last-token logits agree within
        ``PROBE_TOLERANCE`` (relative to their scale in bf16)."""
        model = self.runner
        device = next(model.parameters()).device
        vocab = model.get_input_embeddings().weight.shape[0]
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, vocab, (11,), generator=g).tolist()
        was_training = model.training
        model.eval()
        try:
            want = model(input_ids=torch.tensor([ids], device=device)).logits[0, -1].float()
            a, b = self.new_cache(0), self.new_cache(0)
            self.forward([a], [ids[:6]])
            got = self.forward([a, b], [ids[6:], ids])
        finally:
            model.train(was_training)
        tol = PROBE_TOLERANCE if self.dtype == torch.float32 else 0.05 * float(want.abs().max()) + PROBE_TOLERANCE
        return bool((got - want).abs().max() <= tol)

    # ----- caches ---------------------------------------------------------------------------
    def new_cache(self, epoch: int, capacity: int = 256, owner: int = 0) -> SlotCache:
        p = next(self.runner.parameters())
        shape = (self.n_kv, capacity, self.head_dim)
        dt = self.attn_dtype
        return SlotCache([], epoch, [p.new_empty(shape, dtype=dt) for _ in self.layers],
                         [p.new_empty(shape, dtype=dt) for _ in self.layers], owner)

    @property
    def attn_dtype(self) -> torch.dtype:
        """Keys, values and attention are in the weights' dtype. In bf16 on a CPU they were kept in
        fp32 while an older torch's bf16 attention over one short query row measured ~10x slower
        than fp32's; with torch 2.13 bf16 attention is the faster one at every shape a rollout makes
        (``benchmarks/attention.py``, 2 threads: 1.5-2.1x for one decoded token over 300-4,000 cached
        ones, 1.9-2.2x for a turn's 100-token prefill; 0.96-1.3x for 8 drafted tokens). On long
        episodes (TextWorld-medium) attention took about half of an evaluation's time."""
        return self.dtype

    def fork(self, cache: SlotCache, keep: int, capacity: int, owner: int) -> SlotCache:
        """A copy of ``cache``'s first ``keep`` tokens, owned by ``owner``, with room for ``capacity``."""
        out = self.new_cache(cache.epoch, max(capacity, keep), owner)
        for dst, src in zip(out.keys + out.values, cache.keys + cache.values):
            dst[:, :keep] = src[:, :keep]
        out.ids = list(cache.ids[:keep])
        return out

    @staticmethod
    def _reserve(cache: SlotCache, need: int) -> None:
        """Grow ``cache``'s buffers so ``need`` slots fit, with a quarter more room. Doubling left an
        episode's cache up to half empty, and 32 to 64 of them are alive in an evaluation or a
        search: most of a run's memory. A copy per growth costs less than a forward."""
        if need <= cache.capacity:
            return
        cap = need + max(GROW_MIN_SLOTS, need // 4)
        n = len(cache.ids)
        for buf in (cache.keys, cache.values):
            for i, old in enumerate(buf):
                new = old.new_empty(old.shape[0], cap, old.shape[2])
                new[:, :n] = old[:, :n]
                buf[i] = new

    # ----- the forward ----------------------------------------------------------------------
    def forward(self, caches: list[SlotCache], new: list[list[int]], tail: list[int] | None = None) -> torch.Tensor:
        """Run each row's ``new`` tokens after its cached ones; append them to the caches.

        On a CPU with several threads, a batch of several rows runs as row groups, one group per
        thread, each on one OpenMP thread (``row_groups``): the rows never interact, and a forward
        of many short rows is mostly small per-row operations (attention against each row's own
        cache, about 1,000 calls a forward) whose fork and join across threads cost more than their
        arithmetic. ``benchmarks/row_groups.py`` measures it against one forward on all threads.

        Args:
            caches: One cache per row, each appended to in place (callers fork shared ones first).
            new: Per row, at least one new token id.
            tail: Per row, how many of its last new tokens get logits (default 1 each).

        Returns:
            ``(sum(tail), V)`` fp32 logits, row after row (``(B, V)`` at each row's last new token by default).
        """
        lens = [len(x) for x in new]
        if min(lens) < 1:
            raise ValueError("every row needs at least one new token")
        tail = tail or [1] * len(new)
        groups = self.row_groups(lens, caches[0].keys[0].device)
        if len(groups) < 2:
            return self._forward_rows(caches, new, tail)
        pool = single_thread_pool(len(groups))
        futures = [pool.submit(self._forward_rows, [caches[i] for i in g], [new[i] for i in g], [tail[i] for i in g])
                   for g in groups]
        outs = [f.result() for f in futures]
        pieces: list[torch.Tensor | None] = [None] * len(new)
        for g, out in zip(groups, outs):
            for i, part in zip(g, out.split([tail[i] for i in g])):
                pieces[i] = part
        return torch.cat(pieces)  # type: ignore[arg-type]

    def row_groups(self, lens: list[int], device: torch.device) -> list[list[int]]:
        """How ``forward`` splits a batch of rows with ``lens`` new tokens: one group (all rows) on a
        GPU, with one thread, or when one row outweighs the rest; else a group per thread, balanced
        by new tokens plus a per-row overhead (rows keep their order within a group)."""
        threads = torch.get_num_threads() if self.split_rows and device.type == "cpu" else 1
        k = min(threads, len(lens))
        if k < 2:
            return [list(range(len(lens)))]
        cost = [n + ROW_OVERHEAD_TOKENS for n in lens]
        loads, groups = [0] * k, [[] for _ in range(k)]
        for i in sorted(range(len(lens)), key=lambda i: -cost[i]):  # the largest first, to the lightest group
            j = loads.index(min(loads))
            loads[j] += cost[i]
            groups[j].append(i)
        if max(loads) > MAX_GROUP_SHARE * sum(loads) / k:
            return [list(range(len(lens)))]
        return [sorted(g) for g in groups if g]

    @torch.no_grad()
    def _forward_rows(self, caches: list[SlotCache], new: list[list[int]], tail: list[int]) -> torch.Tensor:
        lens = [len(x) for x in new]
        past = [len(c.ids) for c in caches]
        for c, p, n in zip(caches, past, lens):
            self._reserve(c, p + n)
        device = caches[0].keys[0].device
        ids = torch.tensor([t for x in new for t in x], device=device)[None]
        pos = torch.cat([torch.arange(p, p + n) for p, n in zip(past, lens)]).to(device)[None]
        ends = torch.tensor(lens).cumsum(0).tolist()
        # row i's query j (absolute position past_i + j) sees cached slots 0 .. past_i + j
        masks = [None if n == 1 else (torch.arange(p + n, device=device)[None] <= (p + torch.arange(n, device=device))[:, None])
                 for p, n in zip(past, lens)]
        h = self.base.embed_tokens(ids)
        cos, sin = self.base.rotary_emb(h, pos)
        cos, sin = cos[:, None], sin[:, None]  # (1, 1, N, D): broadcast over heads
        for li, layer in enumerate(self.layers):
            def attend(q, k, v, li=li, scaling=layer.self_attn.scaling):
                # per row: write its new keys/values into its cache, attend over the cache
                q, k, v = q.to(self.attn_dtype), k.to(self.attn_dtype), v.to(self.attn_dtype)
                outs = []
                for c, p, n, m, qi, ki, vi in zip(caches, past, lens, masks, q.split(lens, 2), k.split(lens, 2), v.split(lens, 2)):
                    kc, vc = c.keys[li], c.values[li]
                    kc[:, p : p + n] = ki[0]
                    vc[:, p : p + n] = vi[0]
                    outs.append(F.scaled_dot_product_attention(qi, kc[None, :, : p + n], vc[None, :, : p + n],
                                                               attn_mask=m, scale=scaling, enable_gqa=True))
                return torch.cat(outs, 2)

            h = block_forward(layer, h, cos, sin, self.shape, attend)
        for c, x in zip(caches, new):
            c.ids.extend(x)
        last = self.base.norm(h[0, [i for e, t in zip(ends, tail) for i in range(e - min(t, e), e)]])
        return self.runner.lm_head(last).float()


_ROW_POOLS: dict[tuple[int, int], ThreadPoolExecutor] = {}  # by (process, workers): a forked child makes its own
_ROW_POOLS_LOCK = threading.Lock()


def single_thread_pool(n: int) -> ThreadPoolExecutor:
    """``n`` worker threads that each compute on one OpenMP thread (made once per process)."""
    key = (os.getpid(), n)
    with _ROW_POOLS_LOCK:
        if key not in _ROW_POOLS:
            threads = torch.get_num_threads()
            pool = ThreadPoolExecutor(n, thread_name_prefix="packed-rows")
            ready = threading.Barrier(n)  # every worker runs the initializer once

            def one_thread() -> None:
                torch.set_num_threads(1)
                # a thread takes its count on its first parallel call, from the process-wide
                # setting, which is 1 only until the line below it resets: take it now
                if torch.get_num_threads() != 1:
                    raise RuntimeError("could not give a row-group worker one OpenMP thread")
                ready.wait()

            for f in [pool.submit(one_thread) for _ in range(n)]:
                f.result()
            # set_num_threads also sets the count threads started later begin with: restore it
            torch.set_num_threads(threads)
            _ROW_POOLS[key] = pool
        return _ROW_POOLS[key]
