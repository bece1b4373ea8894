"""turngym envs over OpenEnv's protocol (``turngym openenv ENV_ID``; ``pip install "turngym[openenv]"``).

Everything on the wire is openenv-core's own: its ``create_app`` server (HTTP ``/reset``,
``/step``, ``/state``, ``/schema``, ``/health``, and a WebSocket ``/ws`` that holds one env per
client session) and its ``EnvClient``. This module only supplies what every OpenEnv environment
supplies, the env and its types:

- the action is OpenEnv's ``CallToolAction`` (``tool_name``, ``arguments``), with both fields
  accepting any JSON so a malformed call reaches the env, which answers it with an error
  observation, as in a rollout (a payload with unknown fields is not a call: OpenEnv's server
  answers it with its own validation error and the session goes on);
- the observation carries the env's messages (``text`` and ``messages``), ``reward``, ``done``,
  ``action_valid``, ``truncated``, ``outcome``, ``episode_return``, ``turn``, and, after a reset,
  the env's ``tools`` as OpenEnv ``Tool`` specs;
- ``reset(task_id=..., seed=...)`` picks the task; each tool call is one ``env.step``.

A call that cannot be a step (no episode yet, the episode is over) comes back as an observation
with ``error`` set and no step taken.

openenv-core is pinned below 0.3: 0.3 requires gradio, whose releases all need pillow < 13.
"""

from __future__ import annotations

import json
import sys
import uuid
from typing import Any, ClassVar

from turngym.envs.registry import describe
from turngym.integrations.session import ToolCallSession, join, require

require("openenv", "openenv", "turngym.integrations.openenv")

from openenv.core.client_types import StepResult  # noqa: E402
from openenv.core.env_client import EnvClient  # noqa: E402
from openenv.core.env_server import CallToolAction, Environment, Observation, State, Tool, create_app  # noqa: E402
from openenv.core.env_server.types import EnvironmentMetadata  # noqa: E402
from pydantic import Field  # noqa: E402


class TurngymAction(CallToolAction):
    """One tool call. Name and arguments take any JSON: the env checks them against its tools."""

    tool_name: Any = Field(default="", description="the tool to call")
    arguments: Any = Field(default_factory=dict, description="the tool's arguments (a JSON object)")


class TurngymObservation(Observation):
    """What the env said after a reset or a tool call (``reward`` and ``done`` are OpenEnv's own fields)."""

    text: str = Field(default="", description="the env's messages, joined")
    messages: list[dict[str, Any]] = Field(default_factory=list, description="the env's messages (role, content, ...)")
    tools: list[Tool] = Field(default_factory=list, description="the env's tools (after a reset)")
    task_id: str = Field(default="", description="the episode's task")
    turn: int = Field(default=0, description="env steps taken this episode")
    action_valid: bool = Field(default=True, description="the env accepted the call (info['action_valid'])")
    truncated: bool = Field(default=False, description="the turn limit ended the episode")
    outcome: float = Field(default=0.0, description="the episode's result so far (1.0 = solved)")
    episode_return: float = Field(default=0.0, description="sum of the episode's rewards")
    error: str | None = Field(default=None, description="set when the call could not be a step")


class TurngymEnvironment(Environment):
    """One turngym env as an OpenEnv ``Environment``; ``environment_class`` binds the env id."""

    SUPPORTS_CONCURRENT_SESSIONS: ClassVar[bool] = True  # each session builds its own env
    env_id: ClassVar[str] = ""
    env_kwargs: ClassVar[dict[str, Any]] = {}
    max_turns: ClassVar[int | None] = None

    def __init__(self) -> None:
        super().__init__()
        self.session = ToolCallSession(self.env_id, max_turns=self.max_turns, **self.env_kwargs)
        self.episode_id: str | None = None

    def reset(self, seed: int | None = None, episode_id: str | None = None, task_id: str | None = None,
              **kwargs: Any) -> TurngymObservation:
        """Start an episode on ``task_id`` (or one drawn with ``seed``).

        Raises:
            KeyError: ``task_id`` is not in the env's split (the client gets a server error).
        """
        messages = self.session.reset(task_id, seed)
        self.episode_id = episode_id or uuid.uuid4().hex
        tools = [Tool(name=s.name, description=s.description, input_schema=s.parameters) for s in self.session.specs]
        return self._observation(join(messages), messages, reward=None, tools=tools)

    def step(self, action: TurngymAction, timeout_s: float | None = None, **kwargs: Any) -> TurngymObservation:
        """One tool call, one ``env.step`` (tools keep their own timeouts); never raises for a bad call."""
        out = self.session.call(action.tool_name, action.arguments)
        return self._observation(out.text, out.messages, reward=out.reward, valid=out.action_valid,
                                 truncated=out.truncated, error=None if out.stepped else out.text)

    @property
    def state(self) -> State:
        s = self.session
        return State(episode_id=self.episode_id, step_count=s.turn, task_id=s.task_id, done=s.done,
                     outcome=s.outcome if s.task_id else 0.0, episode_return=s.episode_return)

    def get_metadata(self) -> EnvironmentMetadata:
        env_id = self.session.env.spec.id  # the registered id, without a "pkg.module:" prefix
        return EnvironmentMetadata(name=env_id, description=describe(env_id) or env_id)

    def close(self) -> None:
        self.session.close()

    def _observation(self, text: str, messages: list, reward: float | None, valid: bool = True,
                     truncated: bool = False, tools: list | None = None, error: str | None = None) -> TurngymObservation:
        s = self.session
        return TurngymObservation(
            text=text, messages=[json.loads(json.dumps(m.to_dict(), default=str)) for m in messages],
            tools=tools or [], task_id=s.task_id or "", turn=s.turn, action_valid=valid, truncated=truncated,
            outcome=s.outcome if s.task_id else 0.0, episode_return=s.episode_return, error=error,
            reward=reward, done=s.done,
        )


def environment_class(env_id: str, *, max_turns: int | None = None, **env_kwargs: Any) -> type[TurngymEnvironment]:
    """A ``TurngymEnvironment`` subclass bound to ``env_id``: what OpenEnv's server instantiates per session.

    Raises:
        ValueError: ``tool_format`` is given (calls arrive as data, so the session picks the format).
    """
    if "tool_format" in env_kwargs:
        raise ValueError("OpenEnv sends tool calls as data, so the env's tool_format is fixed; drop tool_format")
    name = "".join(c if c.isalnum() else "_" for c in env_id.rsplit("/", 1)[-1]) + "Environment"
    return type(name, (TurngymEnvironment,), {"env_id": env_id, "env_kwargs": dict(env_kwargs), "max_turns": max_turns})


def create_server(env_id: str, *, max_sessions: int = 8, max_turns: int | None = None, **env_kwargs: Any):
    """OpenEnv's FastAPI app serving ``env_id``, one env per WebSocket session.

    Args:
        env_id: A registered id.
        max_sessions: Concurrent WebSocket sessions (each holds its own env).
        max_turns: Override the env's turn limit.
        **env_kwargs: Constructor overrides (``split``, ...).
    """
    env_cls = environment_class(env_id, max_turns=max_turns, **env_kwargs)
    app = create_app(env_cls, TurngymAction, TurngymObservation, env_name=env_id, max_concurrent_envs=max_sessions)
    app.add_middleware(ClosedByClient)
    return app


class ClosedByClient:
    """ASGI middleware: a WebSocket session that ends because the client closed it ends quietly.

    OpenEnv's ``/ws`` endpoint (openenv-core 0.2) closes the socket in a ``finally`` after the
    client's ``close`` message, when the client has already gone; Starlette raises
    ``WebSocketDisconnect`` there, and uvicorn printed a 60-line traceback for every session. The
    session's env is destroyed before that close, so nothing is lost by ending here.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        from starlette.websockets import WebSocketDisconnect

        try:
            await self.app(scope, receive, send)
        except WebSocketDisconnect:
            pass


def serve(env_id: str, host: str = "127.0.0.1", port: int = 8000, max_sessions: int = 8,
          max_turns: int | None = None, env_kwargs: dict[str, Any] | None = None) -> None:
    """Serve ``env_id`` over OpenEnv with uvicorn until interrupted (``turngym openenv``)."""
    import uvicorn

    app = create_server(env_id, max_sessions=max_sessions, max_turns=max_turns, **(env_kwargs or {}))
    print(f"turngym openenv: {env_id} on http://{host}:{port} (WebSocket sessions at /ws, up to {max_sessions})",
          file=sys.stderr, flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")


class TurngymClient(EnvClient[TurngymAction, TurngymObservation, State]):
    """OpenEnv's ``EnvClient`` for a turngym server: typed actions in, typed observations out.

    ``TurngymClient(base_url="http://127.0.0.1:8000")`` is async (``async with``, ``await env.reset(...)``);
    ``.sync()`` wraps it for blocking code: ``with TurngymClient(base_url=...).sync() as env``, then
    ``reset(task_id=...)`` and ``step(TurngymAction(tool_name=..., arguments={...}))``, each returning
    OpenEnv's ``StepResult``.
    """

    def _step_payload(self, action: TurngymAction) -> dict[str, Any]:
        return action.model_dump() if isinstance(action, TurngymAction) else dict(action)

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[TurngymObservation]:
        obs = TurngymObservation(**payload.get("observation", {}), reward=payload.get("reward"), done=payload.get("done", False))
        return StepResult(observation=obs, reward=payload.get("reward"), done=bool(payload.get("done", False)))

    def _parse_state(self, payload: dict[str, Any]) -> State:
        return State(**payload)
