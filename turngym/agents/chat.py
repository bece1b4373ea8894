"""Chat assembly: conversations to exact token ids, built incrementally across turns.

A policy must train on exactly the tokens it saw and sampled, so history is never re-tokenized.
``ChatRenderer`` builds the episode's ``TokenRecord`` (``conv.state[RECORD_KEY]``), the one record of
its tokens that rollouts, replays, branches and trainers share, and grows it turn by turn:

    prompt(k+1) = prompt(k) + action(k) + delta(k)

- ``action(k)`` are the sampled ids, untouched (even when they are not the tokenizer's canonical
  tokenization of their text, and even when a template would trim their whitespace or drop them).
- ``delta(k)`` is the template's own text after an assistant message: its turn closing (ChatML:
  ``<|im_end|>\n``), the new env messages, and the generation prompt. It is read off a rendering of
  the conversation in which the latest assistant message is a sentinel (everything after the
  sentinel), and tokenized as one string. If the model already emitted the end-of-turn token it is
  not repeated; if a stop string such as ``</tool_call>`` ended the turn, the closing is added.

So turn k's prompt ids are always a prefix of turn k+1's, and the loss mask is 1 exactly on sampled
tokens (the closing the model did not sample is 0). Compared with a fresh ``apply_chat_template``
tokenization of the finished conversation, differences can only come from:

(a) the model sampling a non-canonical tokenization of its text;
(b) a BPE merge across the edge of the model's tokens (e.g. an action starting with ``\n`` right
    after ``assistant\n``): ChatML puts special tokens at every other edge, so nothing else merges;
(c) templates that re-render earlier assistant turns differently (trim whitespace, drop
    reasoning, as Qwen3 does).

In all three the recorded ids are the truth: they are what the model was conditioned on when it
sampled. ``tests/test_chat.py`` shows each case. A template that drops the latest assistant message
entirely falls back to a full re-render, which starts a new segment of the record (``TokenRecord.starts``).

Tools are shown in the env's tool format: ``hermes`` through the template's own ``tools=`` when it
can render them, otherwise (and always for ``xml``/``text``/``openai``) as the format's
``render_tools()`` text appended to the system message.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from turngym.agents.base import Conversation
from turngym.tools.formats import get_format
from turngym.types import RECORD_KEY, Message, TokenRecord

STATE_KEY = "turngym.chat"
_SENTINEL = "\u2063TURNGYM_SENTINEL\u2063"


@dataclass
class ChatState:
    """The renderer's bookkeeping for one conversation, kept in ``conv.state[STATE_KEY]``; the tokens
    themselves are the episode's ``TokenRecord`` (``conv.state[RECORD_KEY]``).

    Attributes:
        record: The episode record this conversation grows.
        prompt_end: Where the latest prompt ends in ``record.ids``.
        n_msgs: How many of ``conv.messages`` the latest prompt rendered.
        fingerprint: Hash of those messages, to notice a conversation edited behind our back.
        last_action: The latest recorded action ids (``None`` before the first sample).
        sampling_logprobs: Per turn, log-probs of the sampled tokens under the distribution actually
            sampled from (after temperature / top-p). The record holds the raw ones.
        resets: How many times the record had to restart from a full re-render.
        owner: Identifies the renderer that built it (a different one starts afresh).
    """

    record: TokenRecord = field(default_factory=TokenRecord)
    prompt_end: int = 0
    n_msgs: int = 0
    fingerprint: int = 0
    last_action: list[int] | None = None
    sampling_logprobs: list[list[float]] = field(default_factory=list)
    resets: int = 0
    owner: int = 0

    @property
    def ids(self) -> list[int]:
        """The current segment's ids: the latest prompt, plus its action once recorded."""
        return self.record.tail()


def _fingerprint(messages: Sequence[Message]) -> int:
    return hash(tuple((m.role, m.content, m.tool_call_id) for m in messages))


class ChatRenderer:
    """Renders conversations through a tokenizer's chat template and records exact token ids.

    Args:
        tokenizer: A Hugging Face tokenizer.
        chat_template: A Jinja template string to use instead of the tokenizer's own; ``None`` keeps
            the tokenizer's (which must have one).

    Raises:
        ValueError: neither the tokenizer nor ``chat_template`` gives a template.
    """

    def __init__(self, tokenizer: Any, chat_template: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.template = chat_template or getattr(tokenizer, "chat_template", None)
        if not self.template:
            raise ValueError("the tokenizer has no chat template; pass chat_template=... (e.g. 'chatml_tools')")
        self.supports_tools = self._probe_tools()
        self.turn_end = self._probe_turn_end()
        self.end_token_ids = self._end_token_ids()

    # ----- template probing --------------------------------------------------------------
    def render(self, messages: list[dict], tools: list[dict] | None = None, add_generation_prompt: bool = False) -> str:
        """The template's text for ``messages`` (OpenAI-style dicts)."""
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or None, chat_template=self.template,
            add_generation_prompt=add_generation_prompt, tokenize=False,
        )

    def _probe_tools(self) -> bool:
        spec = {"type": "function", "function": {"name": "probe_tool_xyz", "description": "d", "parameters": {"type": "object", "properties": {}}}}
        msgs = [{"role": "user", "content": "u"}]
        try:
            return "probe_tool_xyz" in self.render(msgs, [spec])
        except Exception:  # a template that chokes on tools cannot render them
            return False

    def _probe_turn_end(self) -> str:
        msgs = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _SENTINEL}]
        text = self.render(msgs)
        i = text.rfind(_SENTINEL)
        return text[i + len(_SENTINEL):] if i >= 0 else ""

    def _end_token_ids(self) -> set[int]:
        """Tokens that end an assistant turn: EOS, and the template's end-of-turn special token."""
        ids = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        special = set(getattr(self.tokenizer, "all_special_ids", []))
        head = self.encode(self.turn_end)[:1]
        if head and head[0] in special:
            ids.add(head[0])
        return ids

    def encode(self, text: str) -> list[int]:
        """Plain tokenization: templates write their own BOS/special tokens as text."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    # ----- conversations -----------------------------------------------------------------
    def chat_inputs(self, conv: Conversation, messages: Sequence[Message] | None = None) -> tuple[list[dict], list[dict] | None]:
        """Messages as template dicts, with tools either as ``tools=`` or as system-message text."""
        msgs = [m.to_chat() for m in (conv.messages if messages is None else messages)]
        if not conv.tools:
            return msgs, None
        if conv.tool_format == "hermes" and self.supports_tools:
            return msgs, [s.to_openai() for s in conv.tools]
        text = get_format(conv.tool_format).render_tools(list(conv.tools))
        if msgs and msgs[0]["role"] == "system":
            msgs[0] = {**msgs[0], "content": (msgs[0]["content"] + "\n\n" + text).strip()}
        else:
            msgs.insert(0, {"role": "system", "content": text})
        return msgs, None

    def state(self, conv: Conversation) -> ChatState | None:
        st = conv.state.get(STATE_KEY)
        return st if isinstance(st, ChatState) and st.owner == id(self) else None

    def prompt_ids(self, conv: Conversation) -> list[int]:
        """The prompt for the next turn, extending the conversation's recorded ids when possible.

        Returns:
            The prompt token ids (also kept in ``conv.state``).
        """
        st = self.state(conv)
        n = len(conv.messages)
        if st is None or st.last_action is None or n < st.n_msgs or _fingerprint(conv.messages[: st.n_msgs]) != st.fingerprint:
            return self._fresh(conv, st)
        if n == st.n_msgs:  # asked again with nothing new: sample this turn again
            st.record.truncate(st.prompt_end)
            if st.sampling_logprobs:
                st.sampling_logprobs.pop()
            return st.ids
        if conv.messages[st.n_msgs].role != "assistant":
            return self._fresh(conv, st, why="the assistant's reply was not appended to the conversation")
        tail = self._env_delta(conv, st)
        if tail is None:
            return self._fresh(conv, st, why="the chat template dropped the latest assistant turn")
        st.record.add_prompt(self.encode(tail))
        self._mark_prompt(conv, st)
        return st.ids

    def _env_delta(self, conv: Conversation, st: ChatState) -> str | None:
        """Text between the end of the model's action and the next generation point.

        The conversation is rendered with the latest assistant message replaced by a sentinel; what
        follows the sentinel is the template's turn closing, the new env messages and the generation
        prompt. Rendering the sentinel instead of the real content keeps templates that rewrite
        assistant content (trim whitespace, strip or drop reasoning) from shifting the text.
        If the model itself emitted the end-of-turn token the closing starts with, it is not repeated.
        """
        msgs = list(conv.messages)
        msgs[st.n_msgs] = Message("assistant", _SENTINEL)
        chat, tools = self.chat_inputs(conv, msgs)
        text = self.render(chat, tools, add_generation_prompt=True)
        i = text.rfind(_SENTINEL)
        if i < 0:
            return None
        tail = text[i + len(_SENTINEL):]
        last = st.last_action[-1:] if st.last_action else []
        if last and last[0] in self.end_token_ids:
            emitted = self.decode(last)
            if tail.startswith(emitted):
                tail = tail[len(emitted):]
        return tail

    def _fresh(self, conv: Conversation, old: ChatState | None, why: str | None = None) -> list[int]:
        if why:
            warnings.warn(f"re-rendering the whole conversation ({why}); the token record starts a new segment", stacklevel=3)
        msgs, tools = self.chat_inputs(conv)
        ids = self.encode(self.render(msgs, tools, add_generation_prompt=True))
        record = conv.state.get(RECORD_KEY)
        if not isinstance(record, TokenRecord):
            record = conv.state[RECORD_KEY] = TokenRecord()
        record.new_segment()
        record.add_prompt(ids)
        st = ChatState(record=record, owner=id(self))
        if old is not None:
            st.resets = old.resets + (1 if why else 0)
            st.sampling_logprobs = old.sampling_logprobs
        conv.state[STATE_KEY] = st
        self._mark_prompt(conv, st)
        return list(ids)

    def _mark_prompt(self, conv: Conversation, st: ChatState) -> None:
        st.prompt_end = len(st.record.ids)
        st.n_msgs = len(conv.messages)
        st.fingerprint = _fingerprint(conv.messages)

    def record(self, conv: Conversation, action_ids: Sequence[int], logprobs: Sequence[float] | None = None,
               sampling_logprobs: Sequence[float] | None = None) -> tuple[int, int]:
        """Append the sampled action to the conversation's record (loss mask 1).

        Args:
            conv: The conversation ``prompt_ids`` was last called for.
            action_ids: The sampled ids, as sampled.
            logprobs: Their raw (temperature-1) log-probs (none: unknown, recorded as NaN).
            sampling_logprobs: Their log-probs under the distribution sampled from.

        Returns:
            The action's span in the record.

        Raises:
            RuntimeError: ``prompt_ids`` was not called for this conversation first.
        """
        st = self.state(conv)
        if st is None:
            raise RuntimeError("record() before prompt_ids(): no token record for this conversation")
        st.record.truncate(st.prompt_end)
        span = st.record.add_action(list(action_ids), list(logprobs or []))
        st.last_action = list(action_ids)
        st.sampling_logprobs.append(list(sampling_logprobs or []))
        return span

    def forced_ids(self, text: str) -> list[int]:
        """The ids a policy writing ``text`` and ending its turn would sample: the text's tokens and the
        template's end-of-turn token (how a demonstration's reply is recorded)."""
        end = self.encode(self.turn_end)[:1]
        end = end if end and end[0] in self.end_token_ids else sorted(self.end_token_ids)[:1]
        return self.encode(text) + end


def chatml_tools_template() -> str:
    """The bundled ChatML template that renders tools (TRL's ``qwen2_5.jinja``, see the file header)."""
    return (Path(__file__).with_name("templates") / "chatml_tools.jinja").read_text()
