"""ArCHer's critic encoders other than the frozen reference's final hidden states (``critic_encoder``).

``TrunkTopEncoder`` (``top:K``) is cached frozen lower layers plus the critic's own trainable copy
of the top K transformer blocks. The frozen reference already runs once per collected batch (the
KL anchor's forward); it also keeps the hidden states at the input of block N-K, the "trunk". The
critic owns a trainable copy of blocks N-K .. N-1, the final norm and the rotary embedding, and
re-runs only those over a short window of trunk states ending at the token it reads (the last
prompt token for phi(s), the last action token for phi(s, a)). The lower layers have already mixed
the whole context into every trunk state, so a local causal window is enough for the top blocks:
a TD update costs K blocks over W tokens per feature instead of a forward over the episode, and
the windows sit in the replay buffer as the frozen features do.

At initialisation the copy equals the reference's blocks: over a window that covers the whole
prefix it reproduces the reference's own final hidden state, the ``reference`` encoder's feature.

``TextFeatureEncoder`` (a path) reads the conversation's text with another frozen LM.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Any

import torch
from torch import nn
from transformers.cache_utils import DynamicCache

from turngym.agents.kvcache import cache_arg, returned_cache
from turngym.trainers import functional as Fn
from turngym.trainers.sequences import backbone_and_head
from turngym.types import Trajectory

Window = tuple[torch.Tensor, torch.Tensor]
"""A batch of windows: trunk states ``(N, W, H)`` and their positions ``(N, W)`` (long, -1 = padding)."""


class TrunkTopEncoder(nn.Module):
    """phi = final_norm(top K blocks(window of trunk states)) at the window's last token.

    Args:
        model: The reference LM (an HF decoder: ``layers``, ``norm``, ``rotary_emb``) whose last
            ``k`` blocks, final norm and rotary embedding are copied; ``model`` itself is untouched.
        k: Blocks to copy.

    Attributes:
        trunk_layer: ``N - k``, the block whose input the windows hold (``sequences.score``'s ``hidden_layer``).

    Raises:
        ValueError: ``k`` is not in ``[1, N]``.
    """

    def __init__(self, model: nn.Module, k: int) -> None:
        super().__init__()
        backbone, _ = backbone_and_head(model)
        n = len(backbone.layers)
        if not 1 <= k <= n:
            raise ValueError(f"critic_encoder=top:{k} needs 1 <= K <= {n}, the model's number of blocks")
        self.trunk_layer = n - k
        self.blocks = copy.deepcopy(backbone.layers[n - k :])
        self.norm = copy.deepcopy(backbone.norm)
        self.rotary = copy.deepcopy(backbone.rotary_emb)
        for p in self.parameters():  # the reference's copies arrive frozen
            p.requires_grad_(True)

    def forward(self, states: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Encode windows (``Fn.gather_windows``).

        Args:
            states: ``(N, W, H)`` trunk states.
            pos: ``(N, W)`` long, their positions in the conversation (RoPE), -1 = padding.

        Returns:
            ``(N, H)`` the final norm's output at each window's last token.
        """
        allowed = Fn.window_attention_mask(pos)  # (N, 1, W, W)
        # an additive mask, which eager and SDPA attention both take (a bool one only SDPA)
        bias = torch.zeros(allowed.shape, dtype=states.dtype, device=states.device)
        bias = bias.masked_fill(~allowed, torch.finfo(states.dtype).min)
        position_ids = pos.clamp_min(0)  # padding slots are masked out; any position will do
        rope = self.rotary(states, position_ids)  # (cos, sin), as the HF backbone computes them
        h = states
        for block in self.blocks:
            out = block(h, attention_mask=bias, position_ids=position_ids, position_embeddings=rope)
            h = out[0] if isinstance(out, tuple) else out  # transformers < 5 returns a tuple
        return self.norm(h[:, -1])


class TextFeatureEncoder:
    """Critic features from another (small, frozen) LM over the conversation text.

    The state text is the rendered conversation up to the turn; the state-action text adds the
    utterance. Features are the mean of the encoder's last hidden states (left-truncated to
    ``max_length`` tokens, so the recent turns are kept).
    """

    def __init__(self, path: str, max_length: int = 512) -> None:
        from transformers import AutoModel, AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(path)
        self.tok.truncation_side = "left"
        self.model = AutoModel.from_pretrained(path).eval()
        self.dim = self.model.config.hidden_size
        self.max_length = max_length

    @torch.no_grad()
    def _embed(self, texts: list[str]) -> torch.Tensor:
        enc = self.tok(texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
        h = self.model(**enc).last_hidden_state
        m = enc["attention_mask"][..., None].float()
        return (h * m).sum(1) / m.sum(1).clamp_min(1)

    def turn_features(self, trajs: list[Trajectory], refs: list[tuple[int, int]]):
        states, actions = [], []
        for ti, k in refs:
            t = trajs[ti]
            lines = [f"{m.role}: {m.content}" for m in t.initial_observation]
            for turn in t.turns[:k]:
                lines += [f"assistant: {turn.action_text}"] + [f"{m.role}: {m.content}" for m in turn.observation]
            states.append("\n".join(lines))
            actions.append(states[-1] + f"\nassistant: {t.turns[k].action_text}")
        return self._embed(states), self._embed(actions)


class PromptFeatures:
    """The reference encoder's phi(s) ``(H,)`` and phi(s, a) ``(n, H)`` of several replies to one prompt
    (the final normed hidden states at the prompt's last token and at each reply's last token, as
    ``sequences.score`` gives them), for prompts that grow turn by turn, as when the critic acts. The
    prompt's forward runs once for all its replies, on the keys and values of the longest prompt seen
    before that it extends: a turn costs its new tokens, not the episode's whole history again.

    Why: acting with the critic scores every held-out turn's candidates, and a late TextWorld
    turn's prompt is thousands of tokens; re-running it per turn made the critic's forwards most of
    an evaluation's time. The reference encoder is frozen, so a prompt's keys and values stay valid.

    Args:
        ref: The frozen reference model whose final hidden states are the features.
        budget_mb: Keys and values kept across calls, least recently used dropped first (0: none).
    """

    def __init__(self, ref: nn.Module, budget_mb: int = 2048) -> None:
        self.ref, self.budget = ref, budget_mb * 2**20
        self.held: OrderedDict[tuple[int, ...], tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor, int]] = OrderedDict()
        self.held_bytes = 0
        self.stats = {"prompt_tokens": 0, "prefilled_tokens": 0}

    @torch.no_grad()
    def __call__(self, prompt: list[int], replies: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        backbone, _ = backbone_and_head(self.ref)
        kv = cache_arg(backbone)
        device = next(self.ref.parameters()).device
        key, base = tuple(prompt), self._longest_prefix(prompt)
        self.stats["prompt_tokens"] += len(prompt)
        if base is not None and len(base) == len(key):
            layers, phi_s, _ = self.held[base]
            self.held.move_to_end(base)
        else:
            at = len(base) if base is not None else 0
            cache = _as_cache(self.held[base][0], 1) if base is not None else None
            new = torch.tensor([prompt[at:]], device=device)
            pos = torch.arange(at, len(prompt), device=device)[None]
            out = backbone(input_ids=new, position_ids=pos, use_cache=True, **({kv: cache} if cache is not None else {}))
            layers, phi_s = _layers_of(returned_cache(out)), out.last_hidden_state[0, -1].float()
            self.stats["prefilled_tokens"] += len(prompt) - at
            self._keep(key, layers, phi_s)
        lens = torch.tensor([len(r) for r in replies])
        # right-padded with each reply's own first token: under causal attention no real token reads it
        ids = torch.tensor([r + [r[0]] * (int(lens.max()) - len(r)) for r in replies], device=device)
        pos = torch.arange(len(prompt), len(prompt) + ids.shape[1], device=device).expand_as(ids)
        h = backbone(input_ids=ids, position_ids=pos, use_cache=True, **{kv: _as_cache(layers, len(replies))}).last_hidden_state
        return phi_s, h[torch.arange(len(replies)), lens - 1].float()

    def _longest_prefix(self, prompt: list[int]) -> tuple[int, ...] | None:
        key = tuple(prompt)
        fits = [k for k in self.held if len(k) <= len(key) and k == key[: len(k)]]
        return max(fits, key=len, default=None)

    def _keep(self, key: tuple[int, ...], layers: list[tuple[torch.Tensor, torch.Tensor]], phi_s: torch.Tensor) -> None:
        size = sum(t.numel() * t.element_size() for pair in layers for t in pair)
        if size > self.budget:
            return
        self.held[key] = (layers, phi_s, size)
        self.held_bytes += size
        while self.held_bytes > self.budget:
            self.held_bytes -= self.held.popitem(last=False)[1][2]


def _layers_of(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (keys, values) ``(1, H, T, D)`` of a one-row cache (transformers 5's layers or 4's lists)."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


def _as_cache(layers: list[tuple[torch.Tensor, torch.Tensor]], rows: int) -> DynamicCache:
    """A fresh cache holding ``layers`` repeated ``rows`` times; the forward that extends it builds
    new tensors, so the held ones are never written."""
    cache = DynamicCache()
    for i, (k, v) in enumerate(layers):
        cache.update(k.expand(rows, *k.shape[1:]).contiguous() if rows > 1 else k,
                     v.expand(rows, *v.shape[1:]).contiguous() if rows > 1 else v, i)
    return cache


@torch.no_grad()
def tree_features(ref: nn.Module, episodes: list[Trajectory], parent: list[int],
                  branch_turn: list[int]) -> dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]]:
    """The reference encoder's phi(s), phi(s, a) ``(H,)`` of every turn of a tree's roots and of the
    branches that leave a root, keyed ``(episode, turn)``: each root's tokens run once, and a branch
    runs only its own tokens, on the root's keys and values up to where it left it.

    Why: a branch replays its root's turns token for token before its own (``rollout.branching``),
    so encoding every branch from its first token repeats the root's prompt, often most of the
    branch's tokens, once per branch. Turns before a branch's own are its root's features. Roots and
    branches whose records are not one segment, or do not share the root's tokens, and deeper
    branches, are left out: the caller encodes those whole (``sequences.pack_batch``).
    """
    backbone, _ = backbone_and_head(ref)
    device = next(ref.parameters()).device
    kv = cache_arg(backbone)  # read once: the signature does not change between the pieces below
    children: dict[int, dict[int, list[int]]] = {}  # root -> where a branch leaves it -> the branches
    for i, (p, j) in enumerate(zip(parent, branch_turn)):
        if p >= 0 and parent[p] < 0 and _one_segment(episodes[i]) and _one_segment(episodes[p]):
            at = episodes[i].turns[j].span[0]
            if episodes[i].record.ids[:at] == episodes[p].record.ids[:at]:
                children.setdefault(p, {}).setdefault(at, []).append(i)
    out: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
    for r, root in enumerate(episodes):
        if parent[r] >= 0 or not _one_segment(root):
            continue
        ids, points = root.record.ids, children.get(r, {})
        # the root's tokens in pieces that end where branches leave it: the cache at each such point
        # serves its branches, then grows on with the root's next piece (no token runs twice)
        pieces, tails, cache, start = [], {}, None, 0
        for at in [*sorted(points), len(ids)]:
            if at > start:
                run = backbone(input_ids=torch.tensor([ids[start:at]], device=device), use_cache=True,
                               position_ids=torch.arange(start, at, device=device)[None], **{kv: cache})
                cache, start = returned_cache(run), at
                pieces.append(run.last_hidden_state[0].float())
            if at in points:
                tails[at] = _branch_tails(backbone, copy.deepcopy(cache), at, [episodes[b].record.ids for b in points[at]])
        h = torch.cat(pieces)
        for k, turn in enumerate(root.turns):
            out[(r, k)] = (h[turn.span[0] - 1], h[turn.span[1] - 1])
        for at, group in points.items():
            for row, b in enumerate(group):
                read = lambda p, row=row, at=at: h[p] if p < at else tails[at][row, p - at]  # noqa: E731
                for k, turn in enumerate(episodes[b].turns):
                    out[(b, k)] = out[(r, k)] if k < branch_turn[b] else (read(turn.span[0] - 1), read(turn.span[1] - 1))
    return out


def _branch_tails(backbone: nn.Module, cache: Any, at: int, records: list[list[int]]) -> torch.Tensor:
    """Final hidden states ``(n, T, H)`` of each record's tokens from position ``at`` on, given the
    keys and values of the tokens before it (``cache``, for one sequence: repeated here, in place).
    The rows are right-padded with their own first token: under causal attention no real token reads it."""
    device = next(backbone.parameters()).device
    tails = [ids[at:] for ids in records]
    width = max(len(t) for t in tails)
    cache.batch_repeat_interleave(len(tails))
    ids = torch.tensor([t + [t[0]] * (width - len(t)) for t in tails], device=device)
    pos = torch.arange(at, at + width, device=device).expand_as(ids)
    return backbone(input_ids=ids, position_ids=pos, use_cache=True, **{cache_arg(backbone): cache}).last_hidden_state.float()


def _one_segment(traj: Trajectory) -> bool:
    """Whether the episode's record is one training sequence, with a span for every turn."""
    rec = traj.record
    return rec is not None and rec.starts == [0] and bool(traj.turns) and all(t.span is not None for t in traj.turns)
