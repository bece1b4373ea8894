"""``TextWorldEnv``: TextWorld games played through one ``act(command)`` tool.

The game runs in TextWorld's own engine (Jericho for the ``.z8`` story file, plus TextWorld's
state tracking from the game's ``.json``). Each ``act`` call sends one command; its tool result is
the game's reply, cleaned of the interpreter's prompt and status line. Scores, win and loss come
from the engine; ``state_key`` hashes the set of logical facts that hold in the world, so the same
state reached by different paths gets the same key.

Jericho is C code called in-process, and some inputs loop in it forever (see ``check_command``).
So the engine runs in a child process (``turngym.envs.engine``) and every step's engine calls share
a deadline (``engine_deadline_s``): an engine that misses it is killed and restarted, and the
episode ends as truncated with ``info["truncated_reason"]``.
"""

from __future__ import annotations

import re
from typing import Any

from turngym.envs.base import StepOutcome, TextEnv
from turngym.envs.engine import EngineBacked
from turngym.envs.textworld.games import GameRecord, ensure_games, get_suite, split_dir
from turngym.envs.walkthrough import WalkthroughMixin
from turngym.tools.base import Tool
from turngym.tools.formats import ParsedAction
from turngym.types import Message, ToolCall, ToolResult

MAX_COMMAND_CHARS = 200  # the story file's input buffer is smaller; longer text is never a command

SYSTEM_PROMPT = (
    "You are playing a text adventure game. Read the task and what the game says, then send game "
    "commands one at a time, such as 'go north', 'open door', 'take coin' or 'look'. {how}"
)
_HOW = {
    "text": "Reply with exactly one game command per turn, on a single line, and nothing else.",
    "default": "Send each command by calling the `act` tool, one call per turn.",
}

# Inform 7 replies meaning the command was not understood, named nothing in reach, or went
# nowhere: the step is a no-op the agent should learn to avoid (info["action_valid"] = False).
_REJECTED = re.compile(
    r"(That's not a verb I recognise|You can't see any such thing|I didn't understand|"
    r"I only understood you as far as|I beg your pardon|You can't go that way|"
    r"You have to be more specific|You seem to have said too little|You must name something more|"
    r"You can't use multiple objects|You can only use multiple objects|You excepted something|"
    r"I'm not sure what .* refers to|That noun did not make sense|You'll have to say which)"
)
# Game-system verbs that would desynchronise the engine from TextWorld's state tracking
# (restart, undo, restore) or leave the game waiting on a yes/no question (quit).
_META_VERBS = frozenset(
    "save restore restart quit q undo script unscript noscript transcript verify version".split()
)
_CLAUSES = re.compile(r"[.,;!?]|\bthen\b")
_END_PROMPT = "Would you like to RESTART, RESTORE a saved game, QUIT or UNDO the last command?"
_BANNER = re.compile(r"^[ _|$\\/<>]*$")
_BLANK_LINES = re.compile(r"\n\s*\n\s*")  # starts with a literal, so the scan is fast


def clean_feedback(text: str, objective: str | None = None) -> str:
    """The game's reply without the interpreter's prompt, status line and title banner.

    Args:
        text: Raw feedback from the engine.
        objective: The game's objective; the intro is cut to start there (dropping the banner).

    Returns:
        The text with every run of blank lines (and the indent after it) made one blank line.
    """
    prompt = text.rfind("\n>")  # the interpreter's prompt, then its status line, end the text
    if prompt >= 0 and "\n" not in text[prompt + 2 :]:
        text = text[:prompt]
    if "***" in text:
        text = text.replace(_END_PROMPT, "")
    if objective is not None:
        start = text.find(objective) if objective else -1
        if start > 0:
            text = text[start:]
        else:  # an intro without the objective in it: drop the banner's lines
            lines = text.split("\n")
            while lines and _BANNER.match(lines[0]):
                lines.pop(0)
            text = "\n".join(lines)
    return _BLANK_LINES.sub("\n\n", text).strip()


def normalize_command(command: str) -> str:
    """Lower-case, single-spaced, printable: what the engine sees and what walkthroughs compare."""
    if not command.isprintable():
        command = "".join(ch if ch.isprintable() else " " for ch in command)
    return " ".join(command.lower().split())


def check_command(command: str) -> str | None:
    """Why ``command`` (normalized) must not be sent to the game, or ``None`` if it may.

    Refused: empty or over-long text, game-system verbs (``_META_VERBS``, TextWorld's ``tw-*``
    hooks), and any backslash. The backslash is the interpreter's own escape character (Jericho's
    dumb-frotz front end), not the game's: a line that starts with one is an interpreter command
    (``\\help``, ``\\s``, ``\\t``, ...) that Jericho re-reads forever, some of them printing at
    hundreds of MB/s; inside a line, escapes such as ``\\_`` (return) end the line early and queue
    the rest (say, ``restart``) as the next input, past these checks. No game command needs one.
    """
    if not command:
        return "the command is empty; send a game command such as 'look'"
    if len(command) > MAX_COMMAND_CHARS:
        return f"the command is {len(command)} characters long; game commands are short (limit {MAX_COMMAND_CHARS})"
    if "\\" in command:
        return "a backslash is the interpreter's escape character, not part of a game command; remove it"
    clauses = _CLAUSES.split(command) if _CLAUSES.search(command) else (command,)
    for clause in clauses:
        verb = clause.split(None, 1)[0] if clause.strip() else ""
        if verb in _META_VERBS or verb.startswith("tw-"):
            return f"'{verb}' is a game-system command and is disabled; send an in-game command"
    return None


class TextWorldEnv(EngineBacked, WalkthroughMixin, TextEnv):
    """TextWorld text adventures (coin collector, treasure hunter, cooking) on an easy/medium/hard ladder.

    Args:
        level: ``easy`` | ``medium`` | ``hard`` (see ``turngym.envs.textworld.games.SUITES``).
        split: ``train`` | ``test``; the splits' games are generated from disjoint seed ranges.
        num_games: Games in this split (default: the suite's default); the first games of a
            fixed sequence, generated on first use and cached.
        reward: ``dense`` (score gained this turn / max score) or ``sparse`` (1.0 on the winning turn).
        admissible_in_obs: Append the currently admissible commands to every observation.
        cache_dir: Game cache folder (default ``$TURNGYM_CACHE/textworld``).
        engine_deadline_s: Time one step's engine calls may take together; the engine runs in a
            child process that is killed and restarted when it misses this. ``None`` runs the
            engine in-process without a deadline (a hang then hangs the caller).
        **kw: ``TextEnv`` arguments (``tool_format``, ``scripted_hints``, ...).

    Raises:
        ValueError: an unknown level, split or reward setting.
    """

    def __init__(
        self,
        level: str = "easy",
        split: str = "train",
        num_games: int | None = None,
        reward: str = "dense",
        admissible_in_obs: bool = False,
        cache_dir: str | None = None,
        engine_deadline_s: float | None = 10.0,
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        if reward not in ("dense", "sparse"):
            raise ValueError(f"reward must be 'dense' or 'sparse', got {reward!r}")
        self.level, self.split, self.reward_mode = level, split, reward
        self.admissible_in_obs = admissible_in_obs
        self.suite = get_suite(level)
        self.games: list[GameRecord] = ensure_games(level, split, num_games, cache_dir)
        self._folder = split_dir(level, split, cache_dir)
        self._by_id = {g.task_id: g for g in self.games}
        self.task_ids = [g.task_id for g in self.games]
        # Admissible commands and winning-policy tracking cost ~30% of a step: ask only when used.
        self._want_admissible = bool(self.scripted_hints or admissible_in_obs)
        self._setup_engine({"infos": self._infos()}, engine_deadline_s)
        self._record: GameRecord | None = None
        self._gs: dict = {}
        self._score, self._won, self._lost, self._key, self._game_code = 0, False, False, "", 0

    # ----- engine ---------------------------------------------------------------------------
    engine_target = "turngym.envs.textworld.engine:TextWorldEngine"
    engine_preload = ("textworld", "turngym.envs.textworld.engine")  # engines fork from a warm server

    def _infos(self) -> dict[str, bool]:
        return {"score": True, "won": True, "lost": True, "facts": True, "moves": True,
                "admissible_commands": self._want_admissible, "policy_commands": self.scripted_hints}

    def request_infos(self):
        """The ``textworld.EnvInfos`` this env asks the engine for (the benchmark reuses it)."""
        from textworld import EnvInfos

        return EnvInfos(**self._infos())

    def _observe(self, gs: dict) -> None:
        self._gs = gs
        self._score, self._won, self._lost = gs["score"], gs["won"], gs["lost"]
        # The engine sums the facts' digests; adding the game's code keeps different games' keys apart.
        self._key = f"{(gs['facts_sum'] + self._game_code) & 0xFFFFFFFFFFFFFFFF:016x}"

    # ----- TextEnv hooks --------------------------------------------------------------------
    def _build_tools(self) -> list[Tool]:
        params = {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "the game command, e.g. 'open door'"}},
            "required": ["command"],
            "additionalProperties": False,
        }
        # No tool timeout: an alarm cannot interrupt the engine's C code; its deadline is enforced
        # around the engine's child process instead (``EngineBacked``).
        return [Tool("act", "Send one text command to the game, e.g. 'go north' or 'take coin'.",
                     params, self._act, timeout_s=None)]

    def _reset_task(self, task_id: str) -> list[Message]:
        self._record = self._by_id[task_id]
        self._game_code = int(self._record.content_hash[:16], 16)  # keys of different games differ
        gs = self._engine_reset(str(self._folder / self._record.file))
        self._observe(gs)
        self._turn_score, self._turn_won = self._score, False
        self._wt_pos, self._on_path, self._rejected = 0, True, False
        self._plan = [normalize_command(c) for c in self._record.walkthrough]
        intro = clean_feedback(gs["feedback"], self._record.objective)
        how = _HOW["text"] if self.format.name == "text" else _HOW["default"]
        return [Message("system", SYSTEM_PROMPT.format(how=how)), Message("user", self._with_admissible(intro))]

    def _act(self, command: str) -> str:
        if self._won or self._lost:
            raise RuntimeError("the game is over; no more commands are accepted")
        cmd = normalize_command(command)
        problem = check_command(cmd)
        if problem:
            raise ValueError(problem)
        key_before = self._key
        gs = self._engine_step("step", cmd)
        self._observe(gs)
        text = clean_feedback(gs["feedback"])
        if _REJECTED.search(text):
            self._rejected = True
        self._follow_walkthrough(cmd, key_before)
        return self._with_admissible(text) if not (self._won or self._lost) else text

    def _step_outcome(self, parsed: ParsedAction, results: list[ToolResult]) -> StepOutcome:
        if self.reward_mode == "dense":
            reward = (self._score - self._turn_score) / max(1, self._record.max_score)
        else:
            reward = float(self._won and not self._turn_won)
        valid = bool(parsed.calls) and not self._rejected and not any(r.is_error for r in results)
        self._turn_score, self._turn_won, self._rejected = self._score, self._won, False
        info = {"won": self._won, "lost": self._lost, "score": self._score, "max_score": self._record.max_score}
        return StepOutcome(reward=reward, terminated=self._won or self._lost, action_valid=valid, info=info,
                           truncated_reason=self._cut_reason)

    def state_key(self) -> str:
        return self._key

    def task_type(self, task_id: str) -> str:
        return self._by_id[task_id].task_type

    def task_group(self, task_id: str) -> str:
        """A finer report group than ``task_type``: the challenge's level when it has one (e.g.
        ``coin-L3``; coin-collector levels above 100 add dead-end side rooms)."""
        rec = self._by_id[task_id]
        level = rec.settings.get("level")
        return rec.task_type if level is None else f"{rec.task_type}-L{level}"

    def outcome(self) -> float:
        return 1.0 if self._won else 0.0

    def oracle_action(self) -> str | None:
        cmd = self._oracle_command()
        return None if cmd is None else self.format.render_call(ToolCall("oracle", "act", {"command": cmd}))

    def _oracle_command(self) -> str | None:
        if self._won or self._lost:
            return None
        wt = self._record.walkthrough
        if self._on_path and self._wt_pos < len(wt):
            return wt[self._wt_pos]
        policy = self._gs.get("policy_commands") or []  # the engine's plan from this state
        return policy[0] if policy else None

    def admissible_actions(self) -> list[str] | None:
        if not self._want_admissible:
            return None
        render = self.format.render_call
        return [render(ToolCall("admissible", "act", {"command": c})) for c in self._gs.get("admissible_commands") or []]

    def walkthrough(self, task_id: str | None = None) -> list[str]:
        """The expert command sequence that wins ``task_id`` (default: the current task).

        Raises:
            KeyError: ``task_id`` is not in this split.
        """
        return list(self._by_id[task_id or self._task_id].walkthrough)

    def close(self) -> None:
        self._close_engine()
        super().close()
