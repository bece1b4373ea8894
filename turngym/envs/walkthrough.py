"""Shared by the text-game envs (TextWorld, ALFWorld): walkthrough tracking for the oracle, and
the optional admissible-commands observation."""

from __future__ import annotations


class WalkthroughMixin:
    """Needs ``_on_path``, ``_wt_pos``, ``_plan``, ``_key``, ``_gs`` and ``admissible_in_obs``."""

    def _follow_walkthrough(self, cmd: str, key_before: str) -> None:
        # The walkthrough stays the oracle's plan while the agent plays it, or while the agent's
        # own commands leave the world unchanged (look, examine, inventory, a rejected command).
        if not self._on_path:
            return
        if self._wt_pos < len(self._plan) and cmd == self._plan[self._wt_pos]:
            self._wt_pos += 1
        elif self._key != key_before:
            self._on_path = False

    def _with_admissible(self, text: str) -> str:
        if not self.admissible_in_obs:
            return text
        return f"{text}\n\nAdmissible commands: {', '.join(self._gs.get('admissible_commands') or [])}"
