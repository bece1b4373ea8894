"""Question games (Twenty Questions, Guess My City): ask questions, then name the secret.

The answerer is pluggable:

- ``"rules"`` (default): questions are matched to a built-in attribute table: first an exact
  canonical question, then a guess (the question names an entity: "Is it a cat?"), then keyword
  patterns ("... an animal ..."). Unmatched questions get a short "cannot answer" reply.
- any turngym ``Policy`` (or an agent spec such as ``"openai:..."``): a language model answers
  each question, told the secret in its system prompt. Such an env is nondeterministic.

Whether a guess is right is always decided by the rules (the question must name the secret or
one of its aliases), so the score never depends on the answerer model.

The oracle keeps the entities consistent with the answers so far and asks the table question
whose answers split them most evenly (maximum entropy); with one left, it guesses.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from turngym.envs.base import StepOutcome, TextEnv
from turngym.envs.counterpart import resolve_agent
from turngym.envs.splits import split_of
from turngym.tools.base import Tool
from turngym.types import Conversation, Message, SamplingParams, ToolCall

_GUESS = re.compile(
    r"^(?:is it|is this|is that|is the (?:object|thing|item|city|answer|secret)|is your (?:object|city)|"
    r"are you thinking of|could it be|it is|its|the answer is|my guess is|i guess|the city is)?\s*"
    r"(?:a |an |the )?(?P<name>.+)$"
)


def norm(text: str) -> str:
    """Lower case, letters/digits/spaces only, single spaces."""
    text = text.lower().replace("\u2019", "'").replace("'", "")
    return " ".join(re.sub(r"[^a-z0-9\u00c0-\u024f ]+", " ", text).split())


@dataclass(frozen=True)
class Entity:
    """A possible secret: its name, other names that count as a correct guess, and attributes."""

    name: str
    aliases: tuple[str, ...] = ()
    attrs: dict = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True)
class Question:
    """A question the rule answerer knows: a canonical text, a keyword pattern, an answer rule."""

    key: str
    text: str
    pattern: str
    answer: Callable[[Entity], str] = field(hash=False, compare=False)


class RuleAnswerer:
    """Answers from the attribute table (see the module docstring for the matching order)."""

    def __init__(self, bank: list[Question], entities: list[Entity]) -> None:
        self.bank = bank
        self.canonical = {norm(q.text): q for q in bank}
        self.compiled = [(re.compile(q.pattern), q) for q in bank]
        self.names = {norm(n): e for e in entities for n in (e.name, *e.aliases)}

    def classify(self, question: str) -> tuple[str, Any]:
        """``("question", Question)``, ``("guess", Entity)``, ``("wrong-guess", text)`` or ``("unknown", None)``."""
        n = norm(question)
        if n in self.canonical:
            return "question", self.canonical[n]
        m = _GUESS.match(n)
        target = m.group("name").strip() if m else n
        if target in self.names:
            return "guess", self.names[target]
        for rx, q in self.compiled:
            if rx.search(n):
                return "question", q
        if m and m.group(0) != target and 0 < len(target.split()) <= 4:
            return "wrong-guess", target  # "is it a zebra?": names something not in the table
        return "unknown", None


class PolicyAnswerer:
    """A language model answers; ``policy`` is a ``Policy`` or an agent spec for ``make_agent``."""

    def __init__(self, policy: Any, describe: Callable[[Entity], str]) -> None:
        self._policy = policy
        self.describe = describe

    @property
    def policy(self):
        self._policy = resolve_agent(self._policy)  # built on first use: a spec may load a model
        return self._policy

    def answer(self, question: str, secret: Entity) -> str:
        conv = Conversation([Message("system", self.describe(secret)), Message("user", question)], tool_format="text")
        text = self.policy.act([conv], SamplingParams(temperature=0.0, max_new_tokens=32))[0].text.strip()
        first = norm(text).split()[:1]
        if first == ["yes"]:
            return "Yes."
        if first == ["no"]:
            return "No."
        return text.splitlines()[0][:200] if text else "I don't know."


def entropy(values: list[str]) -> float:
    n = len(values)
    return -sum(c / n * math.log2(c / n) for c in Counter(values).values())


class QuestionGameEnv(TextEnv):
    """Base class: subclasses set ``entities``, ``bank``, ``prefix``, ``subject`` and prompts."""

    default_tool_format = "text"
    prefix = "game"
    subject = "object"
    cannot_answer = "I can only answer yes/no questions about the object."

    def __init__(self, split: str = "train", answerer: Any = "rules", max_questions: int = 20,
                 step_penalty: float = 0.0, **kw: Any) -> None:
        """Args:
            split: ``train`` / ``test``: disjoint sets of secrets.
            answerer: ``"rules"``, a ``Policy``, or an agent spec (a model answers; nondeterministic).
            max_questions: Questions (guesses included) before the game is lost.
            step_penalty: Subtracted from the reward for every question.
        """
        super().__init__(**kw)
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        self.entities, self.bank = self.build_entities(), self.build_bank()
        self.rules = RuleAnswerer(self.bank, self.entities)
        self.nondeterministic = answerer != "rules"
        self.answerer = PolicyAnswerer(answerer, self.answerer_prompt) if self.nondeterministic else None
        self.max_questions, self.step_penalty = max_questions, step_penalty
        mine = [e for e in self.entities if split_of(f"{self.prefix}:{e.name}") == split]
        self._secret_of = {f"{self.prefix}-{split}-{i:03d}": e for i, e in enumerate(mine)}
        self.task_ids = list(self._secret_of)
        self._secret: Entity | None = None
        self._history: list[tuple[str, str, str, Any]] = []  # (question, answer, kind, detail)
        self._won = False
        self._asked_now = False

    # subclasses ------------------------------------------------------------------------------
    def build_entities(self) -> list[Entity]:
        raise NotImplementedError

    def build_bank(self) -> list[Question]:
        raise NotImplementedError

    def intro(self) -> str:
        raise NotImplementedError

    def answerer_prompt(self, secret: Entity) -> str:
        return (f"You are the answerer in a guessing game. The secret {self.subject} is: {secret.name}. Answer the "
                f"player's question truthfully and briefly; answer yes/no questions with Yes or No. Never say the secret.")

    def guess_text(self, e: Entity) -> str:
        return f"Is it {e.name}?"

    # ----- tools and steps ----------------------------------------------------------------------
    def _build_tools(self) -> list[Tool]:
        def ask(question: str) -> str:
            """Ask one question, or guess by naming it ("Is it ...?").

            Args:
                question: your question
            """
            if not question.strip():
                raise ValueError("the question is empty")
            kind, detail = self.rules.classify(question)
            if kind == "guess" and detail == self._secret:
                self._won = True
                reply = f"Yes! It is {self._secret.name}. You win."
            elif kind == "guess":
                reply = "No."
            elif self.answerer is not None:
                reply = self.answerer.answer(question, self._secret)
            elif kind == "question":
                reply = detail.answer(self._secret)
            elif kind == "wrong-guess":
                reply = "No."
            else:
                reply = self.cannot_answer
            self._history.append((question.strip(), reply, kind, detail))
            self._asked_now = True
            left = self.max_questions - len(self._history)
            if not self._won and left <= 0:
                reply += f" You are out of questions. It was {self._secret.name}."
            return reply

        return [Tool.from_function(ask, timeout_s=None if self.answerer is None else 120.0)]

    def _reset_task(self, task_id: str) -> list[Message]:
        self._secret = self._secret_of[task_id]
        self._history, self._won, self._asked_now = [], False, False
        system = f"{self.intro()} You may ask up to {self.max_questions} questions.\n\n{self.format.render_tools(self.tools.specs)}"
        return [Message("system", system), Message("user", "I have one in mind. Ask your first question.")]

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        info["nondeterministic"] = self.nondeterministic
        return obs, info

    def _step_outcome(self, parsed, results) -> StepOutcome:
        asked, self._asked_now = self._asked_now, False
        reward = (1.0 if self._won else 0.0) - (self.step_penalty if asked else 0.0)
        done = self._won or len(self._history) >= self.max_questions
        return StepOutcome(reward=reward, terminated=done, info={"won": self._won, "questions": len(self._history)})

    def outcome(self) -> float:
        return float(self._won)

    def state_key(self) -> str:
        facts = sorted(f"{getattr(d, 'key', d)}={a}" for _, a, _, d in self._history)
        return f"{self._task_id}:{hashlib.sha1(chr(10).join(facts).encode()).hexdigest()[:12]}"

    def task_type(self, task_id: str) -> str:
        e = self._secret_of.get(task_id)
        return str(e.attrs.get("category", self.prefix)) if e else "default"

    # ----- the oracle ---------------------------------------------------------------------------
    def candidates(self) -> list[Entity]:
        """Entities consistent with every answer so far (as the rules would have answered)."""
        out = []
        for e in self.entities:
            ok = True
            for _, reply, kind, detail in self._history:
                if kind == "question" and detail.answer(e) != reply:
                    ok = False
                elif kind == "guess" and detail == e:
                    ok = False
            if ok:
                out.append(e)
        return out

    def oracle_action(self) -> str | None:
        if self._won or len(self._history) >= self.max_questions:
            return None
        cands = self.candidates() or self.entities
        asked = {d.key for _, _, k, d in self._history if k == "question"}
        best, best_h = None, 0.0
        for q in self.bank:
            if q.key not in asked:
                h = entropy([q.answer(e) for e in cands])
                if h > best_h + 1e-12:
                    best, best_h = q, h
        text = self.guess_text(cands[0]) if best is None or len(cands) == 1 else best.text
        return self.format.render_call(ToolCall("oracle", "ask", {"question": text}))

    def admissible_actions(self) -> list[str] | None:
        """Seven table questions and one guess, drawn at random (mostly not the secret)."""
        rng = random.Random(f"{self._task_id}:{len(self._history)}")
        texts = [q.text for q in rng.sample(self.bank, min(7, len(self.bank)))] + [self.guess_text(rng.choice(self.entities))]
        return [self.format.render_call(ToolCall("r", "ask", {"question": t})) for t in texts]
