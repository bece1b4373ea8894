"""Attention at the shapes a rollout makes: fp32 against bf16 keys, values and queries, in one run.

``agents/packed.py`` runs each row's attention against its own cache with
``F.scaled_dot_product_attention`` (grouped-query heads shared, a causal mask when a row feeds
several tokens). Its keys and values are kept in the generating weights' dtype; this script is the
measurement behind that choice. The shapes are SmolLM2-135M's heads (9 query heads, 3 key/value
heads of 64) and the rows a rollout feeds: one decoded token, a few drafted tokens, or a turn's new
prompt tokens, over caches of a short episode (TextWorld-easy, a few hundred tokens) and a long one
(TextWorld-medium, up to about 4,000).

    python benchmarks/attention.py                 # the threads this process may use
    OMP_NUM_THREADS=1 python benchmarks/attention.py

Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64
# (new tokens of the row, cached + new tokens): decode, drafted decode, a turn's prefill
SHAPES = [(1, 300), (1, 1000), (1, 4000), (8, 300), (8, 4000), (100, 400), (100, 4000)]


def seconds_per_call(new: int, length: int, dtype: torch.dtype, reps: int) -> float:
    """Mean seconds of one attention call of ``new`` query rows over ``length`` keys, as packed.py makes it."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, HEADS, new, HEAD_DIM, generator=g).to(dtype)
    k = torch.randn(1, KV_HEADS, length, HEAD_DIM, generator=g).to(dtype)
    v = torch.randn(1, KV_HEADS, length, HEAD_DIM, generator=g).to(dtype)
    past = length - new
    mask = None if new == 1 else torch.arange(length)[None] <= (past + torch.arange(new))[:, None]

    def call():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=HEAD_DIM**-0.5, enable_gqa=True)

    call()
    t0 = time.perf_counter()
    for _ in range(reps):
        call()
    return (time.perf_counter() - t0) / reps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=50)
    args = p.parse_args()
    from turngym.agents.packed import native_bf16

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, native bf16: {native_bf16('cpu')}")
    print("| new tokens | keys | fp32, ms | bf16, ms | fp32 / bf16 |\n|---|---|---|---|---|")
    for new, length in SHAPES:
        fp32, bf16 = (seconds_per_call(new, length, dt, args.reps) * 1e3 for dt in (torch.float32, torch.bfloat16))
        print(f"| {new} | {length} | {fp32:.3f} | {bf16:.3f} | {fp32 / bf16:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
