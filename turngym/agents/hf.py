"""``HFPolicy``: any Hugging Face causal LM as a turngym policy, with exact tokens and KV reuse.

The sampling loop is our own (one forward per token over the batch) rather than
``model.generate``, so that three things are explicit and testable:

- exact tokens: prompt ids come from ``ChatRenderer`` (incremental, see ``chat.py``), which also
  records every sampled action in the episode's ``TokenRecord``; the action ids are the sampled
  ones, never re-tokenized;
- log-probs: ``Utterance.logprobs`` are the RAW model log-probs of the sampled tokens
  (``log_softmax(logits)`` at temperature 1, no top-p), i.e. what ``score()`` and a trainer
  recompute for PPO ratios. The log-probs under the distribution actually sampled from (after
  temperature/top-p) are kept per turn in ``conv.state["turngym.chat"].sampling_logprobs``;
- KV reuse across turns: each conversation keeps the keys/values of everything it has already
  run through the model (``conv.state["turngym.hf_kv"]``); the next turn only prefills the new env
  tokens (see ``kvcache.py``). ``reuse_cache=False`` re-prefills the whole prompt every turn
  (the baseline ``benchmarks/rollout_tokens.py`` compares against).
- KV reuse across episodes: episodes of one env start with the same system prompt and tool
  instructions (on TextWorld, 112 of a first prompt's ~220 tokens). The policy prefills the prefix
  that new episodes share once, keeps it (``shared_prefix``), and starts every new episode from it.
- KV reuse across branches: the runner-up replies ``alternatives`` proposes at an episode's turn carry
  the cache of that turn's prompt (``Utterance.cache``); the branch that replays the episode up to
  there and plays one of them starts from it (``resume``) instead of prefilling the history again.
- packed forwards (``packed.py``, the CPU default): a batch's new tokens run as one unpadded
  sequence, each conversation attending to its own growing cache. The padded batch (``packed=False``,
  the GPU default, where one big kernel beats many small ones) pads rows to the longest. On a CPU
  with native bf16 they generate from a bf16 copy of the weights (``generation_dtype``), refreshed
  by ``invalidate_caches``.

Caches are tied to the weights they were computed with: after changing the model's weights
(a training step), call ``invalidate_caches()`` so the next turn re-prefills.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import weakref
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from turngym.agents.base import Conversation, SamplingParams
from turngym.agents.chat import ChatRenderer, chatml_tools_template
from turngym.agents.kvcache import RowCache, cache_arg, common_prefix, split, stack, supports_reuse
from turngym.agents.lookahead import greedy_with_drafts
from turngym.agents.packed import PackedLM, SlotCache, native_bf16
from turngym.agents.sampling import (StopChecker, decision_position, make_generators, row_seeds, runner_up_heads,
                                     sample_next, token_surface)
from turngym.agents.loading import load_model
from turngym.tools.formats import format_stops
from turngym.types import Utterance

KV_KEY = "turngym.hf_kv"
MIN_SHARED_PREFIX = 16  # tokens: below this a shared prefix saves less than its own forward costs


@dataclass
class Generation:
    """What the sampling loop produced for one row."""

    action_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    sampling_logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "length"
    ended_by_token: bool = False


def resolve_template(tokenizer: Any, chat_template: str | None) -> str | None:
    """The template to render with.

    ``"auto"`` keeps the tokenizer's template when it can render tools; a ChatML-native tokenizer
    (``<|im_start|>``/``<|im_end|>`` in its vocabulary) whose template cannot, or that has none, gets
    the bundled tool-capable ChatML template. Other models keep theirs, and tools are shown as text
    in the system message. ``"chatml_tools"`` forces the bundled template; any other string is a
    Jinja template; ``None`` keeps the tokenizer's.
    """
    if chat_template == "chatml_tools":
        return chatml_tools_template()
    if chat_template != "auto":
        return chat_template
    vocab = tokenizer.get_vocab()
    chatml = "<|im_start|>" in vocab and "<|im_end|>" in vocab
    own = getattr(tokenizer, "chat_template", None)
    if own and (not chatml or ChatRenderer(tokenizer).supports_tools):
        return None
    if chatml:
        return chatml_tools_template()
    raise ValueError("the tokenizer has no chat template and is not ChatML; pass chat_template=<jinja string>")


class HFPolicy:
    """A Hugging Face causal LM answering conversations in batches.

    Args:
        model_or_path: A loaded ``PreTrainedModel``, or a local path / hub id for ``AutoModelForCausalLM``.
        tokenizer: The tokenizer (loaded from ``model_or_path`` when it is a path).
        device: Where to run (default: the model's device, or CUDA when available for a path).
        dtype: For a path: default fp32 on CPU, bf16 on CUDA. Ignored for a loaded model.
        chat_template: ``"auto"`` (see ``resolve_template``), ``"chatml_tools"``, a Jinja string, or None.
        reuse_cache: Keep each conversation's KV cache across turns (off for models whose cache is
            not plain full attention, see ``kvcache.supports_reuse``).
        max_batch_size: Split larger ``act`` batches into chunks of this size (None: one batch).
        share_prefix: Prefill the prompt prefix that new episodes share once (with ``reuse_cache``).
        packed: Run forwards unpadded, one KV buffer per conversation (``packed.PackedLM``); ``None``
            = on a CPU. Used only with ``reuse_cache`` and when the model passes the packed probe.
        generation_dtype: The packed engine's weights: ``"auto"`` = bf16 where the device computes it
            natively (``packed.native_bf16``) and the model is fp32, else the model's own dtype; or a
            ``torch.dtype``. A trainer sets it to its update's precision.
        draft_tokens: Greedy decoding on the packed engine checks up to this many prompt-lookup
            draft tokens per forward (``lookahead.py``); 0 decodes one token per forward. Nearly every
            kept draft is among a row's first 3 (a TextWorld evaluation kept 2,078 drafts with 3
            a forward, 2,078 with 4 and 2,112 with 8), and each drafted token is a row of the forward whether kept
            or not, so 3 beats 8 where generation is compute-bound (a CPU without AMX:
            ``benchmarks/eval_batch.py --draft-tokens``).
        carried_cache_mb: ``alternatives`` (packed engine) attaches the prompt's KV cache to each
            runner-up reply (``Utterance.cache``), so the branch that plays it does not prefill its
            replayed history again; at most this many MB of such caches, and of the ended episodes'
            ones kept for branch search (``final_cache``), are alive at once (0 = none). The
            quickstart's search holds about 0.5 GB of episodes and 1 GB of runner-ups' caches.

    Raises:
        ValueError: the tokenizer has no usable chat template.
    """

    env_kwargs: dict[str, Any] = {}

    def __init__(
        self,
        model_or_path: Any,
        tokenizer: Any = None,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        chat_template: str | None = "auto",
        reuse_cache: bool = True,
        max_batch_size: int | None = None,
        share_prefix: bool = True,
        packed: bool | None = None,
        generation_dtype: torch.dtype | str = "auto",
        draft_tokens: int = 3,
        carried_cache_mb: int = 2048,
    ) -> None:
        self.model, self.tokenizer = load_model(model_or_path, tokenizer, device, dtype)
        self.model.eval()
        self.device = next(self.model.parameters()).device
        self.chat = ChatRenderer(self.tokenizer, resolve_template(self.tokenizer, chat_template))
        self.reuse_cache = bool(reuse_cache) and supports_reuse(self.model.config)
        self.share_prefix = share_prefix and self.reuse_cache
        self.max_batch_size = max_batch_size
        cfg = self.model.config.get_text_config(decoder=True)
        self.n_layers = cfg.num_hidden_layers
        self.max_len = getattr(cfg, "max_position_embeddings", None) or 1 << 30
        self.end_ids = set(self.chat.end_token_ids) | _eos_ids(self.model)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.end_ids, default=0)
        self._keep_arg = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        self._cache_arg = cache_arg(self.model)
        self.epoch = 0
        self.shared_prefix: RowCache | SlotCache | None = None
        if packed is None:
            packed = self.device.type == "cpu"
        self.use_packed = bool(packed) and self.reuse_cache
        self._packed: PackedLM | None = None
        self._synced_epoch = 0
        if generation_dtype == "auto":
            fp32 = next(self.model.parameters()).dtype == torch.float32
            generation_dtype = torch.bfloat16 if fp32 and native_bf16(self.device) else None
        self.generation_dtype: torch.dtype | None = generation_dtype
        self.draft_tokens = draft_tokens
        self.carried_cache_bytes = carried_cache_mb * 2**20
        self._carried: dict[int, int] = {}  # id -> bytes of the caches runner-up replies carry, while alive
        self.stats = {"prefill_tokens": 0, "reused_tokens": 0, "decode_steps": 0, "sampled_tokens": 0}

    @property
    def packed(self) -> PackedLM | None:
        """The packed engine over the current ``self.model`` (rebuilt when a stage swaps the model
        object, e.g. a LoRA merge), or ``None``: packed off, an FSDP-sharded model, or a model that
        failed the probe."""
        if not self.use_packed or _is_fsdp(self.model):
            return None
        want = self.generation_dtype or next(self.model.parameters()).dtype
        if self._packed is None or self._packed.model is not self.model or self._packed.dtype != want:
            self._packed = PackedLM.build(self.model, self.generation_dtype)
            self._synced_epoch = self.epoch
            if self._packed is None:
                self.use_packed = False
        elif self._synced_epoch != self.epoch:  # new weights: refresh the generating copy
            self._packed.sync()
            self._synced_epoch = self.epoch
        return self._packed

    def invalidate_caches(self) -> None:
        """Forget every conversation's KV cache (call after the weights change)."""
        self.epoch += 1

    # ----- the Policy interface ----------------------------------------------------------
    def act(self, conversations: list[Conversation], sampling: SamplingParams | None = None) -> list[Utterance]:
        """One utterance per conversation, with exact prompt/action ids and raw log-probs.

        Args:
            conversations: Episodes to answer; their ``state`` carries token records and KV caches.
            sampling: Temperature (0 = greedy), top-p, max_new_tokens, extra stop strings, seed.

        Returns:
            Utterances in order. A conversation already at the model's context limit gets an empty
            utterance with ``finish_reason="length"``.
        """
        sampling = sampling or SamplingParams()
        prompts = [self.chat.prompt_ids(c) for c in conversations]
        caches = [self._cache(c) for c in conversations]
        if self.share_prefix:
            self._share_prefix([p for p, c in zip(prompts, caches) if c is None])
            caches = [c if c is not None else self._prefix_for(p) for c, p in zip(caches, prompts)]
        out: list[Utterance | None] = [None] * len(conversations)
        for rows in self._buckets(caches, prompts):
            size = self.max_batch_size or len(rows)
            for i in range(0, len(rows), size):
                chunk = rows[i : i + size]
                utts = self._act_batch([conversations[j] for j in chunk], [prompts[j] for j in chunk],
                                       [caches[j] for j in chunk], sampling)
                for j, u in zip(chunk, utts):
                    out[j] = u
        return out  # type: ignore[return-value]

    def _buckets(self, caches: list[RowCache | None], prompts: list[list[int]]) -> list[list[int]]:
        """Rows grouped so a batch's prefill is not padded to a much longer row: an episode that
        just started needs its whole prompt prefilled (hundreds of tokens) while the others need
        only the last observation. One batch would pad every row to the longest; measured on
        TextWorld evaluation, that padding was most of the rollout's compute. Packed forwards pad
        nothing: one group."""
        if self.packed is not None:
            return [list(range(len(prompts)))]
        new = [len(p) - (min(common_prefix(c.ids, p), len(p) - 1) if c is not None else 0) for c, p in zip(caches, prompts)]
        cut = 2 * sorted(new)[len(new) // 2] + 32
        short = [i for i, n in enumerate(new) if n <= cut]
        long = [i for i, n in enumerate(new) if n > cut]
        return [g for g in (short, long) if g]

    def _act_batch(self, convs: list[Conversation], prompts: list[list[int]], caches: list[RowCache | None],
                   sampling: SamplingParams) -> list[Utterance]:
        stops = [list(sampling.stop) + format_stops(c.tool_format, c.tools) for c in convs]
        turns = [len(self.chat.state(c).sampling_logprobs) for c in convs]
        rows = [i for i, p in enumerate(prompts) if len(p) < self.max_len]
        gens, new_caches = self.generate(
            [prompts[i] for i in rows], sampling, [stops[i] for i in rows], [caches[i] for i in rows],
            [turns[i] for i in rows], owners=[id(convs[i]) for i in rows]
        )
        results: dict[int, Generation] = dict(zip(rows, gens))
        for i, cache in zip(rows, new_caches):
            if cache is not None:
                convs[i].state[KV_KEY] = (id(self), cache)
        out = []
        for i, conv in enumerate(convs):
            g = results.get(i, Generation())
            span = self.chat.record(conv, g.action_ids, g.logprobs, g.sampling_logprobs)
            text = self.tokenizer.decode(g.action_ids[:-1] if g.ended_by_token else g.action_ids, skip_special_tokens=False)
            out.append(Utterance(text=text, action_ids=list(g.action_ids), logprobs=list(g.logprobs),
                                 finish_reason=g.finish_reason, span=span, record=self.chat.state(conv).record))
        return out

    def resume(self, conv: Conversation, cache: RowCache | SlotCache) -> None:
        """Start ``conv`` from ``cache`` (a runner-up reply's, ``Utterance.cache``): its next turn
        reuses the cache up to their common prefix and prefills the rest. The cache is someone else's
        (its owner is not ``conv``), so it is forked, never extended in place."""
        if self.reuse_cache and self._usable(cache):
            conv.state[KV_KEY] = (id(self), cache)

    def _carry(self, cache: SlotCache | None) -> SlotCache | None:
        """``cache`` when the caches runner-up replies carry, with it, fit ``carried_cache_mb``; else None."""
        if cache is None or id(cache) in self._carried:
            return cache
        size = sum(t.numel() * t.element_size() for t in cache.keys + cache.values)
        if sum(self._carried.values()) + size > self.carried_cache_bytes:
            return None
        self._carried[id(cache)] = size
        weakref.finalize(cache, self._carried.pop, id(cache), None)  # released with the last reply that holds it
        return cache

    def final_cache(self, conv: Conversation) -> SlotCache | None:
        """A copy of ``conv``'s KV cache trimmed to its tokens, for an ended episode (``Trajectory.cache``):
        branch search then scores the episode's turns from it (``alternatives``' ``episode_caches``)
        instead of prefilling their history again. It shares ``carried_cache_mb`` with the caches
        runner-up replies carry; None when it does not fit, or on the padded engine."""
        held = self._cache(conv)
        if self.packed is None or not isinstance(held, SlotCache) or not held.ids:
            return None
        return self._carry(self.packed.fork(held, len(held.ids), len(held.ids), 0))

    def held_cache(self, conv: Conversation) -> RowCache | SlotCache | None:
        """``conv``'s KV cache as its last turn left it (prompt and reply), or None: what
        ``alternatives``' ``episode_caches`` take to score that reply without prefilling its
        history again. It is forked there, never extended."""
        return self._cache(conv)

    def _cache(self, conv: Conversation) -> RowCache | SlotCache | None:
        held = conv.state.get(KV_KEY)
        if not self.reuse_cache or not held or held[0] != id(self) or not self._usable(held[1]):
            return None
        return held[1]

    def _usable(self, cache: RowCache | SlotCache) -> bool:
        """Made with the current weights, by the engine (packed or padded) that runs now, in its dtype."""
        packed = self.packed
        if cache.epoch != self.epoch or isinstance(cache, SlotCache) != (packed is not None):
            return False
        return packed is None or not cache.keys or cache.keys[0].dtype == packed.attn_dtype

    def _prefix_for(self, prompt: list[int]) -> RowCache | SlotCache | None:
        """The shared prefix cache when it covers enough of this new episode's prompt."""
        held = self.shared_prefix
        if held is None or not self._usable(held) or common_prefix(held.ids, prompt) < MIN_SHARED_PREFIX:
            return None
        return held

    def _share_prefix(self, new_prompts: list[list[int]]) -> None:
        """Prefill the prefix that this call's new episodes share, once, when it is longer than what
        the kept prefix already covers (a new env, a group of one task, new weights)."""
        if len(new_prompts) < 2:
            return
        n = min(len(p) for p in new_prompts) - 1  # each row feeds at least its last token itself
        for p in new_prompts[1:]:
            n = min(n, common_prefix(new_prompts[0], p))
        held = self.shared_prefix
        covered = 0
        if held is not None and self._usable(held):
            covered = min(common_prefix(held.ids, p) for p in new_prompts)
        if n < MIN_SHARED_PREFIX or n <= covered:
            return
        self.shared_prefix = self._prefill_only(new_prompts[0][:n])

    @torch.no_grad()
    def _prefill_only(self, ids: list[int]) -> RowCache | SlotCache:
        """One row's KV cache for ``ids`` (no sampling)."""
        self.stats["prefill_tokens"] += len(ids)
        packed = self.packed
        if packed is not None:
            cache = packed.new_cache(self.epoch, len(ids))
            packed.forward([cache], [ids])
            return cache
        cache, _ = stack([None], [0], self.n_layers, len(ids))
        attn = torch.ones(1, len(ids), dtype=torch.long, device=self.device)
        pos = torch.arange(len(ids), device=self.device)[None]
        self._forward(torch.tensor([ids], device=self.device), attn, pos, cache)
        return split(cache, attn, [ids], self.epoch)[0]

    # ----- sampling ----------------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        stops: list[list[str]] | None = None,
        caches: list[RowCache | SlotCache | None] | None = None,
        turns: list[int] | None = None,
        owners: list[int] | None = None,
    ) -> tuple[list[Generation], list[RowCache | SlotCache | None]]:
        """Sample one action per prompt from token ids (the engine under ``act``).

        Args:
            prompts: Prompt ids per row.
            sampling: Sampling parameters.
            stops: Stop strings per row (kept in the ids and text).
            caches: Per row, a cache whose ids may prefix the prompt (reused up to the common prefix).
            turns: Per row, the turn index (mixed into the per-row seed).
            owners: Per row, who owns its cache (``id`` of its conversation): a packed cache is
                appended to in place only by its owner; other rows copy it first.

        Returns:
            ``(generations, new_caches)``; the caches are ``None`` unless ``reuse_cache``.
        """
        if not prompts:
            return [], []
        b = len(prompts)
        caches = caches or [None] * b
        reuse = [min(common_prefix(c.ids, p), len(p) - 1) if c is not None else 0 for c, p in zip(caches, prompts)]
        caps = [max(1, min(sampling.max_new_tokens, self.max_len - len(p))) for p in prompts]
        if self.packed is not None:
            return self._generate_packed(prompts, sampling, stops or [[]] * b, caches, reuse, caps,
                                         turns or [0] * b, owners or [0] * b)
        cache, attn, logits = self._prefill(prompts, caches, reuse, max(caps))
        gens, attn = self._decode(prompts, sampling, stops or [[]] * b, turns or [0] * b, caps, cache, attn, logits)
        new: list[RowCache | None] = [None] * b
        if self.reuse_cache:  # the last sampled token was never fed, so it is not in the cache
            new = split(cache, attn, [p + g.action_ids[:-1] for p, g in zip(prompts, gens)], self.epoch)
        return gens, new

    def _prefill(self, prompts, caches, reuse, max_new):
        b = len(prompts)
        cache, cmask = stack(caches, reuse, self.n_layers, max(len(p) - r for p, r in zip(prompts, reuse)) + max_new + 1)
        new = [p[r:] for p, r in zip(prompts, reuse)]
        n = max(len(x) for x in new)
        ids = torch.full((b, n), self.pad_id, dtype=torch.long)
        imask = torch.zeros(b, n, dtype=torch.long)
        pos = torch.zeros(b, n, dtype=torch.long)
        for i, (x, r) in enumerate(zip(new, reuse)):
            ids[i, n - len(x):] = torch.tensor(x)
            imask[i, n - len(x):] = 1
            pos[i, n - len(x):] = torch.arange(r, r + len(x))
        attn = torch.cat([cmask, imask], 1).to(self.device)
        logits = self._forward(ids.to(self.device), attn, pos.to(self.device), cache)
        self.stats["prefill_tokens"] += sum(len(x) for x in new)
        self.stats["reused_tokens"] += sum(reuse)
        return cache, attn, logits

    def _forward(self, ids, attn, pos, cache) -> torch.Tensor:
        kw = {"logits_to_keep": 1} if self._keep_arg else {}
        kw[self._cache_arg] = cache
        out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, **kw)
        return out.logits[:, -1].float()

    def _decode(self, prompts, sampling, stops, turns, caps, cache, attn, logits):
        b = len(prompts)
        gens = [Generation() for _ in range(b)]
        checkers = [StopChecker(self.tokenizer, s) for s in stops]
        seed = sampling.seed if sampling.seed is not None else int(torch.randint(0, 2**62, (1,)).item())
        generators = make_generators(row_seeds(seed, prompts, turns), self.device) if sampling.temperature > 0 else None
        live = [True] * b
        pos = torch.tensor([len(p) for p in prompts], device=self.device)
        for step in range(max(caps)):
            tok, raw, samp = sample_next(logits, sampling.temperature, sampling.top_p, generators)
            for i, (t, lr, ls) in enumerate(zip(tok.tolist(), raw.tolist(), samp.tolist())):
                if live[i]:
                    live[i] = self._push(gens[i], t, lr, ls, checkers[i], caps[i])
            self.stats["decode_steps"] += 1
            if not any(live) or step == max(caps) - 1:
                break
            alive = torch.tensor(live, device=self.device)
            feed = torch.where(alive, tok, torch.full_like(tok, self.pad_id))
            attn = torch.cat([attn, alive.long()[:, None]], 1)
            logits = self._forward(feed[:, None], attn, pos[:, None], cache)
            pos = pos + alive.long()
        self.stats["sampled_tokens"] += sum(len(g.action_ids) for g in gens)
        return gens, attn

    def _generate_packed(self, prompts, sampling, stops, caches, reuse, caps, turns, owners):
        """``generate`` on ``PackedLM``: rows own their caches and only live rows are fed."""
        engine = self.packed
        rows = []
        for p, c, r, cap, owner in zip(prompts, caches, reuse, caps, owners):
            room = len(p) + cap
            if c is None:
                rows.append(engine.new_cache(self.epoch, room, owner))
            elif owner and c.owner == owner:  # this conversation's own buffer: cut back to what is reused
                del c.ids[r:]
                rows.append(c)
            else:  # the shared prefix, or a cache someone else may still extend
                rows.append(engine.fork(c, r, room, owner))
        logits = engine.forward(rows, [p[r:] for p, r in zip(prompts, reuse)])
        self.stats["prefill_tokens"] += sum(len(p) - r for p, r in zip(prompts, reuse))
        self.stats["reused_tokens"] += sum(reuse)
        gens = [Generation() for _ in prompts]
        checkers = [StopChecker(self.tokenizer, s) for s in stops]
        if sampling.temperature == 0 and self.draft_tokens > 0:
            greedy_with_drafts(engine, rows, logits, lambda i, t, lp: self._push(gens[i], t, lp, 0.0, checkers[i], caps[i]),
                               lambda i: caps[i] - len(gens[i].action_ids), self.draft_tokens, self.stats, self.end_ids)
            self.stats["sampled_tokens"] += sum(len(g.action_ids) for g in gens)
            return gens, rows if self.reuse_cache else [None] * len(prompts)
        seed = sampling.seed if sampling.seed is not None else int(torch.randint(0, 2**62, (1,)).item())
        generators = make_generators(row_seeds(seed, prompts, turns), self.device) if sampling.temperature > 0 else None
        live = list(range(len(prompts)))
        for _ in range(max(caps)):
            gen = [generators[i] for i in live] if generators is not None else None
            tok, raw, samp = sample_next(logits, sampling.temperature, sampling.top_p, gen)
            fed = []
            for i, t, lr, ls in zip(live, tok.tolist(), raw.tolist(), samp.tolist()):
                if self._push(gens[i], t, lr, ls, checkers[i], caps[i]):
                    fed.append((i, t))
            self.stats["decode_steps"] += 1
            if not fed:
                break
            live = [i for i, _ in fed]
            logits = engine.forward([rows[i] for i in live], [[t] for _, t in fed])
        self.stats["sampled_tokens"] += sum(len(g.action_ids) for g in gens)
        return gens, rows if self.reuse_cache else [None] * len(prompts)

    def _push(self, g: Generation, tok: int, raw: float, samp: float, stop: StopChecker, cap: int) -> bool:
        """Record one sampled token; False when the row is done."""
        g.action_ids.append(tok)
        g.logprobs.append(raw)
        g.sampling_logprobs.append(samp)
        if tok in self.end_ids:
            g.finish_reason, g.ended_by_token = "stop", True
            return False
        if stop.hit(g.action_ids):
            g.finish_reason = "stop"
            return False
        if len(g.action_ids) >= cap:
            g.finish_reason = "length"
            return False
        return True

    # ----- scoring -----------------------------------------------------------------------
    @torch.no_grad()
    def score_batch(self, prompts: Sequence[Sequence[int]], actions: Sequence[Sequence[int]]) -> list[list[float]]:
        """Raw (temperature-1) log-probs of each action's tokens given its prompt, by one full forward.

        Args:
            prompts: Prompt ids per row (non-empty).
            actions: Action ids per row.

        Returns:
            Per row, one log-prob per action token (same definition as ``Utterance.logprobs``).
        """
        seqs = [list(p) + list(a) for p, a in zip(prompts, actions)]
        t = max(len(s) for s in seqs)
        keep = max(len(a) for a in actions) + 1
        ids = torch.full((len(seqs), t), self.pad_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        pos = torch.zeros_like(ids)
        for i, s in enumerate(seqs):  # left padding: every action ends at the right edge
            ids[i, t - len(s):] = torch.tensor(s)
            attn[i, t - len(s):] = 1
            pos[i, t - len(s):] = torch.arange(len(s))
        kw = {"logits_to_keep": keep} if self._keep_arg else {}
        out = self.model(input_ids=ids.to(self.device), attention_mask=attn.to(self.device), position_ids=pos.to(self.device), **kw)
        logp = out.logits[:, -keep:].float().log_softmax(-1)
        result = []
        for i, a in enumerate(actions):
            if not a:
                result.append([])
                continue
            rows = logp[i, keep - 1 - len(a) : keep - 1]
            result.append(rows.gather(-1, torch.tensor(list(a), device=rows.device)[:, None])[:, 0].tolist())
        return result

    @torch.no_grad()
    def alternatives(self, prompts: Sequence[Sequence[int]], actions: Sequence[Sequence[int]], k: int,
                     stops: Sequence[str] = (), max_new_tokens: int = 64,
                     episode_caches: Sequence[Any] | None = None) -> list[list[Utterance]]:
        """Per recorded reply, up to ``k`` other replies the model itself ranks next.

        At the recorded action's least certain token (the lowest top-1 probability, e.g. the
        direction in ``<act>go north</act>``) each of the ``k`` most likely other tokens is forced,
        and the reply is finished greedily. These are the model's runners-up at its one real
        decision: after SFT on a few demonstrations the top choice there often has probability above
        0.99, so temperature sampling almost never tries them, and hotter sampling breaks the syntax.
        A token that differs from the recorded one (or from an earlier runner-up) only in case or
        surrounding space is skipped: it would make the same reply.

        Args:
            prompts: Per row, the prompt the action was sampled from.
            actions: Per row, the recorded action ids.
            k: Alternatives per row.
            stops: Stop strings (the env's tool format), as when sampling.
            max_new_tokens: Length cap of a whole reply.
            episode_caches: Per row, a KV cache of the episode the reply was recorded in (its
                ``Trajectory.cache``, or None): the reply is scored from the tokens it holds,
                and only the rest is prefilled.

        Returns:
            Per row, utterances with exact ids and raw log-probs (the forced token's included), most likely
            first; on the packed engine each carries the KV cache of its prompt (``cache``, see ``resume``)
            while ``carried_cache_mb`` allows.
        """
        prompts, actions = [list(p) for p in prompts], [list(a) for a in actions]
        bodies = [(a[:-1] if a and a[-1] in self.end_ids else a) or a for a in actions]  # the closing decides nothing
        logps, caches = self._decision_logprobs(prompts, bodies, max_new_tokens, episode_caches)
        heads, lps, owner = [], [], []
        for i, (a, logp) in enumerate(zip(actions, logps)):
            if not a or k < 1:
                continue
            pos = decision_position(logp.max(-1).values.tolist())
            top = logp[pos].topk(min(k + 8, logp.shape[-1]))
            prefix = [float(logp[j, x]) for j, x in enumerate(a[:pos])]
            for head, lp in runner_up_heads(a, pos, list(zip(top.indices.tolist(), top.values.tolist())), prefix, k,
                                            functools.partial(token_surface, self.tokenizer)):
                heads.append(head)
                lps.append(lp)
                owner.append(i)
        greedy = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
        rows = [prompts[i] + h for i, h in zip(owner, heads)]
        done = [h[-1] in self.end_ids or max_new_tokens - len(h) < 1 for h in heads]
        todo = [j for j, d in enumerate(done) if not d]
        gens: dict[int, Generation] = {}
        for cap in sorted({max_new_tokens - len(heads[j]) for j in todo}):  # one call per remaining length cap
            part = [j for j in todo if max_new_tokens - len(heads[j]) == cap]
            got, _ = self.generate([rows[j] for j in part], dataclasses.replace(greedy, max_new_tokens=cap),
                                   [list(stops)] * len(part), [caches[owner[j]] for j in part])
            gens.update(zip(part, got))
        out: list[list[Utterance]] = [[] for _ in prompts]
        for j, (h, lp) in enumerate(zip(heads, lps)):
            g = gens.get(j)
            ids = h + (g.action_ids if g else [])
            text_ids = ids[:-1] if ids[-1] in self.end_ids else ids
            out[owner[j]].append(Utterance(self.tokenizer.decode(text_ids, skip_special_tokens=False), ids,
                                           lp + (list(g.logprobs) if g else []), cache=self._carry(caches[owner[j]])))
        return out

    def _decision_logprobs(self, prompts: list[list[int]], actions: list[list[int]], room: int,
                           episode_caches: Sequence[Any] | None = None) -> tuple[list[torch.Tensor], list[Any]]:
        """Per row, ``(len(action), V)`` raw log-probs of the next token at each action position, and
        a cache holding the prompt and action (the packed engine's, for the runner-ups to fork; else ``None``).
        Each row starts from whichever covers more of its prompt: the shared prefix or its episode's cache."""
        packed = self.packed
        if packed is None:  # one full forward per row, on the model itself
            out = []
            for p, a in zip(prompts, actions):
                kw = {"logits_to_keep": len(a) + 1} if self._keep_arg else {}
                logits = self.model(input_ids=torch.tensor([p + a], device=self.device), **kw).logits[0, -len(a) - 1 : -1]
                out.append(logits.float().log_softmax(-1))
            return out, [None] * len(prompts)
        caches, new = [], []
        for i, (p, a) in enumerate(zip(prompts, actions)):
            seq, held = p + a, self._prefix_for(p) if self.share_prefix else None
            own = episode_caches[i] if episode_caches else None
            if own is not None and self._usable(own):
                held = max((c for c in (held, own) if c is not None), key=lambda c: common_prefix(c.ids, p))
            keep = min(common_prefix(held.ids, p), len(p) - 1) if held is not None else 0
            caches.append(packed.fork(held, keep, len(seq) + room, 0) if held is not None
                          else packed.new_cache(self.epoch, len(seq) + room, 0))
            new.append(seq[keep:])
        logits = packed.forward(caches, new, tail=[len(a) + 1 for a in actions]).log_softmax(-1)
        out, at = [], 0
        for a in actions:
            out.append(logits[at : at + len(a)])  # the last row of each block predicts past the action
            at += len(a) + 1
        self.stats["prefill_tokens"] += sum(len(x) for x in new)
        return out, caches

    def score(self, prompt_ids: Sequence[int], action_ids: Sequence[int]) -> list[float]:
        """Raw log-probs of ``action_ids`` after ``prompt_ids`` (see ``score_batch``)."""
        return self.score_batch([prompt_ids], [action_ids])[0]


def _is_fsdp(model: Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _eos_ids(model) -> set[int]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}
