"""Serve an env's tools as an MCP server (``turngym mcp ENV_ID``), with step semantics.

An MCP client (an IDE agent, Claude Desktop, another framework) plays the env through plain tool
calls:

- ``reset(task_id?, seed?)`` starts an episode and returns the opening messages, where the env's
  instructions for writing a tool call in text become "act by calling the tools".
- Every env tool is listed with its own name, description and JSON schema. A call to one is one
  ``env.step``: the call is rendered in the env's own tool format (``render_call``) and the env
  parses it as it would parse a model's utterance, so validation, rewards, turn limits and error
  observations are exactly those of a rollout.
- Each result's text is the observation; its structured content holds ``reward``, ``terminated``,
  ``truncated``, ``outcome``, ``action_valid``, ``turn``, ``episode_return`` and the messages,
  and every tool declares that shape as its output schema, so SDK clients validate it.

A call that could not become a step (no episode yet, the episode is over, an unknown tool, a call
the env's text format cannot express) comes back with ``isError`` and no step is taken. A step
whose action the env rejects is still a step (``action_valid: false``), as in a rollout.

The ``mcp`` SDK is imported lazily: ``pip install 'turngym[mcp]'``.
"""

from __future__ import annotations

import json
from typing import Any

from turngym.envs.registry import make
from turngym.types import Message, ToolCall, action_valid

RESET = "reset"

STEP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "observation": {"type": "string", "description": "the env's messages, joined"},
        "messages": {"type": "array", "items": {"type": "object"}, "description": "the env's messages (role, content, ...)"},
        "reward": {"type": "number"},
        "terminated": {"type": "boolean", "description": "the task reached an end state"},
        "truncated": {"type": "boolean", "description": "the turn limit ended the episode"},
        "outcome": {"type": "number", "description": "episode-level result so far (1.0 = solved)"},
        "action_valid": {"type": "boolean"},
        "turn": {"type": "integer"},
        "task_id": {"type": "string"},
        "episode_return": {"type": "number", "description": "sum of rewards this episode"},
    },
    "required": ["observation", "reward", "terminated", "truncated", "outcome", "action_valid", "turn", "task_id"],
}


class StepError(Exception):
    """A call that could not become an env step; the client gets it as an ``isError`` result."""


class EnvSession:
    """One env and its current episode, without any MCP: ``reset`` and ``call`` return plain dicts.

    Args:
        env: A turngym env, wrapped or not (``turngym.make`` adds the turn limit).
    """

    def __init__(self, env: Any) -> None:
        self.env = env
        self.base = env.unwrapped
        if RESET in self.base.tools:
            raise ValueError(f"{type(self.base).__name__} has a tool named {RESET!r}, which the MCP server uses for reset")
        self.task_id: str | None = None
        self.done = True
        self.turn = 0
        self.episode_return = 0.0
        self._calls = 0
        # The opening messages teach a model the env's text tool format ("reply with a single
        # command on one line"); an MCP client calls the tools instead, so it reads this in its place.
        self._format_block = self.base.format.render_tools(self.base.tools.specs)
        self._how_to_act = (f"Act by calling the tools ({', '.join(self.base.tools.names)}); "
                            "each call is one step of the episode.")

    def reset(self, task_id: str | None = None, seed: int | None = None) -> dict[str, Any]:
        """Start an episode. Raises ``StepError`` for a task id the env does not have."""
        options = {"task_id": str(task_id)} if task_id is not None else None
        try:
            obs, info = self.env.reset(seed=seed, options=options)
        except KeyError as e:
            raise StepError(str(e.args[0]) if e.args else str(e)) from None
        self.task_id, self.done, self.turn, self.episode_return = str(info["task_id"]), False, 0, 0.0
        return self._result([self._for_tool_calls(m) for m in obs], 0.0, False, False, True)

    def _for_tool_calls(self, m: Message) -> Message:
        if not self._format_block or self._format_block not in m.content:
            return m
        return Message(m.role, m.content.replace(self._format_block, self._how_to_act), m.tool_calls,
                       m.tool_call_id, m.name)

    def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Send one tool call through ``env.step``. Raises ``StepError`` when no step can be taken."""
        if self.task_id is None:
            raise StepError(f"no episode yet: call {RESET} first")
        if self.done:
            raise StepError(f"the episode is over: call {RESET} to start another")
        if name not in self.base.tools:
            raise StepError(f"unknown tool {name!r}; this env has: {', '.join(self.base.tools.names)}")
        self._calls += 1
        # No registry passed: given one, render_call fills missing required arguments with "..."
        # placeholders (for usage hints), and the env must see the call exactly as it came.
        action = self.base.format.render_call(ToolCall(f"mcp_{self._calls}", name, dict(arguments)))
        parsed = self.base.format.parse(action, self.base.tools)
        if len(parsed.calls) != 1 or parsed.calls[0].name != name:
            raise StepError(f"the env's {self.base.format.name!r} tool format cannot express a call to {name!r} "
                            f"(it only calls {self.base.tools.names[0]!r}); serve it with --env-arg tool_format=hermes")
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.turn += 1
        self.episode_return += float(reward)
        self.done = bool(terminated or truncated)
        return self._result(obs, float(reward), bool(terminated), bool(truncated), action_valid(info))

    def _result(self, obs: list[Message], reward: float, terminated: bool, truncated: bool, valid: bool) -> dict[str, Any]:
        return {
            "observation": "\n\n".join(m.content for m in obs),
            "messages": [_json_safe(m.to_dict()) for m in obs],
            "reward": reward,
            "terminated": terminated,
            "truncated": truncated,
            "outcome": float(self.base.outcome()),
            "action_valid": valid,
            "turn": self.turn,
            "task_id": self.task_id or "",
            "episode_return": self.episode_return,
        }


def _json_safe(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


def _reset_description(base: Any) -> str:
    ids = list(base.task_ids)
    shown = ", ".join(ids[:5]) + (", ..." if len(ids) > 5 else "")
    return (f"Start a new episode and return the opening messages. task_id picks one of {len(ids)} tasks "
            f"({shown}); without it a task is drawn using seed. The same task_id and seed replay exactly.")


def build_server(session: EnvSession, name: str):
    """An MCP low-level ``Server`` whose tools are ``reset`` plus the env's tools.

    Calls are served one at a time (the env holds one episode) in a worker thread, so a slow env
    step does not stall the protocol loop.
    """
    import anyio
    import mcp_types as types
    from mcp.server import Server

    base = session.base
    reset_schema = {
        "type": "object",
        "properties": {"task_id": {"type": "string", "description": "a task id of this env"},
                       "seed": {"type": "integer", "description": "seeds the env's RNG"}},
    }
    tools = [types.Tool(name=RESET, description=_reset_description(base), input_schema=reset_schema, output_schema=STEP_SCHEMA)]
    tools += [types.Tool(name=s.name, description=s.description, input_schema=s.parameters, output_schema=STEP_SCHEMA)
              for s in base.tools.specs]
    lock = anyio.Lock()

    async def list_tools(ctx, params) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        args = dict(params.arguments or {})
        async with lock:
            try:
                if params.name == RESET:
                    out = await anyio.to_thread.run_sync(lambda: session.reset(args.get("task_id"), args.get("seed")))
                else:
                    out = await anyio.to_thread.run_sync(lambda: session.call(params.name, args))
            except StepError as e:
                return types.CallToolResult(content=[types.TextContent(text=f"Error: {e}")], is_error=True)
        return types.CallToolResult(content=[types.TextContent(text=out["observation"])], structured_content=out)

    return Server(name, version=_version(), instructions=f"turngym env {name}: call {RESET} first, then its tools.",
                  on_list_tools=list_tools, on_call_tool=call_tool)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("turngym")
    except PackageNotFoundError:
        return "0"


def serve_stdio(env_id: str, env_kwargs: dict[str, Any] | None = None, max_turns: int | None = None) -> None:
    """Serve ``env_id`` over stdin/stdout until the client closes the connection.

    The env is built inside the transport, where the SDK has pointed fd 1 at stderr, so anything an
    env prints while it builds (game generators, data loaders) cannot corrupt the protocol stream.

    Args:
        env_id: A registered id; ``"pkg.module:ns/Name-v0"`` imports ``pkg.module`` first (Gymnasium's syntax).
        env_kwargs: Constructor overrides (``split``, ``tool_format``, ...).
        max_turns: Override the registered turn limit.

    Raises:
        ImportError: the ``mcp`` SDK is not installed.
    """
    try:
        import anyio
        from mcp.server.stdio import stdio_server
    except ImportError as e:
        raise ImportError("turngym mcp needs the MCP SDK: pip install 'turngym[mcp]'") from e

    async def main() -> None:
        async with stdio_server() as (read, write):
            session = EnvSession(make(env_id, max_turns=max_turns, **(env_kwargs or {})))
            server = build_server(session, env_id)
            await server.run(read, write, server.create_initialization_options())

    anyio.run(main)
