"""``AlfworldEngine``: TextWorld's PDDL engine with ALFWorld's wrappers, and the per-step summary
``ALFWorldEnv`` needs. It runs where ``turngym.envs.engine`` puts it (a child process behind a
deadline by default); its results are small picklable dicts, with the facts reduced to a digest.

Starting a game is the slow part of ALFWorld: TextWorld translates the game's PDDL to a planning
task (``fast_downward.pddl2sas``) twice when it loads a game and twice again on every reset (once
as is, once optimized for its replanner), about 0.5-1.5 s each on one core. The translation is a
pure function of the domain and problem texts, so this engine keeps the latest results
(``_TranslationMemo``): a reset after a load, and every later reset of the same game (a group
replaying one game, a branch replaying a prefix), translate nothing. The optimized translation only
serves TextWorld's replanner; without ``replan`` the plain one stands in for it (the walkthrough
comes from the game file, so the replanner is never asked).
"""

from __future__ import annotations

import hashlib
from typing import Any

_MAX_FEEDBACK_CHARS = 100_000


class _TranslationMemo:
    """``fast_downward.pddl2sas`` with its latest results kept, keyed by the texts it translates."""

    def __init__(self, translate: Any, optimize_for_replan: bool, size: int = 4) -> None:
        self.translate, self.optimize_for_replan, self.size = translate, optimize_for_replan, size
        self.results: dict[tuple, Any] = {}
        self.calls = self.misses = 0

    def __call__(self, domain: str, problem: str, verbose: bool = False, optimize: bool = False) -> Any:
        self.calls += 1
        optimize = optimize and self.optimize_for_replan
        key = (domain, problem, optimize)
        if key not in self.results:
            self.misses += 1
            if len(self.results) >= self.size:
                self.results.pop(next(iter(self.results)))  # the oldest game's
            self.results[key] = self.translate(domain, problem, verbose=verbose, optimize=optimize)
        return self.results[key]


class AlfworldEngine:
    """One ``textworld.start`` env with ``AlfredDemangler`` and ``AlfredInfos``, reused across games.

    Args:
        infos: ``textworld.EnvInfos`` fields to request, as a dict.
        memo: Keep the PDDL translations of the latest games (see the module docstring).
    """

    def __init__(self, infos: dict[str, Any], memo: bool = True) -> None:
        self._infos = infos
        self._memo = memo
        self._tw = None
        self.translations: _TranslationMemo | None = None

    def load(self, path: str) -> None:
        if self._tw is None:
            import textworld  # heavy: only where the engine runs
            from alfworld.agents.environment.alfred_tw_env import (
                AlfredDemangler,
                AlfredInfos,
            )

            if self._memo:
                self._install_memo()
            self._tw = textworld.start(path, request_infos=textworld.EnvInfos(**self._infos),
                                       wrappers=[AlfredDemangler(shuffle=False), AlfredInfos])
        else:
            self._tw.load(path)

    def _install_memo(self) -> None:
        import fast_downward
        from textworld.envs.pddl import logic as pddl_logic

        original = getattr(fast_downward.pddl2sas, "translate", fast_downward.pddl2sas)
        self.translations = _TranslationMemo(original, optimize_for_replan=bool(self._infos.get("policy_commands")))
        # TextWorld's PddlState calls ``fast_downward.pddl2sas`` through the module: this process only
        fast_downward.pddl2sas = pddl_logic.fast_downward.pddl2sas = self.translations

    def reset(self) -> dict[str, Any]:
        """The opening state's summary (see ``step``) plus ``walkthrough``, the expert plan."""
        gs = self._tw.reset()
        return {**self._summary(gs), "walkthrough": list(gs.get("extra.walkthrough") or [])}

    def step(self, command: str) -> dict[str, Any]:
        """Send one command; returns ``feedback``, ``won``, ``facts_digest``,
        ``admissible_commands`` and ``policy_commands`` (the last two empty unless requested)."""
        gs, _, _ = self._tw.step(command)
        return self._summary(gs)

    def translation_stats(self) -> dict[str, int]:
        """PDDL translations asked for and actually run (both 0 without the memo)."""
        t = self.translations
        return {"calls": t.calls, "misses": t.misses} if t is not None else {"calls": 0, "misses": 0}

    def close(self) -> None:
        if self._tw is not None:
            try:
                self._tw.close()
            except Exception:
                pass  # closing a finished game is best effort
            self._tw = None

    def _summary(self, gs: dict) -> dict[str, Any]:
        facts = sorted(map(str, gs.get("facts") or ()))
        return {
            "feedback": (gs.get("feedback") or "")[:_MAX_FEEDBACK_CHARS],
            "won": bool(gs.get("won")),
            "facts_digest": hashlib.blake2b("\n".join(facts).encode(), digest_size=8).hexdigest(),
            "admissible_commands": list(gs.get("admissible_commands") or []),
            "policy_commands": list(gs.get("policy_commands") or []),
        }
