"""Car Dealer (LMRL-Gym's Car Dealer task): the agent is a dealer selling a car to a buyer.

The buyers follow LMRL-Gym's data generator: a preferred brand (13) and body type (13), one to
three must-have features (of 10), a budget of $10k, 30k, 50k, 70k or 90k that the dealer does not
know at first, and one of its three buyer backgrounds:

- ``discount``: never buys unless given a discount: an offer is only accepted if it is lower
  than an earlier offer of the dealer's.
- ``specs``: only buys a car that meets all of their specifications (brand, type, every feature).
- ``impatient``: strongly dislikes unnecessary talk: leaves after ``patience`` (4) points, where
  a message costs 1, or 2 if it mentions features or discounts.

The scripted buyer (``buyer="rules"``, deterministic) reads the dealer's message with keyword
rules: questions about brand, type, features or budget are answered truthfully; brand, type and
feature names describe the car on offer; ``Offer: $PRICE`` (or ``offer ... 32k``) is a price
offer. The buyer's limit is ``R = budget * (0.8 + 0.2 * fit)``, where ``fit`` in [0, 1] is the
share of brand, type and wanted features the dealer's car matches (the impatient buyer weighs
brand and type only; the ``specs`` buyer buys only at ``fit = 1``, with ``R = budget``). An offer
at most R is accepted (a deal); a higher one gets a counter-offer. Every buyer leaves after 10
messages without a deal.

With ``buyer=`` a ``Policy`` or an agent spec (the embedded model ``default`` in
``turngym/CarDealer-llm-v0``) a language model writes the buyer's replies to everything but
offers, told the buyer's profile in its system prompt. As in the question games, deals, counter-
offers and leaving are always decided by the rules, so the score never depends on that model.

Reward, at the deal: ``price / budget`` (at most 1, since R <= budget); no deal scores 0. Bands
(``info["band"]``): ``best`` at the full budget, ``good`` from 0.9, ``fair`` from 0.8, ``low``
below. Success (outcome 1) is the best band. The oracle asks for the buyer's wishes and budget,
then offers the matching car at the full budget (the discount buyer first hears a higher price).
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass, field
from typing import Any

from turngym.envs.base import StepOutcome, TextEnv
from turngym.envs.counterpart import resolve_agent
from turngym.envs.splits import split_of
from turngym.tools.base import Tool
from turngym.types import Conversation, Message, SamplingParams, ToolCall

# LMRL-Gym's lists (its generator lists Porsche twice; once here).
BRANDS = ["BMW", "Lexus", "Honda", "Toyota", "Mazda", "Audi", "Hyundai", "Porsche", "Tesla", "Volkswagen",
          "Ford", "Mercedes-Benz", "Subaru"]
TYPES = ["SUV", "Crossover", "Sedan", "Truck", "Hatchback", "Convertible", "Luxury", "Coupe", "Hybrid", "Electric",
         "Van", "Minivan", "Sports"]
FEATURES = {
    "Leather seats": r"leather",
    "Sunroof/moonroof": r"sunroof|moonroof",
    "Heated seats": r"heated seat",
    "Backup camera": r"backup camera|rear[- ]?view camera|reversing camera",
    "Navigation system": r"navigation|\bnav\b|\bgps\b",
    "Bluetooth": r"bluetooth",
    "Remote start": r"remote start",
    "Blind spot monitoring": r"blind[- ]spot",
    "Third-row seating": r"third[- ]row|3rd[- ]row",
    "Apple CarPlay/Android Auto": r"carplay|android auto",
}
BUDGETS = [10_000, 30_000, 50_000, 70_000, 90_000]
PERSONALITIES = {  # LMRL-Gym's buyer backgrounds, and how each buyer opens
    "discount": ("The buyer will never buy from the seller unless given a discount.",
                 "Hi. I'm shopping for a car, but I'll tell you now: I never buy anything without a discount."),
    "specs": ("The buyer will only buy the car if it meets all of their specifications.",
              "Hello. I'm looking for a car, and it has to meet every one of my requirements or I walk."),
    "impatient": (("The buyer is extremely impatient and strongly dislikes unnecessary information about discounts "
                   "and features."), "Hi, I'm in a hurry. Let's make this quick."),
}
_BRAND_RX = [(b, re.compile(rf"\b{p}\b")) for b, p in
             [(b, re.escape(b.lower())) for b in BRANDS] + [("Mercedes-Benz", "mercedes"), ("Volkswagen", "vw")]]
_TYPE_RX = [(t, re.compile(rf"\b{t.lower()}s?\b")) for t in TYPES]  # \bvan does not match "minivan"
_FEATURE_RX = [(f, re.compile(p)) for f, p in FEATURES.items()]
_TOPICS = {
    "brand": r"\bbrands?\b|\bmakes?\b|\bmanufacturer",
    "type": r"\btype\b|\bkind of\b|\bbody\b|\bstyle\b|\blooking for\b",
    "features": r"\bfeatures?\b|\bmust[- ]haves?\b|\brequirements?\b",
    "budget": r"\bbudget\b|\bspend\b|\bafford\b|\bprice range\b",
}
_DISCOUNT_RX = re.compile(r"\bdiscount|\breduc|\bspecial price\b|\boff the price\b|\blower (?:the )?price\b")
_OFFER_RX = re.compile(r"\boffer\b[^$\d]{0,20}\$?\s*(\d[\d,]*(?:\.\d+)?)\s*(k\b)?")
PATIENCE, MAX_ROUNDS = 4, 10


@dataclass(frozen=True)
class Buyer:
    personality: str
    brand: str
    car_type: str
    features: tuple[str, ...]
    budget: int

    @property
    def key(self) -> str:
        return f"{self.personality}|{self.brand}|{self.car_type}|{','.join(sorted(self.features))}|{self.budget}"


@dataclass
class Said:
    """What one dealer message contains, as the rule buyer reads it."""

    topics: list[str] = field(default_factory=list)
    brand: str | None = None
    car_type: str | None = None
    features: set[str] = field(default_factory=set)
    discount: bool = False
    price: float | None = None


def _last(pairs: list[tuple[str, re.Pattern]], text: str) -> str | None:
    """The name whose pattern matches last in ``text`` (the car described most recently)."""
    return max(((m.start(), name) for name, rx in pairs for m in rx.finditer(text)), default=(0, None))[1]


def read_message(text: str) -> Said:
    """Parse a dealer message: topics asked, car described, discount talk, offered price."""
    t = text.lower()
    said = Said(topics=[k for k, p in _TOPICS.items() if re.search(p, t)], brand=_last(_BRAND_RX, t), car_type=_last(_TYPE_RX, t),
                features={f for f, rx in _FEATURE_RX if rx.search(t)}, discount=bool(_DISCOUNT_RX.search(t)))
    if m := _OFFER_RX.search(t):
        try:
            said.price = float(m.group(1).replace(",", "")) * (1000 if m.group(2) else 1)
        except ValueError:
            said.price = None
    return said


def reward_of(price: float | None, budget: float) -> float:
    """The sale's reward: ``price / budget``, or 0 without a deal."""
    return 0.0 if price is None else price / budget


def band_of(reward: float) -> str:
    """``best`` (full budget), ``good`` (>= 0.9), ``fair`` (>= 0.8), ``low`` (> 0) or ``none``."""
    if reward <= 0:
        return "none"
    return "best" if reward >= 1.0 - 1e-9 else "good" if reward >= 0.9 else "fair" if reward >= 0.8 else "low"


def _round500(x: float) -> int:
    return int(x / 500.0 + 0.5) * 500  # half up (round() would round 76.5 to 76)


def _a(word: str) -> str:
    return f"{'an' if word[0].lower() in 'aeiou' or word.startswith('SUV') else 'a'} {word}"


def type_noun(car_type: str) -> str:
    """``"SUV"``, ``"sedan"``, ``"sports car"``: the body type as a noun."""
    if car_type == "SUV":
        return car_type
    return f"{car_type.lower()} car" if car_type in ("Luxury", "Electric", "Sports") else car_type.lower()


def describe_car(brand: str, car_type: str, features: tuple[str, ...] = ()) -> str:
    """``"a BMW sedan with Bluetooth, Heated seats"``."""
    return f"{_a(brand)} {type_noun(car_type)}" + (f" with {', '.join(features)}" if features else "")


def make_buyers(split: str, n: int) -> dict[str, Buyer]:
    """The first ``n`` distinct buyers whose profile hashes to ``split``, by task id."""
    out, seen, i = {}, set(), 0
    while len(out) < n:
        rng = random.Random(f"cardealer:{i}")
        i += 1
        b = Buyer(rng.choice(list(PERSONALITIES)), rng.choice(BRANDS), rng.choice(TYPES),
                  tuple(sorted(rng.sample(list(FEATURES), rng.randint(1, 3)))), rng.choice(BUDGETS))
        if b.key not in seen and split_of(f"cardealer:{b.key}") == split:
            seen.add(b.key)
            out[f"cardealer-{split}-{len(out):03d}"] = b
    return out


class PolicyBuyer:
    """A language model speaks for the buyer; ``policy`` is a ``Policy`` or an agent spec."""

    def __init__(self, policy: Any) -> None:
        self._policy = policy

    @property
    def policy(self):
        self._policy = resolve_agent(self._policy)  # built on first use: a spec may load a model
        return self._policy

    def reply(self, buyer: Buyer, dialogue: list[tuple[str, str]], message: str) -> str:
        system = (f"You are a customer at a car dealership, talking to the dealer. {PERSONALITIES[buyer.personality][0]} "
                  f"You want {describe_car(buyer.brand, buyer.car_type, buyer.features)}. Your budget is ${buyer.budget:,}. Answer the dealer briefly, in one or two "
                  "sentences, as the buyer.")
        msgs = [Message("system", system)]
        for dealer, reply in dialogue:
            msgs += [Message("user", dealer), Message("assistant", reply)]
        conv = Conversation(msgs + [Message("user", message)], tool_format="text")
        text = self.policy.act([conv], SamplingParams(temperature=0.0, max_new_tokens=64))[0].text.strip()
        return text.splitlines()[0][:300] if text else "Hmm."


class CarDealerEnv(TextEnv):
    """Car Dealer: sell a car to a buyer with a hidden budget; reward = price / budget."""

    default_tool_format = "text"

    def __init__(self, split: str = "train", buyer: Any = "rules", n_tasks: int = 100, **kw: Any) -> None:
        """Args:
            split: ``train`` / ``test``: disjoint sets of buyer profiles.
            buyer: ``"rules"`` (scripted, deterministic), a ``Policy``, or an agent spec (a model speaks).
            n_tasks: Buyers in the split.
        """
        super().__init__(**kw)
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        self._buyers = make_buyers(split, n_tasks)
        self.task_ids = list(self._buyers)
        self.nondeterministic = buyer != "rules"
        self.speaker = PolicyBuyer(buyer) if self.nondeterministic else None
        self.buyer = next(iter(self._buyers.values()))
        self._reset_state()

    def _reset_state(self) -> None:
        self.pitch_brand: str | None = None
        self.pitch_type: str | None = None
        self.pitch_features: set[str] = set()
        self.quotes: list[float] = []
        self.dialogue: list[tuple[str, str]] = []
        self.asked: set[str] = set()
        self.patience, self.rejections = PATIENCE, 0
        self.price: float | None = None
        self.left = False
        self._spoke = False

    # ----- the buyer's rules ----------------------------------------------------------------------
    def fit(self) -> float:
        """How well the car on offer matches the buyer's wishes, in [0, 1]."""
        b = self.buyer
        brand, kind = float(self.pitch_brand == b.brand), float(self.pitch_type == b.car_type)
        if b.personality == "impatient":
            return (brand + kind) / 2
        return (brand + kind + len(self.pitch_features & set(b.features)) / len(b.features)) / 3

    def limit(self) -> float | None:
        """The most the buyer pays for the car on offer (None: will not buy it at any price)."""
        f = self.fit()
        if self.buyer.personality == "specs":
            return float(self.buyer.budget) if f >= 1.0 else None
        return self.buyer.budget * (0.8 + 0.2 * f)

    def _missing(self) -> str:
        b, out = self.buyer, []
        if self.pitch_brand != b.brand:
            out.append(f"a {b.brand}")
        if self.pitch_type != b.car_type:
            out.append(_a(type_noun(b.car_type)))
        out += [f for f in b.features if f not in self.pitch_features]
        return ", ".join(out)

    def _consider(self, price: float) -> str:
        b, cap = self.buyer, self.limit()
        earlier = max(self.quotes, default=0.0)
        self.quotes.append(price)
        if cap is None:
            return f"That car doesn't meet my requirements. I need: {self._missing()}."
        if b.personality == "discount" and not earlier > price:
            return f"I never buy without a discount. Can you do better than ${price:,.0f}?"
        if price <= cap + 1e-6:
            self.price = price
            return f"Deal! I'll take it for ${price:,.0f}."
        self.rejections += 1
        counter = min(_round500(cap * min(1.0, 0.8 + 0.05 * self.rejections)), int(cap))
        return f"That's more than I want to pay. I could do ${counter:,}."

    def _answer(self, said: Said) -> str:
        b = self.buyer
        if said.topics and b.personality == "impatient":
            car = describe_car(b.brand, b.car_type)
            return f"{car[0].upper()}{car[1:]}, budget ${b.budget:,}. Now give me a price."
        parts = {"brand": f"I'd like a {b.brand}.", "type": f"I'm after {_a(type_noun(b.car_type))}.",
                 "features": f"It must have: {', '.join(b.features)}.", "budget": f"My budget is ${b.budget:,}."}
        if said.topics:
            return " ".join(parts[t] for t in _TOPICS if t in said.topics)
        if said.brand or said.car_type or said.features:
            miss = self._missing()
            return f"Hmm, I'm really looking for: {miss}." if miss and b.personality == "specs" else "Sounds good. What's the price?"
        return "So, what can you offer me?"

    def respond(self, message: str) -> str:
        """The buyer's reply to one dealer message (updates the negotiation state)."""
        said = read_message(message)
        self.pitch_brand = said.brand or self.pitch_brand
        self.pitch_type = said.car_type or self.pitch_type
        self.pitch_features |= said.features
        self.asked |= set(said.topics)
        if said.price is not None and said.price > 0:
            reply = self._consider(said.price)
        elif self.speaker is not None:
            reply = self.speaker.reply(self.buyer, self.dialogue, message)
        else:
            reply = self._answer(said)
        if self.buyer.personality == "impatient":
            self.patience -= 2 if (said.features or "features" in said.topics or said.discount) else 1
        rounds = len(self.dialogue) + 1
        if self.price is None and (self.patience <= 0 or rounds >= MAX_ROUNDS):
            self.left = True
            reply += " This is taking too long. I'm leaving." if self.patience <= 0 else " I've heard enough. Goodbye."
        self.dialogue.append((message.strip(), reply))
        return reply

    # ----- env hooks ------------------------------------------------------------------------------
    def _build_tools(self) -> list[Tool]:
        def say(message: str) -> str:
            """Say something to the buyer; make a price offer by writing "Offer: $PRICE".

            Args:
                message: what you say to the buyer
            """
            if not message.strip():
                raise ValueError("the message is empty")
            if self.price is not None or self.left:
                raise ValueError("the conversation is over")
            self._spoke = True
            return f"Buyer: {self.respond(message)}"

        return [Tool.from_function(say, timeout_s=None if self.speaker is None else 120.0)]

    def _reset_task(self, task_id: str) -> list[Message]:
        self.buyer = self._buyers[task_id]
        self._reset_state()
        system = ("You are a car dealer. A customer walks in; sell them a car at the highest price you can. You can sell "
                  "any brand, body type and features. Ask about what they want, describe a car, and make price offers by "
                  "writing \"Offer: $PRICE\" (e.g. \"Offer: $32,000\"); an offer the buyer accepts closes the deal. Your "
                  "reward is the sale price divided by the buyer's budget (0 without a deal), which you do not know at "
                  f"first. Buyers leave after {MAX_ROUNDS} messages, impatient ones sooner.\n\n"
                  f"{self.format.render_tools(self.tools.specs)}")
        return [Message("system", system), Message("user", f"Buyer: {PERSONALITIES[self.buyer.personality][1]}")]

    def _step_outcome(self, parsed, results) -> StepOutcome:
        spoke, self._spoke = self._spoke, False
        done = self.price is not None or self.left
        r = reward_of(self.price, self.buyer.budget)
        return StepOutcome(reward=r if (done and spoke) else 0.0, terminated=done,
                           info={"deal": self.price is not None, "price": self.price or 0.0, "band": band_of(r),
                                 "rounds": len(self.dialogue)})

    def outcome(self) -> float:
        return reward_of(self.price, self.buyer.budget)

    def state_key(self) -> str:
        facts = (self.pitch_brand, self.pitch_type, sorted(self.pitch_features), sorted(self.asked), self.quotes,
                 self.patience, len(self.dialogue), self.price, self.left)
        return f"{self._task_id}:{hashlib.sha1(repr(facts).encode()).hexdigest()[:12]}"

    def task_type(self, task_id: str) -> str:
        b = self._buyers.get(task_id)
        return b.personality if b else "default"

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        info["nondeterministic"] = self.nondeterministic
        return obs, info

    # ----- scripted players -----------------------------------------------------------------------
    def oracle_action(self) -> str | None:
        """Ask (brand, type, budget; features too unless the buyer is impatient), then offer the
        matching car at the full budget; the discount buyer first hears a price 10% higher."""
        if self.price is not None or self.left:
            return None
        b = self.buyer
        if not self.dialogue:
            text = ("Which brand and type of car do you want, and what is your budget?" if b.personality == "impatient" else
                    "Which brand and type of car do you want, which features must it have, and what is your budget?")
        else:
            car = describe_car(b.brand, b.car_type, () if b.personality == "impatient" else b.features)
            if b.personality == "discount" and not self.quotes:
                text = f"I have {car}. Offer: ${_round500(b.budget * 1.1):,}"
            elif b.personality == "discount":
                text = f"For you, a discount. Offer: ${b.budget:,}"
            else:
                text = f"I have {car}. Offer: ${b.budget:,}"
        return self.format.render_call(ToolCall("oracle", "say", {"message": text}))

    def admissible_actions(self) -> list[str] | None:
        """Eight messages: two questions, three car descriptions and three offers, drawn at random."""
        if self.price is not None or self.left:
            return None
        rng = random.Random(f"{self._task_id}:{len(self.dialogue)}")
        qs = ["What brand do you like?", "What type of car are you looking for?", "Which features do you need?",
              "What is your budget?"]
        out = rng.sample(qs, 2)
        for _ in range(3):
            feats = tuple(rng.sample(list(FEATURES), 2))
            out.append(f"How about {describe_car(rng.choice(BRANDS), rng.choice(TYPES), feats)}?")
        out += [f"Offer: ${_round500(rng.choice(BUDGETS) * rng.choice([0.8, 0.9, 1.0, 1.1])):,}" for _ in range(3)]
        return [self.format.render_call(ToolCall("r", "say", {"message": m})) for m in out]
