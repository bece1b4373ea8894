"""Scripted agents: the walkthrough oracle and random-admissible play.

They go through the same ``Policy.act`` interface as LLM policies. Each asks its env for
``scripted_hints`` and reads ``info["oracle_action"]`` / ``info["admissible_actions"]``.
"""

from __future__ import annotations

import hashlib
import random
import string
from typing import Any

from turngym.agents.base import Conversation, SamplingParams
from turngym.tools.formats import get_format
from turngym.types import ToolCall, ToolSpec, Utterance


class OracleAgent:
    """Plays the env's expert action every turn (walkthrough, gold query, gold patch)."""

    env_kwargs = {"scripted_hints": True}

    def act(self, conversations: list[Conversation], sampling: SamplingParams | None = None) -> list[Utterance]:
        out = []
        for conv in conversations:
            action = conv.info.get("oracle_action")
            if action is None:
                raise RuntimeError(
                    "the env gave no oracle_action; it has no scripted oracle (or was made without "
                    "scripted_hints=True)"
                )
            out.append(Utterance(text=action))
        return out


class RandomAgent:
    """Plays a uniformly random admissible action. An env that lists none (``admissible_actions()``
    is optional) gets a random well-formed call instead: a uniformly chosen tool with arguments
    drawn from its JSON schema, in the env's tool format. Only an env without tools gets random text.

    With ``sampling.seed`` set, each choice is seeded by (seed, the conversation so far), like the LLM
    policies' per-row seeds: an episode plays the same whatever else shares its batch, so a killed and
    resumed benchmark equals an uninterrupted one. Without it, one generator seeded by ``seed`` runs on.
    """

    env_kwargs = {"scripted_hints": True}

    def __init__(self, seed: int | None = 0) -> None:
        self.rng = random.Random(seed)

    def act(self, conversations: list[Conversation], sampling: SamplingParams | None = None) -> list[Utterance]:
        out, seen = [], {}
        for conv in conversations:
            rng = self.rng
            if sampling is not None and sampling.seed is not None:
                h = _row_seed(sampling.seed, conv)
                seen[h] = seen.get(h, -1) + 1  # identical conversations in one batch still differ
                rng = random.Random(h + seen[h])
            choices = conv.info.get("admissible_actions")
            if choices:
                out.append(Utterance(text=rng.choice(choices)))
            elif conv.tools:
                out.append(Utterance(text=random_call(conv.tools, conv.tool_format, rng)))
            else:
                n = rng.randint(1, 20)
                out.append(Utterance(text="".join(rng.choice("abcdefghij <>{}") for _ in range(n))))
        return out


def random_call(tools: list[ToolSpec], tool_format: str, rng: random.Random) -> str:
    """One call of a uniformly chosen tool, its arguments sampled from the tool's schema, rendered
    in ``tool_format`` (``hermes``, ``openai``, ``xml`` or ``text``)."""
    spec = rng.choice(tools)
    return get_format(tool_format).render_call(ToolCall("random", spec.name, sample_value(spec.parameters, rng)))


def sample_value(schema: dict[str, Any], rng: random.Random) -> Any:
    """A random value that satisfies a simple JSON schema: ``enum``/``const``, the basic types with
    their bounds, ``anyOf``/``oneOf`` (the first branch), objects (every required property, each
    optional one half the time) and arrays. Unbounded numbers come from 0 to 9; strings are short
    lowercase words."""
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return rng.choice(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return sample_value(schema[key][0], rng)
    kind = schema.get("type", "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        props, required = schema.get("properties", {}), set(schema.get("required", []))
        return {k: sample_value(v, rng) for k, v in props.items() if k in required or rng.random() < 0.5}
    if kind == "array":
        lo = int(schema.get("minItems", 0))
        n = rng.randint(lo, max(lo, min(int(schema.get("maxItems", lo + 2)), lo + 2)))
        return [sample_value(schema.get("items", {}), rng) for _ in range(n)]
    if kind in ("integer", "number"):
        lo = schema.get("minimum", schema.get("exclusiveMinimum", -1) + 1)
        hi = schema.get("maximum", schema.get("exclusiveMaximum", lo + 10) - 1)
        return rng.randint(int(lo), int(hi)) if kind == "integer" else round(rng.uniform(lo, hi), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    lo = int(schema.get("minLength", 1))
    n = rng.randint(lo, max(lo, min(int(schema.get("maxLength", lo + 7)), lo + 7)))
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(n))


def _row_seed(seed: int, conv: Conversation) -> int:
    transcript = repr((seed, [(m.role, m.content) for m in conv.messages]))
    return int.from_bytes(hashlib.blake2b(transcript.encode(), digest_size=8).digest(), "little")


class Demonstrator:
    """A scripted agent whose replies are recorded as a policy's own tokens: demonstrations the
    policy can imitate.

    Each reply goes into the episode's ``TokenRecord`` through the policy's chat renderer, exactly as
    if the policy had sampled it: the prompt grows as it would in RL (the same incremental layout),
    and the reply is its text's tokens plus the template's end-of-turn token, with log-probs 0.

    Args:
        agent: The scripted agent that chooses the replies (e.g. ``OracleAgent``).
        chat: The policy's ``ChatRenderer`` (``HFPolicy.chat``).
    """

    def __init__(self, agent: Any, chat: Any) -> None:
        self.agent, self.chat = agent, chat
        self.env_kwargs = dict(getattr(agent, "env_kwargs", {}))

    def act(self, conversations: list[Conversation], sampling: SamplingParams | None = None) -> list[Utterance]:
        out = []
        for conv, utt in zip(conversations, self.agent.act(conversations, sampling)):
            self.chat.prompt_ids(conv)
            ids = self.chat.forced_ids(utt.text)
            span = self.chat.record(conv, ids, [0.0] * len(ids))
            out.append(Utterance(utt.text, ids, [0.0] * len(ids), utt.finish_reason, span, self.chat.state(conv).record))
        return out
