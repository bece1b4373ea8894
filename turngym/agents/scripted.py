"""Scripted agents: the walkthrough oracle and random-admissible play.

They go through the same ``Policy.act`` interface as LLM policies. Each asks its env for
``scripted_hints`` and reads ``info["oracle_action"]`` / ``info["admissible_actions"]``.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

from turngym.agents.base import Conversation, SamplingParams
from turngym.types import Utterance


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
    """Plays a uniformly random admissible action (falls back to random text when none are known).

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
            else:
                n = rng.randint(1, 20)
                out.append(Utterance(text="".join(rng.choice("abcdefghij <>{}") for _ in range(n))))
        return out


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
