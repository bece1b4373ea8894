"""ArCHer's critic encoders (``critic_encoder``): what the critic reads of a conversation.

- ``top:K`` (the default): the critic's own trainable copy of the SFT'd model's top K blocks, over
  frozen lower layers (``TrunkTopEncoder``, below).
- ``reference``: the final hidden states of the frozen SFT'd model, read by the heads alone (cheap;
  not the paper's, whose encoder trains).

``TurnEncoder`` turns recorded turns and fresh replies into either kind of input, from the token ids
the policy sampled (nothing is re-tokenized).

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

"""

from __future__ import annotations

import contextlib
import copy
from collections import OrderedDict
from typing import Any

import torch
from torch import nn
from transformers.cache_utils import DynamicCache

from turngym.agents.kvcache import cache_arg, returned_cache
from turngym.trainers.actor import autocast
from turngym.trainers.sequences import (PackedBatch, _only_blocks, backbone_and_head, causal_kernel_mask, pack_batch,
                                        pack_records, score)
from turngym.types import TokenRecord, Trajectory

Window = tuple[torch.Tensor, torch.Tensor]
"""A batch of windows: trunk states ``(N, W, H)`` and their positions ``(N, W)`` (long, -1 = padding)."""


# ----- windows (pure) ------------------------------------------------------------------------------
def window_positions(end: torch.Tensor, width: int) -> torch.Tensor:
    """Positions of the ``width`` tokens that end at each ``end``: ``end - width + 1, ..., end``, with
    -1 for the slots before the sequence's start (padding, always on the left).

    Args:
        end: ``(N,)`` long, the position each window ends at (its last token).

    Returns:
        ``(N, W)`` long.
    """
    pos = end[:, None] - (width - 1) + torch.arange(width, device=end.device)
    return torch.where(pos >= 0, pos, -1)


def gather_windows(hidden: torch.Tensor, at: torch.Tensor, width: int) -> Window:
    """Windows of hidden states ending at ``at``: the ``top:K`` encoder's input.

    Args:
        hidden: ``(B, T, H)`` one sequence per row, position = column (right padding only).
        at: ``(N, 2)`` long ``(row, position)`` of each window's last token.

    Returns:
        ``(N, W, H)`` states (zeros in padding slots) and their ``(N, W)`` positions (``window_positions``).
    """
    pos = window_positions(at[:, 1], width)
    states = hidden[at[:, :1], pos.clamp_min(0)]
    return torch.where((pos >= 0)[..., None], states, 0.0), pos


def window_attention_mask(pos: torch.Tensor) -> torch.Tensor:
    """Causal attention inside each window over its real tokens: query ``i`` sees key ``j`` when
    ``j <= i`` and ``j`` is real (``pos >= 0``). A padding query sees itself only, so that no softmax
    row is empty (its output is never read).

    Args:
        pos: ``(N, W)`` window positions, -1 = padding.

    Returns:
        ``(N, 1, W, W)`` bool, True = attend (one mask for every head).
    """
    w = pos.shape[1]
    causal = torch.ones(w, w, dtype=torch.bool, device=pos.device).tril()
    real_key = (pos >= 0)[:, None, :]  # (N, 1, W)
    return (causal & (real_key | torch.eye(w, dtype=torch.bool, device=pos.device)))[:, None]


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
        """Encode windows (``gather_windows``).

        Args:
            states: ``(N, W, H)`` trunk states.
            pos: ``(N, W)`` long, their positions in the conversation (RoPE), -1 = padding.

        Returns:
            ``(N, H)`` the final norm's output at each window's last token.
        """
        allowed = window_attention_mask(pos)  # (N, 1, W, W)
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


@torch.no_grad()
def trunk_states(model: nn.Module, batch: PackedBatch, layer: int) -> torch.Tensor:
    """``(B, T, H)`` the input of block ``layer`` at every position (the blocks above it do not run)."""
    backbone, _ = backbone_and_head(model)
    device = next(model.parameters()).device
    with _only_blocks(backbone, 0, layer):
        out = backbone(input_ids=batch.input_ids.to(device), attention_mask=causal_kernel_mask(batch.attention_mask.to(device)),
                       use_cache=False)
    return out.last_hidden_state


class TurnEncoder:
    """The critic's inputs for recorded turns and for fresh replies, from the frozen SFT'd model.

    ``mode`` is ``critic_encoder``: ``reference`` gives ``(N, H)`` final hidden states at the
    state's last prompt token (phi(s)) and the reply's last token (phi(s, a)); ``top:K`` gives the
    windows of ``window`` trunk states (the input of block N - K) ending there, which the critic's
    own ``TrunkTopEncoder`` (``critic_module``) encodes.

    Args:
        ref: The frozen SFT'd model.
        mode: ``reference`` or ``top:K``.
        window: ``top:K``'s window length.
        autocast_mode: Mixed precision of the forwards (``actor.autocast``).
        pad_id: Padding token.
        chunk: Sequences per forward.
    """

    def __init__(self, ref: nn.Module, mode: str, window: int, autocast_mode: str, pad_id: int, chunk: int = 16) -> None:
        self.ref, self.window, self.autocast_mode, self.pad_id, self.chunk = ref, window, autocast_mode, pad_id, chunk
        self.top_k = int(mode[4:]) if mode.startswith("top:") else 0
        if mode != "reference" and not (self.top_k and mode[4:].isdigit()):
            raise ValueError(f"critic_encoder must be reference or top:K, got {mode!r}")
        self.layer = len(backbone_and_head(ref)[0].layers) - self.top_k if self.top_k else None
        self.dim = ref.config.get_text_config().hidden_size
        self._prompts = PromptFeatures(ref) if self.layer is None else None  # held keys/values of growing prompts

    def critic_module(self) -> nn.Module | None:
        """The critic's own trainable encoder (``top:K``), or None (the heads read features)."""
        return TrunkTopEncoder(self.ref, self.top_k) if self.top_k else None

    def _hidden(self, batch: PackedBatch) -> torch.Tensor:
        with autocast(self.ref, self.autocast_mode):
            h = score(self.ref, batch, hidden=True).hidden if self.layer is None else trunk_states(self.ref, batch, self.layer)
        return h.float()

    def _features(self, batch: PackedBatch, hidden: torch.Tensor):
        if self.layer is not None:
            return gather_windows(hidden, batch.state_pos, self.window), gather_windows(hidden, batch.action_pos, self.window)
        return (hidden[batch.state_pos[:, 0], batch.state_pos[:, 1]], hidden[batch.action_pos[:, 0], batch.action_pos[:, 1]])

    @torch.no_grad()
    def episodes(self, trajs: list[Trajectory], parent: list[int] | None = None,
                 branch_turn: list[int] | None = None) -> tuple[list[tuple[int, int]], Any, Any]:
        """phi(s), phi(s, a) of every turn with tokens: ``(refs, s, sa)``, ``refs[i] = (episode, turn)``
        sorted. One forward per episode, in chunks of episodes of similar length (little padding);
        with a tree's ``parent`` and ``branch_turn`` and the reference encoder, a branch that leaves a
        root runs only its own tokens, on the root's keys and values (``tree_features``)."""
        parts: dict[tuple[int, int], tuple] = {}
        if parent is not None and self.layer is None:
            with autocast(self.ref, self.autocast_mode):
                parts = tree_features(self.ref, trajs, parent, branch_turn)
        covered = {i for i, _ in parts}
        rest = [i for i in range(len(trajs)) if i not in covered and any(t.span for t in trajs[i].turns)]
        rest.sort(key=lambda i: len(trajs[i].record.ids))
        for c in range(0, len(rest), self.chunk):
            idx = rest[c : c + self.chunk]
            batch = pack_batch([trajs[i] for i in idx], self.pad_id)
            s, sa = self._features(batch, self._hidden(batch))
            for j, (ti, k) in enumerate(batch.turn_refs):
                parts[(idx[ti], k)] = (_row(s, j), _row(sa, j))
        refs = sorted(parts)
        return refs, stack_rows([parts[r][0] for r in refs]), stack_rows([parts[r][1] for r in refs])

    @torch.no_grad()
    def replies(self, prompts: list[list[int]], replies: list[list[int]],
                groups: list[list[int]] | None = None) -> tuple[Any, Any]:
        """phi(s), phi(s, a) of each reply's ids after its prompt's ids. ``groups``: row indices whose
        prompts extend one another in that order (one episode's states): the frozen model then runs
        each group's prompt tokens once, on its keys and values, and each reply on the cache of its
        prompt (``_group_features``); the rows outside every group are one record each."""
        if groups:
            return self._grouped(prompts, replies, groups)
        out_s, out_sa = [], []
        for c in range(0, len(prompts), self.chunk):
            items = []
            for prompt, reply in zip(prompts[c : c + self.chunk], replies[c : c + self.chunk]):
                rec = TokenRecord()
                rec.add_prompt(list(prompt))
                span = rec.add_action(list(reply) or [self.pad_id])
                items.append((rec, [(0, span)]))
            batch = pack_records(items, self.pad_id)
            s, sa = self._features(batch, self._hidden(batch))
            out_s.append(s)
            out_sa.append(sa)
        return cat_rows(out_s), cat_rows(out_sa)


    @torch.no_grad()
    def one_prompt(self, prompt: list[int], replies: list[list[int]]) -> tuple[Any, Any]:
        """phi(s), phi(s, a) of several replies to one prompt. The reference encoder runs the prompt's
        forward once for all of them, on the keys and values of the longest prompt seen before that it
        extends (``PromptFeatures``): a critic that acts scores every turn's candidates this way."""
        if self._prompts is None:
            return self.replies([list(prompt)] * len(replies), [list(r) for r in replies])
        with autocast(self.ref, self.autocast_mode):
            s, sa = self._prompts(list(prompt), [list(r) for r in replies])
        return s.expand_as(sa), sa


    def _grouped(self, prompts: list[list[int]], replies: list[list[int]], groups: list[list[int]]):
        rows: dict[int, tuple] = {}
        with autocast(self.ref, self.autocast_mode):
            for g in groups:
                rows.update(self._group_features(g, [prompts[i] for i in g], [replies[i] for i in g]))
        order = sorted(rows)
        if order != list(range(len(prompts))):
            raise ValueError("groups must cover every row once")
        return stack_rows([rows[i][0] for i in order]), stack_rows([rows[i][1] for i in order])

    def _group_features(self, rows: list[int], prompts: list[list[int]], replies: list[list[int]]) -> dict:
        """``row -> (phi(s), phi(s, a))`` of one group, its prompts run once on a growing cache (a prompt
        that does not extend the one before starts a new cache)."""
        backbone, _ = backbone_and_head(self.ref)
        device = next(self.ref.parameters()).device
        kv = cache_arg(backbone)
        blocks = _only_blocks(backbone, 0, self.layer) if self.layer is not None else contextlib.nullcontext()
        out, ids, states, cache = {}, [], [], None
        with blocks:
            for row, prompt, reply in zip(rows, prompts, replies):
                if prompt[: len(ids)] != ids:  # not this cache's continuation
                    ids, states, cache = [], [], None
                new = prompt[len(ids):]
                if new:
                    run = backbone(input_ids=torch.tensor([new], device=device), use_cache=True,
                                   position_ids=torch.arange(len(ids), len(prompt), device=device)[None], **{kv: cache})
                    cache, ids = returned_cache(run), list(prompt)
                    states.append(run.last_hidden_state[0].float())
                reply = list(reply) or [self.pad_id]
                run = backbone(input_ids=torch.tensor([reply], device=device), use_cache=True, **{kv: copy.deepcopy(cache)},
                               position_ids=torch.arange(len(prompt), len(prompt) + len(reply), device=device)[None])
                h = torch.cat([*states, run.last_hidden_state[0].float()])  # (len(prompt) + len(reply), H)
                out[row] = self._at(h, len(prompt) - 1), self._at(h, len(h) - 1)
        return out

    def _at(self, h: torch.Tensor, end: int):
        """The feature at position ``end`` of one sequence's states ``h`` (a window of them for top:K)."""
        if self.layer is None:
            return h[end]
        states, pos = gather_windows(h[None], torch.tensor([[0, end]]), self.window)
        return states[0], pos[0]


def _row(x: Any, i: int):
    return x[i] if isinstance(x, torch.Tensor) else (x[0][i], x[1][i])


def stack_rows(rows: list) -> Any:
    """Single rows (a feature, or a window's pair) into one batch."""
    if isinstance(rows[0], tuple):
        return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])
    return torch.stack(rows)


def cat_rows(blocks: list) -> Any:
    """Batches of rows into one."""
    if isinstance(blocks[0], tuple):
        return torch.cat([b[0] for b in blocks]), torch.cat([b[1] for b in blocks])
    return torch.cat(blocks)


def select_rows(x: Any, index: torch.Tensor) -> Any:
    return x[index] if isinstance(x, torch.Tensor) else (x[0][index], x[1][index])


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
