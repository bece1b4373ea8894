"""``TextWorldEngine``: TextWorld's engine and the per-step summary ``TextWorldEnv`` needs.

It runs where ``turngym.envs.engine`` puts it: in a child process behind a deadline (the default),
or in-process. Its results are small, picklable dicts, so a step crosses the process boundary
cheaply; the world's facts are reduced to one order-free 64-bit sum here, next to the engine that
owns the fact objects.
"""

from __future__ import annotations

import hashlib
import warnings
from typing import Any

_MAX_FACT_CODES = 100_000
_MAX_FEEDBACK_CHARS = 100_000  # a reply longer than this is noise; the tool result is cut far shorter


class TextWorldEngine:
    """One ``textworld.start`` env, reused across games.

    Args:
        infos: ``textworld.EnvInfos`` fields to request (``score``, ``facts``, ...), as a dict.
    """

    def __init__(self, infos: dict[str, Any]) -> None:
        self._infos = infos
        self._tw = None
        self._fact_codes: dict[int, int] = {}
        self._fact_refs: list[Any] = []
        self._moves: int | None = None
        self._facts_sum = 0

    def load(self, path: str) -> None:
        with warnings.catch_warnings():
            # Jericho warns that TextWorld's story files are not in its own list of known games;
            # TextWorld tracks score and state itself, so nothing is lost.
            warnings.filterwarnings("ignore", message=".*not fully supported")
            if self._tw is None:
                import textworld  # heavy: only where the engine runs

                self._tw = textworld.start(path, textworld.EnvInfos(**self._infos))
            else:
                self._tw.load(path)
        if len(self._fact_codes) > _MAX_FACT_CODES:  # shared across games; keep it bounded
            self._fact_codes.clear()
            self._fact_refs.clear()

    def reset(self) -> dict[str, Any]:
        """The opening state's summary (see ``step``)."""
        self._moves = None
        return self._summary(self._tw.reset())

    def step(self, command: str) -> dict[str, Any]:
        """Send one command; returns ``feedback``, ``score``, ``won``, ``lost``, ``facts_sum``,
        ``admissible_commands`` and ``policy_commands`` (the last two empty unless requested)."""
        gs, _, _ = self._tw.step(command)
        return self._summary(gs)

    def close(self) -> None:
        if self._tw is not None:
            self._tw.close()
            self._tw = None

    def _summary(self, gs: dict) -> dict[str, Any]:
        # "moves" counts the actions the state tracker applied: when it has not moved, the facts
        # have not changed (look, examine, a rejected command) and the sum stands.
        moves = gs.get("moves")
        if moves is None or moves != self._moves:
            self._moves = moves
            # "_facts" holds the tracker's own fact objects, which persist from step to step;
            # "facts" (renamed copies, new each step) is the fallback.
            facts = gs.get("_facts")
            self._facts_sum = self._sum_facts(facts if facts is not None else gs.get("facts") or ())
        return {
            "feedback": (gs.get("feedback") or "")[:_MAX_FEEDBACK_CHARS],
            "score": int(gs.get("score") or 0),
            "won": bool(gs.get("won")),
            "lost": bool(gs.get("lost")),
            "facts_sum": self._facts_sum,
            "admissible_commands": list(gs.get("admissible_commands") or []),
            "policy_commands": list(gs.get("policy_commands") or []),
        }

    def _sum_facts(self, facts) -> int:
        # An order-free hash of the fact set: stable 64-bit digests, summed. Fact objects carry a
        # Python-level __hash__, slow in a dict; so digests are memoised by id(), and the memo
        # keeps each fact alive, which keeps its id from being reused by another.
        codes = self._fact_codes
        try:
            return sum(map(codes.__getitem__, map(id, facts)))  # the common case, in C
        except KeyError:
            total = 0
            for f in facts:
                c = codes.get(id(f))
                if c is None:
                    c = codes[id(f)] = int.from_bytes(hashlib.blake2b(str(f).encode(), digest_size=8).digest(), "big")
                    self._fact_refs.append(f)
                total += c
            return total
