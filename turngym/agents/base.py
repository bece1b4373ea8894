"""The policy interface: conversations in, utterances (with exact tokens) out.

A ``Conversation`` is one episode as the agent sees it: the messages so far, the env's tools and
tool format, and the env's latest ``info``. LLM policies render messages + tools through a chat
template; scripted agents read ``info`` (``oracle_action``, ``admissible_actions``) instead. Both
answer through ``Policy.act``, so the rollout, eval and bench code never special-cases either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from turngym.types import Message, ToolSpec, Utterance


@dataclass
class SamplingParams:
    """How to sample one utterance.

    Args:
        temperature: 0 means greedy.
        top_p: Nucleus sampling mass.
        max_new_tokens: Length cap for one utterance.
        stop: Extra stop strings (the env's tool format adds its own, e.g. ``</tool_call>``).
        seed: Seeds the sampler for reproducible rollouts (``None``: unseeded).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    stop: list[str] = field(default_factory=list)
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class Conversation:
    """One episode as the policy sees it.

    Args:
        messages: Everything said so far, env and agent, in order.
        tools: The env's tool specs (rendered by the policy in ``tool_format``).
        tool_format: ``hermes`` | ``openai`` | ``xml`` | ``text``.
        info: The env's latest info dict (scripted agents read hints from it).
        state: Scratch space the policy owns across turns (e.g. token ids, a KV cache handle).
    """

    messages: list[Message]
    tools: list[ToolSpec] = field(default_factory=list)
    tool_format: str = "hermes"
    info: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Policy(Protocol):
    """Anything that answers conversations.

    ``env_kwargs`` lets a policy ask the env for what it needs (scripted agents need
    ``scripted_hints=True``); LLM policies leave it empty.
    """

    env_kwargs: dict[str, Any]

    def act(self, conversations: list[Conversation], sampling: SamplingParams | None = None) -> list[Utterance]:
        """One utterance per conversation, in order."""
        ...
