"""``AlfworldEngine``: TextWorld's PDDL engine with ALFWorld's wrappers, and the per-step summary
``ALFWorldEnv`` needs. It runs where ``turngym.envs.engine`` puts it (a child process behind a
deadline by default); its results are small picklable dicts, with the facts reduced to a digest.
TextWorld's slow, pure parts run through memos (``memo.py``): a game starts 2-3x faster, and is
reset again in a tenth of the time; a step takes a fraction of it.
"""

from __future__ import annotations

import hashlib
from typing import Any

_MAX_FEEDBACK_CHARS = 100_000


class AlfworldEngine:
    """One ``textworld.start`` env with ``AlfredDemangler`` and ``AlfredInfos``, reused across games.

    Args:
        infos: ``textworld.EnvInfos`` fields to request, as a dict.
        memo: Run TextWorld's translations and parses through ``memo.py``'s memos (for the whole
            process: an engine without them is only plain if no engine of its process had them).
    """

    def __init__(self, infos: dict[str, Any], memo: bool = True) -> None:
        self._infos = infos
        self._memo = memo
        self._tw = None
        self.translations: Any = None

    def load(self, path: str) -> None:
        if self._tw is None:
            import textworld  # heavy: only where the engine runs
            from alfworld.agents.environment.alfred_tw_env import (
                AlfredDemangler,
                AlfredInfos,
            )

            if self._memo:
                from turngym.envs.alfworld import memo

                self.translations = memo.install(replan=bool(self._infos.get("policy_commands")))
            self._tw = textworld.start(path, request_infos=textworld.EnvInfos(**self._infos),
                                       wrappers=[AlfredDemangler(shuffle=False), AlfredInfos])
        else:
            self._tw.load(path)

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
