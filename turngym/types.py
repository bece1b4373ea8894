"""The nouns every room of turngym shares.

An episode is a conversation. The env speaks in ``Message``s; the policy answers with an
``Utterance`` (text plus the exact token ids it sampled); one env step becomes a ``Turn``; an
episode becomes a ``Trajectory``, whose ``TokenRecord`` holds its tokens once. Everything here round-trips through JSON losslessly
(``from_dict(to_dict(x)) == x``), so trajectories can be written, resumed and trained on later.

No logic beyond validation lives here.
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import asdict, dataclass, field
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


RECORD_KEY = "turngym.record"  # where a policy keeps a conversation's TokenRecord (``Conversation.state``)


@dataclass
class TokenRecord:
    """The episode record: every token the policy saw and sampled, once, in order.

    Built by the policy's chat renderer while it samples (``turngym.agents.chat``): each prompt is the
    previous sequence plus the env's new tokens, each action is appended as sampled. Turns point into
    it (``Turn.span``) and store no tokens of their own, so an episode's memory grows with its length,
    not with its square. Replay, branching, expert demonstrations and training batches all read and
    write this one record. A branch (``branch``) is a record that shares a prefix with its parent.

    Attributes:
        ids: The token ids.
        loss_mask: 1 on sampled tokens (the turns' spans), 0 on prompt and env tokens.
        logprobs: The raw (temperature-1) log-prob of each sampled token recorded at sampling time
            (NaN where the backend gave none; 0.0 for a demonstration's tokens), 0.0 elsewhere.
        starts: Where each segment starts. A segment is one training sequence; a new one starts only
            where a prompt does not extend the sequence before it (a template that had to re-render
            the whole conversation, or a server that re-tokenized it).
    """

    ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    starts: list[int] = field(default_factory=lambda: [0])

    def __len__(self) -> int:
        return len(self.ids)

    def add_prompt(self, ids: list[int]) -> None:
        """Append prompt or env tokens (loss mask 0)."""
        self.ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)

    def add_action(self, ids: list[int], logprobs: list[float] | None = None) -> tuple[int, int]:
        """Append sampled tokens (loss mask 1) with their raw log-probs; without them (a backend that
        returned none) they are NaN, so a trainer that needs them can tell. Returns their span."""
        if logprobs and len(logprobs) != len(ids):
            raise ValueError(f"{len(ids)} sampled ids but {len(logprobs)} log-probs")
        start = len(self.ids)
        self.ids += ids
        self.loss_mask += [1] * len(ids)
        self.logprobs += [float(x) for x in logprobs] if logprobs else [math.nan] * len(ids)
        return start, len(self.ids)

    def truncate(self, n: int) -> None:
        """Drop every token from position ``n`` on (a turn sampled again)."""
        del self.ids[n:], self.loss_mask[n:], self.logprobs[n:]
        while len(self.starts) > 1 and self.starts[-1] > n:
            self.starts.pop()

    def new_segment(self) -> None:
        """Start a new training sequence at the end (the next prompt does not extend this one)."""
        if self.ids and self.starts[-1] != len(self.ids):
            self.starts.append(len(self.ids))

    def segment_start(self, pos: int) -> int:
        """Where the segment holding position ``pos`` starts."""
        return self.starts[bisect.bisect_right(self.starts, pos) - 1]

    def tail(self) -> list[int]:
        """The current segment's ids (what the next prompt extends)."""
        return self.ids[self.starts[-1]:]

    def add_turn(self, prompt: list[int], action: list[int], logprobs: list[float] | None) -> tuple[int, int]:
        """Record one turn from a whole prompt (a policy that is given its prompt ids rather than
        growing them, e.g. an HTTP server's): the prompt's new tokens extend the current segment, or
        start a new one when it does not extend it. Returns the action's span."""
        tail = self.tail()
        if prompt[: len(tail)] != tail or not tail:
            self.new_segment()
            tail = []
        self.add_prompt(prompt[len(tail):])
        return self.add_action(action, list(logprobs or []))

    def prompt(self, span: tuple[int, int]) -> list[int]:
        """The prompt a span's action was sampled from: its segment up to the span."""
        return self.ids[self.segment_start(span[0]) : span[0]]

    def branch(self, at: int, action: list[int], logprobs: list[float] | None = None) -> tuple[TokenRecord, tuple[int, int]]:
        """A record that shares this one's segment up to position ``at`` (a turn's prompt) and then
        holds ``action`` instead: ``(branch, the action's span in it)``."""
        seg = self.segment_start(at)
        rec = TokenRecord(self.ids[seg:at], self.loss_mask[seg:at], self.logprobs[seg:at])
        return rec, rec.add_action(list(action), logprobs)

    def to_dict(self) -> dict:
        return {"ids": self.ids, "loss_mask": self.loss_mask, "logprobs": self.logprobs, "starts": self.starts}

    @classmethod
    def from_dict(cls, d: dict) -> TokenRecord:
        return cls(list(d["ids"]), list(d["loss_mask"]), list(d["logprobs"]), list(d["starts"]))


@dataclass
class Utterance:
    """What a policy produced for one conversation: the text and the exact tokens behind it.

    Scripted agents leave the token fields empty. LLM policies fill them at sampling time and append
    them to the conversation's ``TokenRecord`` (``conv.state[RECORD_KEY]``); ``span`` is where they
    sit in it and ``record`` is that record (a reference, not a copy). Training uses the recorded ids as they are and never re-tokenizes ``text``. Tool calls
    are not parsed here: the env parses ``text`` with its own format, and that parse is the record
    (``Turn.tool_calls``).

    ``cache`` is engine state a policy may attach to a reply it proposed without playing it (branch
    search's runner-ups): the keys and values of the prompt it answers. A branch that later plays the
    reply hands it back (``resume``) and computes only what follows, not its whole history again.
    """

    text: str
    action_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "stop"
    span: tuple[int, int] | None = None
    record: TokenRecord | None = field(default=None, repr=False, compare=False)
    cache: Any = field(default=None, repr=False, compare=False)

    @property
    def prompt_ids(self) -> list[int]:
        """The ids this utterance was sampled from, read from the record it points into ([] without one)."""
        return self.record.prompt(self.span) if self.record is not None and self.span is not None else []


def action_valid(info: dict[str, Any]) -> bool:
    """Whether the env accepted the action a step's ``info`` describes: ``info["action_valid"]``, and
    False when it is absent (an action counts as valid only when the env said so). The one definition."""
    return bool(info.get("action_valid", False))


@dataclass
class Turn:
    """One agent utterance and what the env sent back.

    ``span`` is where the utterance's sampled tokens sit in the episode's ``TokenRecord``
    (``Trajectory.record``): the prompt it was sampled from is the record's segment before it. The
    log-probs there are the raw model log-probs at temperature 1 (no top-p), recorded at sampling
    time; with the trainers' default sampling (temperature 1, top-p 1) that is the behaviour policy,
    so PPO ratios against it are exact. A turn without tokens (a scripted agent's) has no span.
    ``info`` holds the env step's info (``action_valid``, ``state_key``, ``elapsed_s``, ...).
    """

    action_text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    observation: list[Message] = field(default_factory=list)
    reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    span: tuple[int, int] | None = None

    @property
    def action_valid(self) -> bool:
        """Whether the env accepted this turn's action (``types.action_valid`` of its info)."""
        return action_valid(self.info)

    @property
    def num_tokens(self) -> int:
        """How many tokens the policy sampled for this turn (0 without a record)."""
        return self.span[1] - self.span[0] if self.span is not None else 0

    def to_dict(self) -> dict:
        return {"action_text": self.action_text, "tool_calls": [c.to_dict() for c in self.tool_calls],
                "observation": [m.to_dict() for m in self.observation], "reward": self.reward, "info": self.info,
                "span": None if self.span is None else list(self.span)}

    @classmethod
    def from_dict(cls, d: dict) -> Turn:
        if "prompt_ids" in d or "action_ids" in d:
            raise ValueError("this trajectory was written by an older turngym, which stored every turn's prompt; "
                             "it cannot be read: record it again with this version")
        return cls(action_text=d["action_text"], tool_calls=[ToolCall.from_dict(c) for c in d.get("tool_calls", [])],
                   observation=[Message.from_dict(m) for m in d.get("observation", [])], reward=d.get("reward", 0.0),
                   info=dict(d.get("info", {})), span=None if d.get("span") is None else tuple(d["span"]))


@dataclass
class Trajectory:
    """A whole episode: the opening messages, every turn, and how it ended.

    ``outcome`` is the episode-level result (1.0 = solved for binary tasks; a score otherwise).
    ``metadata`` carries env id, seed, task type and anything a report groups by.

    ``cache`` is engine state a policy may leave on a failed episode played with
    ``EpisodeSpec.keep_cache``: the keys and values of its whole conversation, from which branch
    search scores the episode's turns instead of prefilling their history again. It is never
    serialized, and whoever reads it drops it (sets it to None) when done.
    """

    task_id: str
    turns: list[Turn] = field(default_factory=list)
    outcome: float = 0.0
    terminated: bool = False
    truncated: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)
    initial_observation: list[Message] = field(default_factory=list)
    record: TokenRecord | None = None
    cache: Any = field(default=None, repr=False, compare=False)

    def prompt_ids(self, k: int) -> list[int]:
        """The token ids turn ``k``'s action was sampled from ([] without a record)."""
        span = self.turns[k].span
        return self.record.prompt(span) if span is not None and self.record is not None else []

    def action_ids(self, k: int) -> list[int]:
        """The token ids turn ``k`` sampled ([] without a record)."""
        span = self.turns[k].span
        return self.record.ids[span[0] : span[1]] if span is not None and self.record is not None else []

    def action_logprobs(self, k: int) -> list[float]:
        """The recorded raw log-probs of turn ``k``'s sampled tokens."""
        span = self.turns[k].span
        return self.record.logprobs[span[0] : span[1]] if span is not None and self.record is not None else []

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
            "record": None if self.record is None else self.record.to_dict(),
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
            record=None if d.get("record") is None else TokenRecord.from_dict(d["record"]),
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
