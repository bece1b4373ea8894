"""A small user-style env, defined outside the package, as a user would write one."""

from __future__ import annotations

import turngym
from turngym.envs import StepOutcome, TextEnv
from turngym.tools import Tool
from turngym.types import Message


class GuessEnv(TextEnv):
    """Guess a secret number between 1 and 8 with a `guess` tool."""

    def __init__(self, n_tasks: int = 4, crash_on: int | None = None, hang_on: int | None = None,
                 raise_on: int | None = None, **kw):
        super().__init__(**kw)
        self.task_ids = [str(i) for i in range(1, n_tasks + 1)]
        self.crash_on, self.hang_on, self.raise_on = crash_on, hang_on, raise_on

    def _build_tools(self):
        def guess(number: int) -> str:
            """Guess the secret number.

            Args:
                number: your guess, 1 to 8
            """
            if number == self.crash_on:
                raise SystemExit(3)  # simulates a hard crash of the env process
            if number == self.raise_on:  # a bug in the env itself, not in a tool: escapes the tool layer
                self._explode = True
            if number == self.hang_on:
                import time
                time.sleep(3600)
            self._last = number
            if number == self.secret:
                return "correct!"
            return "higher" if number < self.secret else "lower"

        return [Tool.from_function(guess, timeout_s=None)]

    def _reset_task(self, task_id):
        self.secret, self._last = int(task_id), None
        return [Message("system", "Find the number."), Message("user", "Guess a number from 1 to 8.")]

    def _step_outcome(self, parsed, results):
        if getattr(self, "_explode", False):
            raise RuntimeError("env bug")
        won = self._last == self.secret
        return StepOutcome(reward=float(won), terminated=won, info={"won": won})

    def outcome(self):
        return float(self._last == self.secret)

    def state_key(self):
        return f"{self.task_id}:{self._last}"

    def oracle_action(self):
        return self.format.render_call(turngym.ToolCall("c", "guess", {"number": self.secret}))

    def admissible_actions(self):
        return [self.format.render_call(turngym.ToolCall("c", "guess", {"number": i})) for i in range(1, 9)]


turngym.register("tests/Guess-v0", entry_point="toy_envs:GuessEnv", max_turns=5)
