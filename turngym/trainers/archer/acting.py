"""Acting with the critic (not in the paper, where the critic only trains the actor): at every turn
the policy's greedy reply and its runner-ups are scored by ArCHer's utterance-level critic, and the
one it rates highest is played. The pipeline stage ``acting`` evaluates the trained actor acting
with its own critic (``acting.k > 0``); ``hierarchy.py`` fits a critic of the trained actor instead.

Why: in training the env judges every reply a search plays, and it is a better judge than the
critic; at test time the env cannot be asked, and the critic can. The actor proposes (its greedy
reply plus ``k`` runner-ups, the same ``alternatives`` branch search plays), the critic decides.

A runner-up replaces the greedy reply only when its min(Q1, Q2) beats the greedy reply's by more
than ``margin`` (``pick_reply``), so a critic with nothing to say leaves the actor's choice alone.
The chosen reply's ids and log-probs are recorded in the conversation's token record as if sampled,
in place of the greedy reply's (as a turn sampled again is); the KV cache kept from the greedy reply
is reused up to the common prefix, so nothing is re-tokenized and little is recomputed. The runner-ups
are scored and finished from that cache too (``HFPolicy.held_cache``): a turn prefills its new tokens,
not the episode's history, once for the actor and once for the critic (``PromptFeatures``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from turngym.config import knob
from turngym.tools.formats import format_stops
from turngym.trainers.archer.critic_rank import reply_scores
from turngym.trainers.stages import Section, Stage, register_section, register_stage
from turngym.types import Conversation, SamplingParams, Utterance

ReplyValues = Callable[[list[int], list[list[int]]], list[float]]
"""``values(prompt_ids, [reply_ids, ...])``: a score per reply (``ArcherTrainer.reply_values``)."""


@dataclass
class ActingConfig:
    """The held-out evaluation of the trained actor acting with a critic (stage ``final_critic``)."""

    k: int = knob(0, "runner-ups scored beside the greedy reply at every turn by min(Q1, Q2); the best is played "
                     "(0: no such evaluation). The critic is the RL stage's own (algo=archer), or with hierarchy.tasks "
                     "the hierarchy stage's")
    margin: float = knob(0.0, "how much higher a runner-up's score must be to replace the greedy reply")
    prior: float = knob(0.0, "a reply's score is min(Q1, Q2) + this x its log-probability under the actor")

    def __post_init__(self) -> None:
        if min(self.k, self.margin, self.prior) < 0:
            raise ValueError(f"acting: k, margin and prior must be >= 0, got {self.k}, {self.margin}, {self.prior}")


def pick_reply(values: Sequence[float], margin: float = 0.0) -> int:
    """The index of the reply to play: 0 (the policy's own) unless another's value beats it by more
    than ``margin``; then the highest valued (the first of equals)."""
    best = max(range(len(values)), key=lambda i: (values[i], -i))
    return best if values[best] > values[0] + margin else 0


class CriticGuidedPolicy:
    """A policy that plays, at each turn, the best under a critic of its greedy reply and ``k`` runner-ups.

    Args:
        policy: Proposes the replies: ``act`` and ``alternatives`` (``HFPolicy`` or ``VLLMPolicy``).
        values: Scores a turn's candidate replies (``ReplyValues``).
        k: Runner-ups scored beside the greedy reply at every turn.
        margin: How much higher a runner-up's score must be to replace the greedy reply.
        prior: Weight of the actor's log-probability in a reply's score (``reply_scores``).

    Attributes:
        stats: ``turns`` scored and ``moved`` (turns where a runner-up was played).

    Anything else (``chat``, ``invalidate_caches``, ``tokenizer`` ...) is the wrapped policy's.
    """

    def __init__(self, policy: Any, values: ReplyValues, k: int = 3, margin: float = 0.0, prior: float = 0.0) -> None:
        if k < 1:
            raise ValueError(f"critic-guided acting scores k >= 1 runner-ups per turn, got {k}")
        if not hasattr(policy, "alternatives"):
            raise ValueError(f"{type(policy).__name__} cannot propose runner-up replies; critic-guided acting "
                             "needs an HF or vLLM policy")
        self.policy, self.values, self.k, self.margin, self.prior = policy, values, k, margin, prior
        self.stats = {"turns": 0, "moved": 0}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)

    def act(self, conversations: list[Conversation], sampling: SamplingParams | None = None) -> list[Utterance]:
        """The wrapped policy's replies, each replaced by a runner-up its critic rates higher."""
        sampling = sampling or SamplingParams(temperature=0.0)
        out = self.policy.act(conversations, sampling)
        rows = [i for i, u in enumerate(out) if u.action_ids]
        by_stops: dict[tuple[str, ...], list[int]] = {}
        for i in rows:  # alternatives takes one set of stop strings: conversations grouped by theirs
            c = conversations[i]
            by_stops.setdefault(tuple(list(sampling.stop) + format_stops(c.tool_format, c.tools)), []).append(i)
        held = getattr(self.policy, "held_cache", None)  # the greedy reply's cache: its history is not prefilled again
        for stops, group in by_stops.items():
            kw = {"episode_caches": [held(conversations[i]) for i in group]} if held else {}
            alts = self.policy.alternatives([out[i].prompt_ids for i in group], [out[i].action_ids for i in group],
                                            self.k, list(stops), sampling.max_new_tokens, **kw)
            for i, runner_ups in zip(group, alts):
                candidates = [out[i], *(u for u in runner_ups if u.action_ids)]
                values = self.values(out[i].prompt_ids, [u.action_ids for u in candidates])
                best = pick_reply(reply_scores(values, [u.logprobs for u in candidates], self.prior), self.margin)
                self.stats["turns"] += 1
                if best:
                    self.stats["moved"] += 1
                    out[i] = self._play(conversations[i], candidates[best])
        return out

    def _play(self, conv: Conversation, reply: Utterance) -> Utterance:
        """``reply`` as ``conv``'s utterance this turn, recorded in place of the greedy one."""
        chat = self.policy.chat
        chat.prompt_ids(conv)  # asked again with nothing new: the record drops the greedy reply (its ids, its turn)
        span = chat.record(conv, reply.action_ids, reply.logprobs)
        return Utterance(reply.text, list(reply.action_ids), list(reply.logprobs), reply.finish_reason,
                         span=span, record=chat.state(conv).record)


def acting_policy(cfg: ActingConfig, engine: Any, values: ReplyValues) -> CriticGuidedPolicy:
    """The trained actor (``engine`` generates with it) acting with a critic's ``values``."""
    return CriticGuidedPolicy(engine, values, cfg.k, cfg.margin, cfg.prior)


def _check(train_cfg: Any) -> None:
    own = hasattr(train_cfg.rl_trainer(), "reply_values")
    if train_cfg.acting.k and not (own or train_cfg.hierarchy.tasks):
        raise ValueError(f"acting.k={train_cfg.acting.k}: algo={train_cfg.algo} trains no utterance critic to act "
                         "with; use algo=archer, set hierarchy.tasks (a critic of the trained actor), or acting.k=0")


def acting_stage(p: Any) -> None:
    """The trained actor acting with the RL stage's own critic, before the final evaluation (a rerun
    that finds the final evaluation missing redoes both, from the RL stage's checkpoint)."""
    cfg = p.cfg
    if cfg.acting.k and not cfg.hierarchy.tasks and p.trainer is not None and not p.stages.done("eval_final_critic"):
        p.held_out("final_critic", lambda engine: acting_policy(cfg.acting, engine, p.trainer.reply_values))


register_section(Section("acting", ActingConfig, ActingConfig, "the trained actor acting with a critic", check=_check))
register_stage(Stage("acting", 55, acting_stage, "held-out success of the actor acting with its critic"))
