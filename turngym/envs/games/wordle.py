"""Wordle: guess a five-letter word in six tries from per-letter feedback.

Feedback per letter: green (right letter, right place), yellow (in the word, elsewhere), gray
(not in the word, or no more copies of it), computed with the standard two-pass rule for
repeated letters.

Reward per valid guess: ``letter_weight * (greens + 0.5 * yellows) / 5``, plus 1.0 when the word
is found. Guesses that are not five letters or not in the allowed list are error observations
and do not use up a try.

Word lists: the built-in list (``turngym.envs.games.words``) works offline; ``words="lmrl"`` uses
LMRL-Gym's official answer and guess lists (``turngym data download lmrl`` or ``TURNGYM_DATA``).
The oracle is a solver that only guesses words consistent with the feedback so far, picking the
one whose feedback splits the remaining candidates most evenly (maximum entropy).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Any

from turngym.envs.base import StepOutcome, TextEnv
from turngym.envs.games.words import BUILTIN_WORDS
from turngym.envs.splits import split_of
from turngym.tools.base import Tool
from turngym.types import Message, ToolCall

MAX_GUESSES = 6
_NAMES = {"G": "green", "Y": "yellow", ".": "gray"}


def feedback(guess: str, answer: str) -> str:
    """Five marks: ``G`` green, ``Y`` yellow, ``.`` gray (two passes, so repeats are counted right)."""
    marks = ["."] * 5
    left = Counter()
    for i, (g, a) in enumerate(zip(guess, answer)):
        if g == a:
            marks[i] = "G"
        else:
            left[a] += 1
    for i, g in enumerate(guess):
        if marks[i] == "." and left[g] > 0:
            marks[i] = "Y"
            left[g] -= 1
    return "".join(marks)


def best_guess(candidates: tuple[str, ...]) -> str:
    """The candidate whose feedback splits the candidates most evenly (max entropy; ties: first).

    Above 400 candidates only the 30 best by letter frequency are scored, to stay cheap.
    """
    if len(candidates) <= 2:
        return candidates[0]
    return _entropy_pick(candidates)


@lru_cache(maxsize=256)
def _entropy_pick(candidates: tuple[str, ...]) -> str:
    shortlist = candidates
    if len(candidates) > 400:
        freq = Counter(ch for w in candidates for ch in set(w))
        shortlist = tuple(sorted(candidates, key=lambda w: -sum(freq[ch] for ch in set(w)))[:30])
    n = len(candidates)
    best, best_h = shortlist[0], -1.0
    for g in shortlist:
        counts = Counter(feedback(g, a) for a in candidates)
        h = -sum(c / n * math.log2(c / n) for c in counts.values())
        if h > best_h + 1e-12:
            best, best_h = g, h
    return best


def load_words(words: str, data_dir: str | None = None) -> tuple[tuple[str, ...], frozenset[str]]:
    """``(answers, allowed guesses)`` for ``builtin`` or ``lmrl``."""
    if words == "builtin":
        return BUILTIN_WORDS, frozenset(BUILTIN_WORDS)
    if words == "lmrl":
        from turngym.data import dataset_path

        root = Path(dataset_path("lmrl", data_dir))
        read = lambda name: [w.strip().lower() for w in (root / name).read_text().split() if len(w.strip()) == 5]  # noqa: E731
        answers = tuple(sorted(set(read("wordle_official.txt"))))
        extra = read("wordle_official_guess.txt") if (root / "wordle_official_guess.txt").exists() else []
        return answers, frozenset(answers) | frozenset(extra)
    raise ValueError(f"words must be 'builtin' or 'lmrl', got {words!r}")


class WordleEnv(TextEnv):
    """Wordle: find the 5-letter word in 6 guesses from green/yellow/gray feedback."""

    default_tool_format = "text"

    def __init__(self, split: str = "train", words: str = "builtin", data_dir: str | None = None,
                 letter_weight: float = 0.1, **kw: Any) -> None:
        """Args:
            split: ``train`` / ``test``: disjoint sets of answer words (any allowed word may be guessed).
            words: ``builtin`` or ``lmrl`` (official lists; needs the data).
            letter_weight: Weight of the per-letter part of the reward.
        """
        super().__init__(**kw)
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        self.answers, self.allowed = load_words(words, data_dir)
        self.letter_weight = letter_weight
        mine = [w for w in self.answers if split_of(f"wordle:{w}") == split]
        self._secret_of = {f"{words}-{split}-{i:04d}": w for i, w in enumerate(mine)}
        self.task_ids = list(self._secret_of)
        self._secret = ""
        self._guesses: list[tuple[str, str]] = []
        self._last: tuple[str, str] | None = None

    def _build_tools(self) -> list[Tool]:
        def guess(word: str) -> str:
            """Guess a five-letter word.

            Args:
                word: a five-letter English word
            """
            w = word.strip().lower().strip(".!\"'")
            if len(w) != 5 or not w.isalpha():
                raise ValueError(f"{word.strip()[:20]!r} is not a five-letter word")
            if w not in self.allowed:
                raise ValueError(f"{w!r} is not in the word list")
            fb = feedback(w, self._secret)
            self._guesses.append((w, fb))
            self._last = (w, fb)
            marks = " ".join(f"{c.upper()}={_NAMES[m]}" for c, m in zip(w, fb))
            if w == self._secret:
                return f"{w.upper()}: {marks}. You found the word!"
            left = MAX_GUESSES - len(self._guesses)
            tail = f"{left} guess{'es' if left != 1 else ''} left." if left else f"No guesses left. The word was {self._secret.upper()}."
            return f"{w.upper()}: {marks}. {tail}"

        return [Tool.from_function(guess, timeout_s=None)]

    def _reset_task(self, task_id: str) -> list[Message]:
        self._secret = self._secret_of[task_id]
        self._guesses, self._last = [], None
        rules = ("Let's play Wordle. Guess the secret five-letter word in six tries. After each guess you "
                 "learn, for every letter, green (right letter, right spot), yellow (in the word, wrong spot) "
                 "or gray (not in the word). Reply with one word per turn.")
        return [Message("system", f"{rules}\n\n{self.format.render_tools(self.tools.specs)}"), Message("user", "Make your first guess.")]

    def _step_outcome(self, parsed, results) -> StepOutcome:
        if self._last is None:
            return StepOutcome()
        w, fb = self._last
        self._last = None
        won = w == self._secret
        reward = self.letter_weight * (fb.count("G") + 0.5 * fb.count("Y")) / 5 + (1.0 if won else 0.0)
        done = won or len(self._guesses) >= MAX_GUESSES
        return StepOutcome(reward=reward, terminated=done, info={"won": won, "guesses": len(self._guesses)})

    def outcome(self) -> float:
        return float(any(w == self._secret for w, _ in self._guesses))

    def state_key(self) -> str:
        return f"{self._task_id}:" + ",".join(f"{w}/{fb}" for w, fb in self._guesses)

    def task_type(self, task_id: str) -> str:
        return task_id.split("-")[0]

    def candidates(self) -> tuple[str, ...]:
        """Answer words still consistent with every feedback so far."""
        return tuple(a for a in self.answers if all(feedback(w, a) == fb for w, fb in self._guesses))

    def oracle_action(self) -> str | None:
        if self.outcome() or len(self._guesses) >= MAX_GUESSES:
            return None
        cands = self.candidates() or self.answers
        return self.format.render_call(ToolCall("oracle", "guess", {"word": best_guess(cands)}))

    def admissible_actions(self) -> list[str] | None:
        rng = random.Random(f"{self._task_id}:{len(self._guesses)}")
        return [self.format.render_call(ToolCall("r", "guess", {"word": w})) for w in rng.sample(self.answers, 20)]
