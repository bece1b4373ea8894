"""Gymnasium spaces for conversations.

``gymnasium.spaces.Text`` allows only a fixed character set (letters and digits by default), which
no real observation or model utterance fits. These spaces check types instead.
"""

from __future__ import annotations

import string
from typing import Any

import numpy as np
from gymnasium.spaces import Space

from turngym.types import Message

_SAMPLE_CHARS = string.ascii_letters + string.digits + string.punctuation + " "


def _random_text(rng: np.random.Generator, max_len: int) -> str:
    n = int(rng.integers(0, max_len + 1))
    return "".join(_SAMPLE_CHARS[i] for i in rng.integers(0, len(_SAMPLE_CHARS), size=n))


class MessageSpace(Space[list]):
    """Observations: a list of ``Message``. ``contains`` is a type check."""

    def __init__(self, max_sample_len: int = 64, seed: int | None = None) -> None:
        self.max_sample_len = max_sample_len
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> list[Message]:
        return [Message("user", _random_text(self.np_random, self.max_sample_len))]

    def contains(self, x: Any) -> bool:
        return isinstance(x, list) and all(isinstance(m, Message) for m in x)

    def __repr__(self) -> str:
        return "MessageSpace()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MessageSpace)


class UtteranceSpace(Space[str]):
    """Actions: any string (the model's raw utterance). ``contains`` is a type check."""

    def __init__(self, max_sample_len: int = 64, seed: int | None = None) -> None:
        self.max_sample_len = max_sample_len
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        return _random_text(self.np_random, self.max_sample_len)

    def contains(self, x: Any) -> bool:
        return isinstance(x, (str, Message))

    def __repr__(self) -> str:
        return "UtteranceSpace()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UtteranceSpace)
