"""Greedy decoding with prompt-lookup drafts: several tokens checked by one forward.

On a CPU a decode step is bound by memory, not arithmetic: it reads every weight and every
conversation's whole KV cache (SmolLM2-135M in fp32: 46 KB per cached token, about 0.7 GB for 32
TextWorld episodes in flight) to produce one token per row. A multi-turn agent repeats itself: a
reply usually starts like the previous one (``<act>go `` ... ``</act>``) and names things the prompt
just said. So after each sampled token the row proposes the tokens that followed the latest earlier
occurrence of its last few tokens in its own sequence (prompt lookup, Saxena 2023; the n-gram
drafts of "Inference with Reference", Yang et al. 2023), and one forward scores them all. Every
draft token that is the model's own greedy choice is kept; the first one that is not is replaced by
that choice. The kept tokens are exactly those greedy decoding one token at a time picks (up to the
rounding of a multi-token forward), and the KV cache is read once for all of them.

Only greedy decoding drafts: it is what held-out evaluation, greedy screens and branch search play.
"""

from __future__ import annotations

from array import array
from typing import Any, Callable

import torch


def draft(seq: list[int], k: int, max_ngram: int = 3) -> list[int]:
    """Up to ``k`` tokens that followed the latest earlier occurrence of ``seq``'s last n tokens,
    trying n = ``max_ngram`` down to 1; ``[]`` when there is none.

    >>> draft([5, 6, 7, 9, 5, 6], 2)
    [7, 9]
    """
    if k < 1 or len(seq) < 2:
        return []
    buf = array("i", seq).tobytes()  # bytes.rfind searches in C; a match must start on a token boundary
    for n in range(min(max_ngram, len(seq) - 1), 0, -1):
        tail = buf[-4 * n:]
        end = len(buf) - 4  # an occurrence that ends before the last token (not the tail itself)
        pos = buf.rfind(tail, 0, end)
        while pos > 0 and pos % 4:
            end = pos + len(tail) - 1
            pos = buf.rfind(tail, 0, end)
        if pos >= 0 and pos % 4 == 0:
            follow = seq[pos // 4 + n: pos // 4 + n + k]
            if follow:
                return follow
    return []


@torch.no_grad()
def greedy_with_drafts(engine: Any, caches: list[Any], logits: torch.Tensor, push: Callable[[int, int, float], bool],
                       room: Callable[[int], int], k: int, stats: dict, end_ids: Any = ()) -> None:
    """Finish every row greedily, ``k`` drafted tokens per forward at most.

    Args:
        engine: The ``PackedLM`` that holds the rows' caches.
        caches: Per row, its ``SlotCache`` (prompt fed; appended to and cut back in place).
        logits: ``(B, V)`` each row's next-token logits after its prompt.
        push: ``push(row, token, raw_logprob)`` records a token; False when the row is done (a stop,
            an end token or its length cap).
        room: ``room(row)`` how many more tokens the row may still take (after the ones pushed).
        k: Draft tokens per row and forward.
        stats: Gets ``decode_steps`` (forwards) and ``drafted``/``accepted`` token counts.
        end_ids: Tokens that end a reply: a draft stops after one (nothing past it could be kept).

    Leaves each cache holding the prompt and the reply but its last token, as one-token decoding
    does (a rejected draft, or a last token fed as a draft, is cut off).
    """
    live = list(range(len(caches)))
    cur = logits
    while live:
        toks = cur.argmax(-1)
        raw = cur.float().log_softmax(-1).gather(-1, toks[:, None])[:, 0]
        rows, feeds = [], []
        for i, t, lp in zip(live, toks.tolist(), raw.tolist()):
            if push(i, t, lp):
                d = draft(caches[i].ids + [t], min(k, room(i)))
                cut = next((j + 1 for j, x in enumerate(d) if x in end_ids), len(d))
                rows.append(i)
                feeds.append([t] + d[:cut])
        if not rows:
            return
        past = [len(caches[i].ids) for i in rows]
        out = engine.forward([caches[i] for i in rows], feeds, tail=[len(f) for f in feeds])
        preds = out.argmax(-1).tolist()
        stats["decode_steps"] = stats.get("decode_steps", 0) + 1
        live, keep, at = [], [], 0
        for i, feed, p in zip(rows, feeds, past):
            kept, alive = 0, True
            for j in range(1, len(feed)):  # draft j is checked by the prediction after feed[j - 1]
                if preds[at + j - 1] != feed[j]:
                    break
                kept += 1
                alive = push(i, feed[j], float(out[at + j - 1].float().log_softmax(-1)[feed[j]]))
                if not alive:
                    break
            stats["drafted"] = stats.get("drafted", 0) + len(feed) - 1
            stats["accepted"] = stats.get("accepted", 0) + kept
            # cut off the rejected drafts (their keys and values are overwritten later) and, as in
            # one-token decoding, the reply's last token when it ended the row
            del caches[i].ids[p + 1 + kept - (not alive):]
            if alive:
                live.append(i)
                keep.append(at + kept)
            at += len(feed)
        cur = out[keep] if keep else None
