"""Per-conversation KV caches, batched for one ``act`` call and split back afterwards.

Each conversation keeps the keys/values of the tokens it has already run through the model
(``RowCache``: prompt + action minus the last sampled token, which was never fed). On the next turn
its new prompt extends those ids, so only the new tokens need a forward pass.

For a batch, rows with different cached lengths ``c_i`` and new lengths ``n_i`` are laid out as::

    [ pad .. | cached_i ]  [ pad .. | new_i ]  [ decode steps ... ]
      C = max c_i            N = max n_i

with a 2D attention mask that is 0 on every pad and explicit position ids, so each row sees exactly
its own tokens at their true positions. Holes in the middle are fine: the causal mask is built from
the 2D mask. The batch buffer is preallocated (``ReservedLayer``) so a decode step writes one slot
instead of re-concatenating the whole cache, which on CPU costs as much as the forward itself.
After sampling, ``split`` drops the pad slots and gives each conversation a dense cache again.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


@dataclass
class RowCache:
    """One conversation's cache: per layer ``(keys, values)`` of shape ``(H, T, D)``, and the T ids."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]
    ids: list[int]
    epoch: int = 0


class ReservedLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys/values are views into a buffer with room to grow.

    Args:
        capacity: Slots to reserve; the buffer doubles if a write needs more.
        keys: ``(B, H, C, D)`` initial content, or ``None`` to allocate on the first write.
        values: Same layout as ``keys``.
    """

    is_croppable = False

    def __init__(self, capacity: int, keys: torch.Tensor | None = None, values: torch.Tensor | None = None) -> None:
        super().__init__()
        self.capacity, self.length = capacity, 0
        if keys is not None:
            self._allocate(keys, values)
            self._kbuf[:, :, : keys.shape[2]] = keys
            self._vbuf[:, :, : keys.shape[2]] = values
            self.length = keys.shape[2]
            self._views()

    def _allocate(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        b, h, c, d = keys.shape
        self._kbuf = keys.new_zeros(b, h, max(self.capacity, c), d)
        self._vbuf = values.new_zeros(b, h, max(self.capacity, c), values.shape[-1])
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True

    def _views(self) -> None:
        self.keys = self._kbuf[:, :, : self.length]
        self.values = self._vbuf[:, :, : self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self._allocate(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self._kbuf.shape[2]:
            grow = max(end, 2 * self._kbuf.shape[2]) - self._kbuf.shape[2]
            self._kbuf = torch.cat([self._kbuf, self._kbuf.new_zeros(*self._kbuf.shape[:2], grow, self._kbuf.shape[3])], 2)
            self._vbuf = torch.cat([self._vbuf, self._vbuf.new_zeros(*self._vbuf.shape[:2], grow, self._vbuf.shape[3])], 2)
        self._kbuf[:, :, self.length : end] = key_states
        self._vbuf[:, :, self.length : end] = value_states
        self.length = end
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("ReservedLayer is rebuilt per act() call and never cropped")


def supports_reuse(config) -> bool:
    """True when every layer of the model uses a plain full-attention KV cache.

    Sliding-window, linear-attention and hybrid models keep a different cache per layer; for them
    the policy re-prefills each turn (still batched and exact), rather than risk a wrong cache.
    """
    try:
        probe = DynamicCache(config=config)
    except Exception:  # a config the cache factory does not understand: do not reuse
        return False
    return bool(probe.layers) and all(type(layer) is DynamicLayer for layer in probe.layers)


def cache_arg(model: torch.nn.Module) -> str:
    """The name under which ``model.forward`` takes a KV cache: ``cache`` from transformers 5.24 on,
    ``past_key_values`` before. Why: 5.24 deprecates ``past_key_values`` (removed in 5.40) and warns
    on every forward, while the project supports transformers from 4.51."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def returned_cache(out: Any) -> Any:
    """The KV cache a forward with ``use_cache=True`` returned, under either version's name."""
    return out["cache"] if "cache" in out else out.past_key_values


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two id lists."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # binary search on slice equality: O(n log n) in C, not a Python loop per token
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def stack(rows: list[RowCache | None], lengths: list[int], n_layers: int, capacity_extra: int):
    """Left-pad each row's first ``lengths[i]`` cached tokens into one batch cache.

    Args:
        rows: Each conversation's cache or ``None``.
        lengths: How many cached tokens of each row to use (0 for ``None``).
        n_layers: Model layers.
        capacity_extra: Slots to reserve after the cached part (new tokens + decode steps).

    Returns:
        ``(cache, cache_mask)``: a ``DynamicCache`` of ``ReservedLayer``s and the ``(B, C)`` 0/1 mask
        over its first C slots.
    """
    b, c = len(rows), max(lengths, default=0)
    like = next((r for r, n in zip(rows, lengths) if n), None)
    layers = []
    for li in range(n_layers):
        if like is None:
            layers.append(ReservedLayer(c + capacity_extra))
            continue
        k0, v0 = like.layers[li]
        k = k0.new_zeros(b, k0.shape[0], c, k0.shape[2])
        v = v0.new_zeros(b, v0.shape[0], c, v0.shape[2])
        for i, (row, n) in enumerate(zip(rows, lengths)):
            if n:
                k[i, :, c - n :] = row.layers[li][0][:, :n]
                v[i, :, c - n :] = row.layers[li][1][:, :n]
        layers.append(ReservedLayer(c + capacity_extra, k, v))
    cache = DynamicCache()
    cache.layers, cache.layer_class_to_replicate = layers, None
    mask = torch.zeros(b, c, dtype=torch.long)
    for i, n in enumerate(lengths):
        if n:
            mask[i, c - n :] = 1
    return cache, mask


def split(cache: DynamicCache, mask: torch.Tensor, ids: list[list[int]], epoch: int) -> list[RowCache]:
    """Each row's dense cache: the slots where ``mask`` is 1, which must be exactly ``len(ids[i])``.

    Raises:
        RuntimeError: a row's real slots do not match its ids (a bookkeeping bug; never silent).
    """
    out = []
    for i, row_ids in enumerate(ids):
        keep = mask[i].nonzero()[:, 0].to(cache.layers[0].keys.device)
        if keep.numel() != len(row_ids):
            raise RuntimeError(f"KV bookkeeping: row {i} has {keep.numel()} cached slots for {len(row_ids)} ids")
        layers = [
            (layer.keys[i].index_select(1, keep), layer.values[i].index_select(1, keep)) for layer in cache.layers
        ]
        out.append(RowCache(layers, list(row_ids), epoch))
    return out
