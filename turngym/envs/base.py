"""``TextEnv``: the Gymnasium contract every turngym environment follows.

An episode is a conversation. ``reset`` returns the opening messages (system prompt, task);
``step(utterance)`` runs the utterance's tool calls through the env's tools and returns the
results as messages. An unparseable or invalid action is a normal step: the agent gets an error
observation and ``info["action_valid"] = False``.

A subclass supplies the task logic through a handful of hooks; the base class owns the
parse / whitelist / validate / dispatch pipeline and info bookkeeping, so every family
behaves the same way at the edges.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium as gym

from turngym.envs.spaces import MessageSpace, UtteranceSpace
from turngym.tools.base import Tool, ToolRegistry
from turngym.tools.formats import ParsedAction, ToolFormat, get_format, run_tools
from turngym.types import Message, ToolCall, ToolResult

@dataclass
class StepOutcome:
    """What a subclass says about one step after its tools ran.

    Args:
        reward: The step's reward (dense or sparse, as the env is configured).
        terminated: The task reached an end state (solved, failed, submitted).
        messages: Extra messages appended after the tool results (e.g. "You won.").
        action_valid: Override the default validity (all calls parsed and ran without error).
        info: Extra JSON-serialisable info for this step (``won``, ``score``, ...).
        truncated_reason: Set when the episode cannot go on for a reason outside the task (its
            engine missed a deadline and was restarted): the step returns ``truncated=True`` and
            ``info["truncated_reason"]``.
    """

    reward: float = 0.0
    terminated: bool = False
    messages: list[Message] = field(default_factory=list)
    action_valid: bool | None = None
    info: dict[str, Any] = field(default_factory=dict)
    truncated_reason: str | None = None


class TextEnv(gym.Env):
    """Base class for multi-turn text environments with tools.

    A subclass must set or implement:
        task_ids: list[str] -- the tasks of this env's split, in a fixed order.
        _build_tools() -> list[Tool] -- the tools the agent may call (called once, in setup).
        _reset_task(task_id) -> list[Message] -- start an episode; return the opening messages.
        _step_outcome(parsed, results) -> StepOutcome -- reward / termination after tools ran.
        state_key() -> str -- a canonical, hashable key of the current state (GiGPO anchors).

    Optional hooks:
        task_type(task_id) -> str -- a group name used in reports (default ``"default"``).
        oracle_action() -> str | None -- the expert's next utterance (walkthrough, gold answer).
        admissible_actions() -> list[str] | None -- valid utterances now, for random agents.
        outcome() -> float -- the episode-level result so far (1.0 = solved; default 0.0).

    Constructor args shared by every env:
        tool_format: ``hermes`` | ``openai`` | ``xml`` | ``text`` (see ``turngym.tools.formats``).
        scripted_hints: also put ``oracle_action`` / ``admissible_actions`` in ``info``; scripted
            agents ask for this, LLM agents never see it.
        expert_labels: label every step's ``info`` with ``expert_action`` (the oracle's move from
            the state the action was taken in) and ``expert_match`` (the action's tool calls equal
            the oracle's; ``None`` when there is no oracle move). For critic diagnostics; one
            ``oracle_action()`` per step.
        invalid_action_penalty: added to the reward of a step whose action was invalid.

    Reset is deterministic given ``seed`` and ``options["task_id"]``. Turn limits come from the
    registry (``max_turns``), which wraps the env in Gymnasium's ``TimeLimit``.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"]}
    default_tool_format: ClassVar[str] = "hermes"
    task_ids: list[str]

    def __init__(
        self,
        *,
        tool_format: str | None = None,
        scripted_hints: bool = False,
        expert_labels: bool = False,
        invalid_action_penalty: float = 0.0,
        render_mode: str | None = None,
    ) -> None:
        self.format: ToolFormat = get_format(tool_format or self.default_tool_format)
        self.scripted_hints = scripted_hints
        self.expert_labels = expert_labels
        self.invalid_action_penalty = invalid_action_penalty
        self.render_mode = render_mode
        self.observation_space = MessageSpace()
        self.action_space = UtteranceSpace()
        self._tools: ToolRegistry | None = None
        self._task_id: str | None = None
        self._turn = 0
        self._transcript: list[Message] = []

    # ----- hooks for subclasses -------------------------------------------------------------
    def _build_tools(self) -> list[Tool]:
        raise NotImplementedError

    def _reset_task(self, task_id: str) -> list[Message]:
        raise NotImplementedError

    def _step_outcome(self, parsed: ParsedAction, results: list[ToolResult]) -> StepOutcome:
        raise NotImplementedError

    def state_key(self) -> str:
        raise NotImplementedError

    def task_type(self, task_id: str) -> str:
        return "default"

    def oracle_action(self) -> str | None:
        return None

    def admissible_actions(self) -> list[str] | None:
        return None

    def outcome(self) -> float:
        return 0.0

    # ----- the contract ---------------------------------------------------------------------
    @property
    def tools(self) -> ToolRegistry:
        """The env's tool registry, built on first use."""
        if self._tools is None:
            self._tools = ToolRegistry(self._build_tools())
        return self._tools

    @property
    def task_id(self) -> str | None:
        return self._task_id

    @property
    def turn(self) -> int:
        return self._turn

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[list[Message], dict]:
        """Start an episode.

        Args:
            seed: Seeds the env's RNG; with the same ``task_id`` the episode replays exactly.
            options: ``{"task_id": ...}`` picks the task; otherwise one is drawn from ``task_ids``.

        Returns:
            The opening messages and an info dict (``task_id``, ``task_type``, ``state_key``, ...).

        Raises:
            KeyError: ``task_id`` is not a task of this env.
        """
        super().reset(seed=seed)
        task_id = (options or {}).get("task_id")
        if task_id is None:
            if not self.task_ids:
                raise RuntimeError(f"{type(self).__name__} has no tasks in this split")
            task_id = self.task_ids[int(self.np_random.integers(len(self.task_ids)))]
        elif str(task_id) not in self.task_ids:
            raise KeyError(f"task {task_id!r} is not in this env's split ({len(self.task_ids)} tasks)")
        self._turn = 0
        self._task_id = str(task_id)
        obs = self._reset_task(self._task_id)
        self._transcript = list(obs)
        info = {
            "task_id": self._task_id,
            "task_type": self.task_type(self._task_id),
            "action_valid": True,
            "state_key": self.state_key(),
            "tool_calls": [],
        }
        self._add_hints(info)
        return obs, info

    def step(self, action: str | Message) -> tuple[list[Message], float, bool, bool, dict]:
        """Run one utterance.

        Args:
            action: The agent's raw utterance (or an assistant ``Message`` for OpenAI tool calls).

        Returns:
            ``(messages, reward, terminated, truncated, info)``. ``info`` holds ``action_valid``,
            ``state_key`` and ``tool_calls`` plus env-specific keys, and ``truncated_reason`` when
            the env cut the episode short. It holds no wall time, so the same seed and actions
            give equal infos (Gymnasium's ``check_env`` compares them); the rollout records each
            step's time in ``Turn.info["elapsed_s"]``.
        """
        if self._task_id is None:
            raise RuntimeError("call reset() before step()")
        expert = self.oracle_action() if self.expert_labels else None  # from the state before the action
        self._turn += 1
        parsed, results = run_tools(action, self.tools, self.format, id_prefix=f"t{self._turn}")
        out = self._step_outcome(parsed, results)
        valid = out.action_valid
        if valid is None:
            valid = bool(parsed.calls) and not any(r.is_error for r in results)
        obs = [self.format.render_result(r) for r in results] + out.messages
        reward = float(out.reward) + (0.0 if valid else self.invalid_action_penalty)
        if self.render_mode == "ansi":
            text = action.content if isinstance(action, Message) else action
            self._transcript += [Message("assistant", str(text)), *obs]
        info = {
            "action_valid": valid,
            "state_key": self.state_key(),
            "tool_calls": [c.to_dict() for c in parsed.calls],
            "outcome": self.outcome(),
            **out.info,
        }
        if out.truncated_reason is not None:
            info["truncated_reason"] = out.truncated_reason
        if self.expert_labels:
            info["expert_action"], info["expert_match"] = expert, self._matches(parsed.calls, expert)
        self._add_hints(info)
        return obs, reward, bool(out.terminated), out.truncated_reason is not None, info

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        return "\n".join(f"[{m.role}] {m.content}" for m in self._transcript)

    def _matches(self, calls: list[ToolCall], expert: str | None) -> bool | None:
        """Whether ``calls`` are the oracle utterance's calls (same names, same arguments; call ids and
        surrounding text aside, string arguments compared with whitespace collapsed)."""
        if expert is None:
            return None
        want = self.format.parse(expert, self.tools).calls
        return bool(want) and _call_keys(calls) == _call_keys(want)

    def _add_hints(self, info: dict) -> None:
        if self.scripted_hints:
            info["oracle_action"] = self.oracle_action()
            info["admissible_actions"] = self.admissible_actions()


def _call_keys(calls: list[ToolCall]) -> list[tuple]:
    return [(c.name, {k: " ".join(v.split()) if isinstance(v, str) else v for k, v in c.arguments.items()}) for c in calls]
