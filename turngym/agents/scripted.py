"""Scripted agents: the walkthrough oracle and random-admissible play.

They go through the same ``Policy.act`` interface as LLM policies. Each asks its env for
``scripted_hints`` and reads ``info["oracle_action"]`` / ``info["admissible_actions"]``.
"""

from __future__ import annotations

import random

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
    """Plays a uniformly random admissible action (falls back to random text when none are known)."""

    env_kwargs = {"scripted_hints": True}

    def __init__(self, seed: int | None = 0) -> None:
        self.rng = random.Random(seed)

    def act(self, conversations: list[Conversation], sampling: SamplingParams | None = None) -> list[Utterance]:
        out = []
        for conv in conversations:
            choices = conv.info.get("admissible_actions")
            if choices:
                out.append(Utterance(text=self.rng.choice(choices)))
            else:
                n = self.rng.randint(1, 20)
                out.append(Utterance(text="".join(self.rng.choice("abcdefghij <>{}") for _ in range(n))))
        return out
