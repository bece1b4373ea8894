"""Step encoders for learned reward models: (task, history, action) -> a feature vector.

An encoder is anything with ``dim`` and ``encode(items) -> Tensor (N, dim)`` (``Encoder``). Two
ship here:

- ``HashedNgramEncoder``: hashed bag of word n-grams, one namespace per field. No model, no
  download, microseconds per step: the CPU default.
- ``LMEncoder``: mean-pooled last hidden states of a frozen (small) language model over the
  rendered step. Features are computed once per step (the caller keeps them).
- ``PolicyEncoder``: the policy's own view: a frozen copy of the (SFT'd) policy run over the
  episode's recorded token ids (nothing re-tokenized), its final hidden states at each turn's last
  prompt token and last action token. A trainer binds it (``bind_policy``) to its reference model.

``make_encoder("hash" | "lm:PATH" | "default", ...)`` builds one from a config string.
"""

from __future__ import annotations

import re
import zlib
from typing import Any, NamedTuple, Protocol, Sequence

import torch

from turngym.types import Message, Trajectory

_WORD = re.compile(r"\w+|[^\w\s]")


class StepInput(NamedTuple):
    """What a progress estimator sees about one step."""

    task: str
    history: str
    action: str

    def render(self) -> str:
        return f"Task: {self.task}\nHistory: {self.history}\nAction: {self.action}"


def _text(messages: Sequence[Message]) -> str:
    return "\n".join(m.content for m in messages)


def step_inputs(traj: Trajectory, history_turns: int = 2) -> list[StepInput]:
    """One ``StepInput`` per turn of ``traj``.

    Args:
        traj: A recorded trajectory.
        history_turns: How many preceding (action, observation) pairs form the history; the
            opening user message stands in for the observation before the first turn.

    Returns:
        ``task`` = the opening user messages, ``history`` = the last ``history_turns`` actions
        and observations before the turn, ``action`` = the turn's utterance.
    """
    task = _text([m for m in traj.initial_observation if m.role == "user"]) or _text(traj.initial_observation)
    out = []
    for k, turn in enumerate(traj.turns):
        lo = max(0, k - history_turns)
        parts = [] if lo > 0 else [f"observation: {task}"]
        for prev in traj.turns[lo:k]:
            parts += [f"action: {prev.action_text}", f"observation: {_text(prev.observation)}"]
        out.append(StepInput(task, "\n".join(parts), turn.action_text))
    return out


class Encoder(Protocol):
    """``encode(items) -> (N, dim)`` float features."""

    dim: int

    def encode(self, items: Sequence[StepInput]) -> torch.Tensor: ...


class HashedNgramEncoder:
    """Signed feature hashing of word 1..``ngram``-grams, separately for task, history and action.

    Each field's vector is L2-normalised, so a long task text does not drown the action.
    Hashing uses CRC-32 (stable across processes, unlike Python's salted ``hash``).

    Args:
        dim: Feature size.
        ngram: Longest n-gram.
    """

    def __init__(self, dim: int = 2048, ngram: int = 2) -> None:
        if dim < 8 or ngram < 1:
            raise ValueError("dim must be >= 8 and ngram >= 1")
        self.dim, self.ngram = dim, ngram

    def _field(self, vec: torch.Tensor, name: str, text: str) -> None:
        words = _WORD.findall(text.lower())
        idx, sign = [], []
        for n in range(1, self.ngram + 1):
            for i in range(len(words) - n + 1):
                h = zlib.crc32(f"{name}|{' '.join(words[i:i + n])}".encode())
                idx.append(h % self.dim)
                sign.append(1.0 if (h >> 31) & 1 else -1.0)
        if not idx:
            return
        part = torch.zeros(self.dim).index_add_(0, torch.tensor(idx), torch.tensor(sign))
        vec += part / part.norm().clamp_min(1e-6)

    def encode(self, items: Sequence[StepInput]) -> torch.Tensor:
        out = torch.zeros(len(items), self.dim)
        for row, item in zip(out, items):
            for name, text in zip(StepInput._fields, item):
                self._field(row, name, text)
        return out


class LMEncoder:
    """Mean-pooled last hidden states of a frozen LM over ``StepInput.render()``.

    Args:
        model: A transformers model (its base model is used) or a folder to load one from.
        tokenizer: Its tokenizer (loaded from ``model`` when that is a path).
        max_length: Tokens per step, keeping the end (the action) when longer.
        batch_size: Steps per forward pass.
    """

    def __init__(self, model: Any, tokenizer: Any = None, max_length: int = 256, batch_size: int = 16) -> None:
        if isinstance(model, str):
            from transformers import AutoModel, AutoTokenizer

            tokenizer = tokenizer or AutoTokenizer.from_pretrained(model)
            model = AutoModel.from_pretrained(model)
        if tokenizer is None:
            raise ValueError("LMEncoder needs the model's tokenizer")
        self.model = getattr(model, "base_model", model).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.tok = tokenizer
        self.max_length, self.batch_size = max_length, batch_size
        self.dim = int(self.model.config.get_text_config().hidden_size)

    @torch.no_grad()
    def encode(self, items: Sequence[StepInput]) -> torch.Tensor:
        texts = [it.render() for it in items]
        side, self.tok.truncation_side = self.tok.truncation_side, "left"
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.tok.eos_token_id
        outs = []
        try:
            for i in range(0, len(texts), self.batch_size):
                enc = [self.tok(t, truncation=True, max_length=self.max_length)["input_ids"] for t in texts[i:i + self.batch_size]]
                width = max(len(e) for e in enc)
                ids = torch.tensor([e + [pad] * (width - len(e)) for e in enc])
                mask = torch.tensor([[1] * len(e) + [0] * (width - len(e)) for e in enc])
                h = self.model(input_ids=ids.to(self.model.device), attention_mask=mask.to(self.model.device)).last_hidden_state
                m = mask[..., None].to(h.device, h.dtype)
                outs.append(((h * m).sum(1) / m.sum(1).clamp_min(1)).float().cpu())
        finally:
            self.tok.truncation_side = side
        return torch.cat(outs) if outs else torch.zeros(0, self.dim)


class PolicyEncoder:
    """``(T, 2H)`` features of a trajectory's turns: ``[h(s_t), h(s_t, a_t)]``, the final hidden
    states of a frozen causal LM at the turn's last prompt token and last action token, over the
    token ids recorded at sampling time (the episode's ``TokenRecord``): one forward per segment of
    the record, which holds every turn of that segment.

    Args:
        model: The frozen model (e.g. a trainer's reference copy of the SFT'd policy); ``None`` until
            ``bind`` is called.
    """

    def __init__(self, model: Any = None) -> None:
        self.model = None
        self.dim = 0
        if model is not None:
            self.bind(model)

    def bind(self, model: Any) -> None:
        self.model = model
        self.dim = 2 * int(model.config.get_text_config().hidden_size)

    @torch.no_grad()
    def encode_trajectory(self, traj: Trajectory) -> torch.Tensor:
        """Raises: RuntimeError: no model is bound; ValueError: a turn carries no token ids."""
        if self.model is None:
            raise RuntimeError("PolicyEncoder has no model: the trainer binds its reference (bind_policy)")
        rec = traj.record
        segments: dict[int, list[int]] = {}  # the record's segments (one token sequence each): their turns
        for k, turn in enumerate(traj.turns):
            if rec is None or turn.num_tokens == 0:
                raise ValueError("PolicyEncoder reads recorded token ids; this turn has none")
            segments.setdefault(rec.segment_start(turn.span[0]), []).append(k)
        base = getattr(self.model, "get_base_model", lambda: self.model)()
        backbone = base.base_model
        device = next(backbone.parameters()).device
        rows = []
        for start, seg in segments.items():
            end = traj.turns[seg[-1]].span[1]
            ids = torch.tensor([rec.ids[start:end]], device=device)
            h = backbone(input_ids=ids, use_cache=False).last_hidden_state[0].float().cpu()
            for k in seg:
                s_pos, a_pos = traj.turns[k].span[0] - start - 1, traj.turns[k].span[1] - start - 1
                rows.append(torch.cat([h[s_pos], h[a_pos]]))
        return torch.stack(rows) if rows else torch.zeros(0, self.dim)


def make_encoder(spec: str, dim: int = 2048, ngram: int = 2) -> Encoder:
    """``hash`` -> ``HashedNgramEncoder(dim, ngram)``; ``lm:PATH`` -> ``LMEncoder(PATH)``;
    ``default`` -> ``LMEncoder`` over the embedded SmolLM2-135M; ``policy`` -> an unbound
    ``PolicyEncoder`` (the trainer binds its reference model).

    Raises:
        ValueError: an unknown spec.
    """
    if spec == "hash":
        return HashedNgramEncoder(dim, ngram)
    if spec.startswith("lm:"):
        return LMEncoder(spec[3:])
    if spec == "policy":
        return PolicyEncoder()
    if spec == "default":
        from turngym.agents.default_model import load_default_model

        return LMEncoder(*load_default_model())
    raise ValueError(f"unknown encoder {spec!r}; use hash, lm:PATH, default or policy")
