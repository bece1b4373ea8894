"""One turngym episode driven by tool calls that arrive as data, as TRL and OpenEnv send them.

A trainer that renders tools in its own chat template and parses the model's calls itself hands
us ``(name, arguments)``. Each call becomes one ``env.step``: it reaches the env as an assistant
message carrying that call (the env is built with the ``openai`` tool format, which takes calls as
data), so whitelisting, argument validation, rewards, turn limits and error observations are the
env's own. A call the env rejects (unknown tool, bad arguments of any type) is a normal invalid
step. Only a call that cannot be a step at all (no episode yet, the episode is over) is answered
without one; neither ever raises.

The env's opening messages describe its tool-call format for models that read it from the prompt;
that block is cut out here, since the trainer's chat template shows the tools instead.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from turngym.envs.registry import make
from turngym.types import Message, ToolCall, action_valid


def require(module: str, extra: str, what: str) -> Any:
    """Import an optional package, or fail with the pip command that installs it.

    Raises:
        ImportError: ``module`` is not installed; the message names ``turngym[extra]``.
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f'{what} needs the {module!r} package: pip install "turngym[{extra}]"') from e


def registered_spec(env_id: str):
    """Gymnasium's spec of ``env_id``; ``"pkg.module:ns/Name-v0"`` imports ``pkg.module`` first, as ``make`` does."""
    import gymnasium as gym

    module, sep, plain = env_id.rpartition(":")
    if sep:
        importlib.import_module(module)
    return gym.spec(plain)


@dataclass
class CallResult:
    """What one tool call did.

    Args:
        text: The env's observation messages, joined (or the reason no step was taken).
        messages: The env's observation messages (empty when no step was taken).
        reward: The step's reward (0.0 when no step was taken).
        terminated: The task reached an end state.
        truncated: The turn limit (or the env) cut the episode short.
        action_valid: The env's ``info["action_valid"]``; ``False`` when no step was taken.
        stepped: Whether the call became an env step.
        info: The env's step info (empty when no step was taken).
    """

    text: str
    messages: list[Message] = field(default_factory=list)
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    action_valid: bool = False
    stepped: bool = True
    info: dict[str, Any] = field(default_factory=dict)


class ToolCallSession:
    """A turngym env and its current episode, played one tool call at a time.

    Args:
        env_id: A registered id (``"pkg.module:ns/Name-v0"`` imports ``pkg.module`` first).
        max_turns: Override the registered turn limit.
        **env_kwargs: Constructor overrides (``split``, ``step_penalty``, ...).

    Raises:
        ValueError: ``tool_format`` is given: calls arrive as data, so the session picks the format.
    """

    def __init__(self, env_id: str, *, max_turns: int | None = None, **env_kwargs: Any) -> None:
        if "tool_format" in env_kwargs:
            raise ValueError("tool calls arrive as data here, so the env's tool_format is fixed; drop tool_format")
        self.env_id = env_id
        self.env = make(env_id, max_turns=max_turns, tool_format="openai", **env_kwargs)
        self.base = self.env.unwrapped
        self.specs = self.base.tools.specs
        self._format_block = self.base.format.render_tools(self.specs)
        self.task_id: str | None = None
        self.done = True
        self.turn = 0
        self.episode_return = 0.0

    def reset(self, task_id: str | None = None, seed: int | None = None) -> list[Message]:
        """Start an episode and return its opening messages, without the tool-format block.

        Raises:
            KeyError: ``task_id`` is not a task of this env's split.
        """
        options = {"task_id": str(task_id)} if task_id is not None else None
        obs, info = self.env.reset(seed=seed, options=options)
        self.task_id, self.done, self.turn, self.episode_return = str(info["task_id"]), False, 0, 0.0
        return [self._without_format_block(m) for m in obs]

    def call(self, name: Any, arguments: Any) -> CallResult:
        """Send one tool call through ``env.step``; never raises for anything a model can send."""
        if self.task_id is None:
            return CallResult("Error: there is no episode yet; reset the environment first.", stepped=False)
        if self.done:
            return CallResult("Error: the episode is over; no more tool calls are accepted.", stepped=False)
        self.turn += 1
        action = Message("assistant", "", tool_calls=[ToolCall(f"call_{self.turn}", name, arguments)])
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.episode_return += float(reward)
        self.done = bool(terminated or truncated)
        return CallResult(
            text=join(obs), messages=list(obs), reward=float(reward), terminated=bool(terminated),
            truncated=bool(truncated), action_valid=action_valid(info), info=info,
        )

    @property
    def outcome(self) -> float:
        """The episode-level result so far (1.0 = solved)."""
        return float(self.base.outcome())

    def close(self) -> None:
        self.env.close()

    def _without_format_block(self, m: Message) -> Message:
        if not self._format_block or self._format_block not in m.content:
            return m
        content = m.content.replace(self._format_block, "").rstrip()
        return Message(m.role, content, m.tool_calls, m.tool_call_id, m.name)


def join(messages: list[Message]) -> str:
    """Messages' contents as one text, blank-line separated."""
    return "\n\n".join(m.content for m in messages if m.content)
