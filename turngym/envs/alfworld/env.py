"""``ALFWorldEnv``: ALFWorld household tasks as text games, through TextWorld's PDDL engine.

Games are ``game.tw-pddl`` files played with ``textworld.start`` and ALFWorld's own wrappers
(``AlfredDemangler`` gives objects their readable names, ``AlfredInfos`` records the game file).
The agent sends one command per turn through the ``act`` tool. The reward is 1.0 on the winning
turn; ``state_key`` hashes the world's facts; the walkthrough is the oracle's plan (and SFT
data). Each observation ends with the admissible commands (``observe.py``: compact by default,
``admissible="all"`` as ALFWorld lists them, ``"none"``).

The engine runs in a child process (``turngym.envs.engine``), forked from a server that imported
TextWorld once: every step's engine calls share a deadline (``engine_deadline_s``), and an engine
that misses it is killed and restarted, which ends the episode as truncated. Commands with a
backslash are refused as in ``TextWorldEnv``: the PDDL engine only matches whole commands, so none
can be valid, and both text-game families keep one contract.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from turngym.envs.alfworld.games import AlfworldGame, alfworld_root, list_games
from turngym.envs.alfworld.observe import ADMISSIBLE_STYLES, admissible_text, room_places, system_prompt
from turngym.envs.base import StepOutcome, TextEnv
from turngym.envs.engine import EngineBacked
from turngym.envs.walkthrough import WalkthroughMixin
from turngym.tools.base import Tool
from turngym.tools.formats import ParsedAction
from turngym.types import Message, ToolCall, ToolResult

_BANNER = "-= Welcome to TextWorld, ALFRED! =-"
_NOTHING = "Nothing happens."  # ALFWorld's reply to a command that does not apply
MAX_COMMAND_CHARS = 200
MAX_TURNS = 50  # ALFWorld's own limit, and verl-agent's and GiGPO's for the text games


def normalize_command(command: str) -> str:
    """Lower-case, single-spaced, printable (how ALFWorld's grammar writes commands)."""
    return " ".join("".join(ch if ch.isprintable() else " " for ch in command).lower().split())


class ALFWorldEnv(EngineBacked, WalkthroughMixin, TextEnv):
    """ALFWorld: six kinds of household tasks (pick, look, clean, heat, cool, pick two) as text games.

    Args:
        split: ``train``, ``valid_seen``, ``valid_unseen`` or ``test`` (= ``valid_seen``, the
            in-distribution eval split; ask for ``valid_unseen`` by name).
        data_dir: A local ALFWorld copy (default: ``$TURNGYM_DATA/alfworld`` or the download cache).
        max_games: Keep only the first N games of the split (in ``order``).
        task_types: Keep only these task types.
        order: ``mixed`` (task types in turn, a fixed shuffle within each: the first N games cover
            every type) or ``id`` (sorted by task id, which groups the types).
        exclude_eval_tasks: Leave out the training games whose task (type, object, receptacle and
            room) an eval split also holds (``games.py``); ``None``: for ``train`` only.
        admissible: How observations end: ``compact`` (the admissible commands, folded, and only
            when they changed; ``observe.py``), ``all`` (every admissible command at every step, as
            ALFWorld lists them) or ``none``.
        replan: When the agent leaves the walkthrough, ask the planner for a new plan every turn
            (slow; only the oracle needs it).
        engine_deadline_s: Time one step's engine calls may take together (the engine runs in a
            child process, killed and restarted when it misses this); ``None`` runs it in-process
            without a deadline.
        **kw: ``TextEnv`` arguments (``tool_format``, ``scripted_hints``, ...).

    Raises:
        turngym.data.DataNotFound: No ALFWorld data (run ``turngym data download alfworld``).
        ValueError: an unknown ``admissible`` or ``order``.
    """

    def __init__(self, split: str = "train", data_dir: str | None = None, max_games: int | None = None,
                 task_types: list[str] | None = None, order: str = "mixed", exclude_eval_tasks: bool | None = None,
                 admissible: str = "compact", replan: bool = False, engine_deadline_s: float | None = 30.0,
                 **kw: Any) -> None:
        super().__init__(**kw)
        if admissible not in ADMISSIBLE_STYLES:
            raise ValueError(f"admissible must be one of {', '.join(ADMISSIBLE_STYLES)}, got {admissible!r}")
        self.split = split
        self.root: Path = alfworld_root(data_dir)
        exclude = split == "train" if exclude_eval_tasks is None else exclude_eval_tasks
        games = list_games(self.root, split, exclude_eval_tasks=exclude, order=order)
        if task_types:
            games = [g for g in games if g.task_type in set(task_types)]
        self.games: list[AlfworldGame] = games[:max_games] if max_games else games
        self._by_id = {g.task_id: g for g in self.games}
        self.task_ids = [g.task_id for g in self.games]
        self.admissible, self.replan = admissible, replan
        self.admissible_in_obs = admissible != "none"
        self._setup_engine({"infos": self._infos()}, engine_deadline_s)
        self._game: AlfworldGame | None = None
        self._gs: dict = {}
        self._won, self._turn_won, self._rejected = False, False, False
        self._plan: list[str] = []
        self._places: tuple[str, ...] = ()
        self._shown: list[str] | None = None  # the admissible commands the agent was last shown
        self._wt_pos, self._on_path, self._key = 0, True, ""

    # ----- engine ---------------------------------------------------------------------------
    engine_target = "turngym.envs.alfworld.engine:AlfworldEngine"
    # engines fork from a server that imported these once (about 2 s and 100 MB an engine otherwise)
    engine_preload = ("textworld", "alfworld.agents.environment.alfred_tw_env", "turngym.envs.alfworld.engine")

    def _infos(self) -> dict[str, Any]:
        return {"won": True, "facts": True, "extras": ["walkthrough"],
                "admissible_commands": bool(self.scripted_hints or self.admissible_in_obs),
                "policy_commands": bool(self.replan)}

    def request_infos(self):
        """The ``textworld.EnvInfos`` asked of the engine (admissible commands only when used)."""
        from textworld import EnvInfos

        return EnvInfos(**self._infos())

    def _observe(self, gs: dict) -> None:
        self._gs = gs
        self._won = gs["won"]
        self._key = f"{self._game.task_id}:{gs['facts_digest']}"

    # ----- TextEnv hooks --------------------------------------------------------------------
    def _build_tools(self) -> list[Tool]:
        params = {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "one command, e.g. 'go to desk 1'"}},
            "required": ["command"],
            "additionalProperties": False,
        }
        # No tool timeout: the engine's deadline is enforced around its child process (``EngineBacked``).
        return [Tool("act", "Send one command to the household, e.g. 'go to desk 1' or 'take mug 1 from desk 1'.",
                     params, self._act, timeout_s=None)]

    def _reset_task(self, task_id: str) -> list[Message]:
        game = self._by_id.get(task_id)
        if game is None:
            raise KeyError(f"unknown ALFWorld game {task_id!r} in split {self.split!r}")
        self._game = game
        gs = self._engine_reset(str(game.path))
        self._observe(gs)
        self._turn_won, self._rejected = False, False
        self._plan = [normalize_command(c) for c in gs["walkthrough"]]
        self._wt_pos, self._on_path = 0, True
        self._places, self._shown = room_places(gs["admissible_commands"]), None
        intro = gs["feedback"].replace(_BANNER, "").strip()
        return [Message("system", system_prompt(self.format.name, self.admissible)),
                Message("user", self._with_admissible(intro))]

    def _with_admissible(self, text: str) -> str:
        commands = list(self._gs.get("admissible_commands") or [])
        line = admissible_text(commands, self.admissible, self._places, self._shown)
        self._shown = commands
        return f"{text}\n\n{line}" if line else text

    def _act(self, command: str) -> str:
        if self._won:
            raise RuntimeError("the task is already done; no more commands are accepted")
        cmd = normalize_command(command)
        if not cmd:
            raise ValueError("the command is empty; send one such as 'look'")
        if len(cmd) > MAX_COMMAND_CHARS:
            raise ValueError(f"the command is {len(cmd)} characters long; commands are short (limit {MAX_COMMAND_CHARS})")
        if "\\" in cmd:
            raise ValueError("a backslash is an interpreter escape character, not part of a command; remove it")
        key_before = self._key
        gs = self._engine_step("step", cmd)
        self._observe(gs)
        text = (gs.get("feedback") or "").strip()
        self._rejected = text == _NOTHING
        self._follow_walkthrough(cmd, key_before)
        return text if self._won else self._with_admissible(text)

    def _step_outcome(self, parsed: ParsedAction, results: list[ToolResult]) -> StepOutcome:
        reward = float(self._won and not self._turn_won)
        valid = bool(parsed.calls) and not self._rejected and not any(r.is_error for r in results)
        self._turn_won, self._rejected = self._won, False
        return StepOutcome(reward=reward, terminated=self._won, action_valid=valid, info={"won": self._won},
                           truncated_reason=self._cut_reason)

    def state_key(self) -> str:
        return self._key

    def task_type(self, task_id: str) -> str:
        return self._by_id[task_id].task_type

    def task_content(self, task_id: str) -> str:
        """What a game is about, beyond its id: its task folder (type, object, receptacle and room),
        which ALFWorld's trials of one task share. Two splits are disjoint in content when no
        ``task_content`` of one is one of the other's (``games.py``)."""
        return self._by_id[task_id].task

    def outcome(self) -> float:
        return 1.0 if self._won else 0.0

    def walkthrough(self) -> list[str]:
        """The expert plan of the current game, from its start (for SFT data)."""
        return list(self._plan)

    def oracle_actions(self) -> list[str]:
        """Every distinct reply the oracle's walkthroughs send in this split, rendered in the env's
        tool format, longest first: what a reply cap must fit (read from the game files, no game is
        played)."""
        commands = {normalize_command(c) for g in self.games for c in g.plan}
        replies = {self.format.render_call(ToolCall("oracle", "act", {"command": c})) for c in commands}
        return sorted(replies, key=lambda r: (-len(r), r))

    def oracle_action(self) -> str | None:
        cmd = self._oracle_command()
        return None if cmd is None else self.format.render_call(ToolCall("oracle", "act", {"command": cmd}))

    def _oracle_command(self) -> str | None:
        if self._won or self._game is None:
            return None
        if self._on_path and self._wt_pos < len(self._plan):
            return self._plan[self._wt_pos]
        policy = self._gs.get("policy_commands") or []  # the planner's plan from here (replan=True)
        return policy[0] if policy else None

    def admissible_actions(self) -> list[str] | None:
        cmds = self._gs.get("admissible_commands")
        if self._won or not cmds:
            return None
        return [self.format.render_call(ToolCall("a", "act", {"command": c})) for c in cmds]

    def close(self) -> None:
        self._close_engine()
        super().close()
