"""Token sampling pieces shared by the LLM backends: pure functions of tensors, plus stop strings.

Log-probs come in two kinds, and the backends record both:

- raw: ``log_softmax(logits)`` at temperature 1 with no top-p. This is the model's own
  distribution, what a trainer recomputes for PPO / importance ratios; ``Utterance.logprobs`` holds it.
- sampling: the log-prob of the token under the distribution actually sampled from (after
  temperature and top-p); 0.0 for greedy. Useful for off-policy corrections.
"""

from __future__ import annotations

import hashlib
from typing import Callable, Sequence

import torch


def top_p_filter(logits: torch.Tensor, top_p: float, k: int = 256) -> torch.Tensor:
    """Nucleus filtering: keep the smallest set of top tokens whose mass reaches ``top_p``.

    Sorting a 50k-150k vocabulary every step dominates CPU sampling, so the nucleus is looked
    for among the top ``k`` tokens first and the full sort runs only for rows where those ``k``
    do not reach ``top_p`` (``top_p_filter_reference`` is the plain version; a test checks they agree).

    Args:
        logits: ``(B, V)`` (already temperature-scaled).
        top_p: In (0, 1]; 1 keeps everything.
        k: Candidate set size for the fast path.

    Returns:
        ``(B, V)`` logits with the dropped tokens at ``-inf`` (the top token is always kept).
    """
    if top_p >= 1.0:
        return logits
    if k >= logits.shape[-1]:
        return top_p_filter_reference(logits, top_p)
    probs = logits.softmax(dim=-1)
    top, order = probs.topk(k, dim=-1)
    if bool((top.sum(dim=-1) < top_p).any()):
        return top_p_filter_reference(logits, top_p)
    drop = (top.cumsum(dim=-1) - top) >= top_p
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order, ~drop)
    return logits.masked_fill(~keep, float("-inf"))


def top_p_filter_reference(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Plain nucleus filtering over a full sort (Holtzman et al., 2020)."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    # Drop a token when the mass strictly before it already reaches top_p.
    drop = (probs.cumsum(dim=-1) - probs) >= top_p
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


def sample_next(
    logits: torch.Tensor, temperature: float, top_p: float, generators: Sequence[torch.Generator] | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pick one token per row.

    Sampling uses the exponential race: ``argmax(p_i / E_i)`` with ``E_i ~ Exp(1)`` draws token i
    with probability ``p_i``, and costs one pass over the vocabulary instead of multinomial's CDF.

    Args:
        logits: ``(B, V)`` raw next-token logits.
        temperature: 0 means greedy (argmax).
        top_p: Nucleus mass.
        generators: One per row (reproducible sampling), or ``None`` for torch's global RNG.

    Returns:
        ``(tokens, raw_logprobs, sampling_logprobs)``, each ``(B,)``.
    """
    logits = logits.float()
    raw = logits.log_softmax(dim=-1)
    if temperature == 0:
        tokens = logits.argmax(dim=-1)
        return tokens, raw.gather(-1, tokens[:, None])[:, 0], torch.zeros_like(tokens, dtype=raw.dtype)
    proc = top_p_filter(logits / temperature, top_p).log_softmax(dim=-1)
    noise = torch.empty_like(proc)
    if generators is None:
        noise.exponential_()
    else:
        for i, g in enumerate(generators):
            noise[i].exponential_(generator=g)
    tokens = (proc - noise.log()).argmax(dim=-1)
    idx = tokens[:, None]
    return tokens, raw.gather(-1, idx)[:, 0], proc.gather(-1, idx)[:, 0]


def row_seeds(seed: int, prompts: Sequence[Sequence[int]], turns: Sequence[int]) -> list[int]:
    """One seed per row from (seed, turn, prompt content, repeat index).

    A row's samples then do not depend on which other rows share its batch (batched and one-by-one
    runs agree), while identical prompts in one batch (a GRPO group) still get different samples.
    """
    seen: dict[bytes, int] = {}
    out = []
    for prompt, turn in zip(prompts, turns):
        h = hashlib.blake2b(repr((seed, turn, list(prompt))).encode(), digest_size=8).digest()
        k = seen.get(h, 0)
        seen[h] = k + 1
        out.append(int.from_bytes(hashlib.blake2b(h + k.to_bytes(4, "little"), digest_size=8).digest(), "little") >> 1)
    return out


def decision_position(best_logprobs: Sequence[float]) -> int:
    """The reply's one real decision: the position whose most likely token is least likely (the
    lowest top-1 log-prob; the first such position on a tie). ``best_logprobs[j]`` is the top-1
    log-prob of the next token at position ``j`` of the reply."""
    return min(range(len(best_logprobs)), key=lambda j: best_logprobs[j])


def token_surface(tokenizer, token: int) -> str:
    """A token's text, stripped and lower-cased: two runner-ups with one surface make the same reply."""
    return tokenizer.decode([token], skip_special_tokens=False).strip().lower()


def runner_up_heads(action: Sequence[int], pos: int, candidates: Sequence[tuple[int, float]],
                    prefix_logprobs: Sequence[float], k: int,
                    surface: Callable[[int], str]) -> list[tuple[list[int], list[float]]]:
    """Up to ``k`` other starts of ``action``: its tokens before ``pos``, then a runner-up token at ``pos``.

    A candidate whose surface (``surface(token)``: its text stripped and lower-cased) equals the
    recorded token's or an earlier runner-up's is skipped: it would make the same reply.

    Args:
        action: The recorded reply's ids.
        pos: The decision position (``decision_position``).
        candidates: ``(token, log-prob)`` at ``pos``, most likely first (``k`` + a few, so that
            skipped ones leave ``k``).
        prefix_logprobs: The log-probs of ``action[:pos]``.
        k: Runner-ups wanted.
        surface: Token -> its surface form.

    Returns:
        ``(head ids, head log-probs)`` per runner-up, most likely first.
    """
    seen, out = {surface(action[pos])}, []
    for token, logprob in candidates:
        if len(out) >= k:
            break
        if surface(token) not in seen:
            seen.add(surface(token))
            out.append((list(action[:pos]) + [token], list(prefix_logprobs[:pos]) + [logprob]))
    return out


def make_generators(seeds: Sequence[int], device: torch.device | str) -> list[torch.Generator]:
    gens = []
    for s in seeds:
        g = torch.Generator(device=device)
        g.manual_seed(s)
        gens.append(g)
    return gens


class StopChecker:
    """Finds stop strings in a growing action, looking only at its tail.

    A stop string that ends inside the newest token is found on that step; the token is kept whole
    (ids stay exactly what was sampled), so the text may carry a few characters past the stop string
    when one token spans its end (e.g. ``>\\n``). Nothing after that token is sampled.
    """

    def __init__(self, tokenizer, stops: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.stops = [s for s in stops if s]
        # Every token decodes to >= 1 character, so this many tail tokens cover any stop string.
        self.window = max((len(s) for s in self.stops), default=0) + 2

    def hit(self, action_ids: Sequence[int]) -> bool:
        if not self.stops:
            return False
        tail = self.tokenizer.decode(list(action_ids[-self.window:]), skip_special_tokens=False)
        # Generation halts at the first hit, so any stop string in the tail is new on this step.
        return any(s in tail for s in self.stops)
