"""``AlfworldEngine``: TextWorld's PDDL engine with ALFWorld's wrappers, and the per-step summary
``ALFWorldEnv`` needs. It runs where ``turngym.envs.engine`` puts it (a child process behind a
deadline by default); its results are small picklable dicts, with the facts reduced to a digest."""

from __future__ import annotations

import hashlib
from typing import Any

_MAX_FEEDBACK_CHARS = 100_000


class AlfworldEngine:
    """One ``textworld.start`` env with ``AlfredDemangler`` and ``AlfredInfos``, reused across games.

    Args:
        infos: ``textworld.EnvInfos`` fields to request, as a dict.
    """

    def __init__(self, infos: dict[str, Any]) -> None:
        self._infos = infos
        self._tw = None

    def load(self, path: str) -> None:
        if self._tw is None:
            import textworld  # heavy: only where the engine runs
            from alfworld.agents.environment.alfred_tw_env import (
                AlfredDemangler,
                AlfredInfos,
            )

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
