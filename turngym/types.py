"""The nouns every room of turngym shares.

An episode is a conversation. The env speaks in ``Message``s; the policy answers with an
``Utterance`` (text plus the exact token ids it sampled); one env step becomes a ``Turn``; an
episode becomes a ``Trajectory``. Everything here round-trips through JSON losslessly
(``from_dict(to_dict(x)) == x``), so trajectories can be written, resumed and trained on later.

No logic beyond validation lives here.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Protocol, runtime_checkable

ROLES = ("system", "user", "assistant", "tool")


@dataclass
class ToolCall:
    """One call the agent asked for. ``arguments`` is already-parsed JSON (a dict)."""

    id: str
    name: str
    arguments: dict[str, Any]

    def to_dict(self) -> dict:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}

    @classmethod
    def from_dict(cls, d: dict) -> ToolCall:
        return cls(id=d["id"], name=d["name"], arguments=dict(d["arguments"]))


@dataclass
class ToolSpec:
    """What a tool looks like to the agent: name, description and JSON-Schema parameters."""

    name: str
    description: str
    parameters: dict[str, Any]

    def to_dict(self) -> dict:
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    @classmethod
    def from_dict(cls, d: dict) -> ToolSpec:
        return cls(name=d["name"], description=d["description"], parameters=d["parameters"])

    def to_openai(self) -> dict:
        """The OpenAI / HF chat-template ``tools=[...]`` entry."""
        return {"type": "function", "function": self.to_dict()}


@dataclass
class ToolResult:
    """What came back from a call. Failures are results the agent sees, never exceptions."""

    call_id: str | None
    content: str
    is_error: bool = False
    name: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ToolResult:
        return cls(**d)


@dataclass
class Message:
    """An OpenAI-style chat message."""

    role: str
    content: str
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"Message.role must be one of {ROLES}, got {self.role!r}")
        if not isinstance(self.content, str):
            raise TypeError(f"Message.content must be str, got {type(self.content).__name__}")

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls is not None:
            d["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            d["name"] = self.name
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Message:
        calls = d.get("tool_calls")
        return cls(
            role=d["role"],
            content=d["content"],
            tool_calls=None if calls is None else [ToolCall.from_dict(c) for c in calls],
            tool_call_id=d.get("tool_call_id"),
            name=d.get("name"),
        )

    def to_chat(self) -> dict:
        """The dict HF chat templates expect (tool-call arguments as dicts, OpenAI layout)."""
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            d["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            d["name"] = self.name
        return d


@dataclass
class Utterance:
    """What a policy produced for one conversation: the text and the exact tokens behind it.

    Scripted agents leave the token fields empty. LLM policies fill them at sampling time;
    training uses them as they are and never re-tokenizes ``text``. Tool calls are not parsed here:
    the env parses ``text`` with its own format, and that parse is the record (``Turn.tool_calls``).
    """

    text: str
    prompt_ids: list[int] = field(default_factory=list)
    action_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "stop"


def action_valid(info: dict[str, Any]) -> bool:
    """Whether the env accepted the action a step's ``info`` describes: ``info["action_valid"]``, and
    False when it is absent (an action counts as valid only when the env said so). The one definition."""
    return bool(info.get("action_valid", False))


@dataclass
class Turn:
    """One agent utterance and what the env sent back.

    ``prompt_ids`` is the exact token sequence the policy was conditioned on; ``action_ids`` /
    ``action_logprobs`` are the tokens it sampled and their log-probabilities under the model at
    temperature 1 (no top-p), recorded at sampling time. With the trainers' default sampling
    (temperature 1, top-p 1) that is the behaviour policy, so PPO ratios against it are exact. ``info`` holds the env step's info (``action_valid``, ``state_key``, ``elapsed_s``, ...).
    """

    action_text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    observation: list[Message] = field(default_factory=list)
    reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    prompt_ids: list[int] = field(default_factory=list)
    action_ids: list[int] = field(default_factory=list)
    action_logprobs: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.action_logprobs and len(self.action_logprobs) != len(self.action_ids):
            raise ValueError(
                f"Turn has {len(self.action_ids)} action_ids but {len(self.action_logprobs)} logprobs"
            )

    @property
    def action_valid(self) -> bool:
        """Whether the env accepted this turn's action (``types.action_valid`` of its info)."""
        return action_valid(self.info)

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        d["observation"] = [m.to_dict() for m in self.observation]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Turn:
        d = dict(d)
        d["tool_calls"] = [ToolCall.from_dict(c) for c in d.get("tool_calls", [])]
        d["observation"] = [Message.from_dict(m) for m in d.get("observation", [])]
        return cls(**d)


@dataclass
class Trajectory:
    """A whole episode: the opening messages, every turn, and how it ended.

    ``outcome`` is the episode-level result (1.0 = solved for binary tasks; a score otherwise).
    ``metadata`` carries env id, seed, task type and anything a report groups by.
    """

    task_id: str
    turns: list[Turn] = field(default_factory=list)
    outcome: float = 0.0
    terminated: bool = False
    truncated: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)
    initial_observation: list[Message] = field(default_factory=list)

    @property
    def total_reward(self) -> float:
        return float(sum(t.reward for t in self.turns))

    @property
    def success(self) -> bool:
        return self.outcome >= 1.0

    def to_dict(self) -> dict:
        return {
            "task_id": self.task_id,
            "turns": [t.to_dict() for t in self.turns],
            "outcome": self.outcome,
            "terminated": self.terminated,
            "truncated": self.truncated,
            "metadata": self.metadata,
            "initial_observation": [m.to_dict() for m in self.initial_observation],
        }

    @classmethod
    def from_dict(cls, d: dict) -> Trajectory:
        return cls(
            task_id=d["task_id"],
            turns=[Turn.from_dict(t) for t in d["turns"]],
            outcome=d["outcome"],
            terminated=d["terminated"],
            truncated=d["truncated"],
            metadata=dict(d.get("metadata", {})),
            initial_observation=[Message.from_dict(m) for m in d.get("initial_observation", [])],
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, s: str) -> Trajectory:
        return cls.from_dict(json.loads(s))


# ----- the policy interface (``turngym.agents`` implements it; envs with an LLM counterpart use it) --
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
