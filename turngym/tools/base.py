"""A ``Tool`` is a name, a description, a JSON schema and a callable, with a timeout and an output cap.

Tools are built from plain typed functions (the docstring and type hints give the schema) or
declared explicitly. Calling one never raises into the env loop: ``ToolRegistry.dispatch`` turns
every failure into a ``ToolResult(is_error=True)`` the agent can read and act on.
"""

from __future__ import annotations

import inspect
import signal
import threading
import typing
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Callable

import jsonschema

from turngym.types import ToolCall, ToolResult, ToolSpec

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


class ToolTimeout(Exception):
    """Raised inside a tool call that ran past its timeout."""


@dataclass
class Tool:
    """A callable the agent can invoke by name.

    Args:
        name: Identifier the agent uses (``[A-Za-z_][A-Za-z0-9_-]*``).
        description: One or two sentences shown to the agent.
        parameters: JSON Schema (type ``object``) for the keyword arguments.
        fn: ``fn(**arguments) -> str``. Anything it raises becomes an error result.
        timeout_s: Wall-clock limit per call; ``None`` disables it (trusted, in-process tools only).
        max_output_chars: Output beyond this is cut, with a note saying how much was dropped.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., str]
    timeout_s: float | None = 10.0
    max_output_chars: int = 8000
    _validator: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "a").replace("-", "a").isalnum():
            raise ValueError(f"tool name must be alphanumeric/underscore/dash, got {self.name!r}")
        if self.parameters.get("type") != "object":
            raise ValueError(f"tool {self.name!r}: parameters schema must have type 'object'")
        jsonschema.Draft202012Validator.check_schema(self.parameters)
        self._validator = jsonschema.Draft202012Validator(self.parameters)
        self._flat = _flat_schema(self.parameters)

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)

    def to_mcp(self) -> dict:
        """This tool as a Model Context Protocol tool description (``tools/list`` entry)."""
        return {"name": self.name, "description": self.description, "inputSchema": self.parameters}

    def validation_error(self, arguments: dict) -> str | None:
        """A readable message if ``arguments`` break the schema, else ``None``."""
        if self._flat is not None and _flat_ok(self._flat, arguments):
            return None  # exact for flat schemas, and ~10x cheaper than jsonschema on the hot path
        errors = sorted(self._validator.iter_errors(arguments), key=lambda e: list(e.path))
        if not errors:
            return None
        e = errors[0]
        where = "/".join(str(p) for p in e.path) or "(arguments)"
        msg = e.message if len(e.message) < 300 else e.message[:300] + "..."
        return f"invalid arguments for {self.name!r} at {where}: {msg}"

    def __call__(self, **arguments: Any) -> str:
        out = _call_with_timeout(self.fn, arguments, self.timeout_s)
        if not isinstance(out, str):
            out = str(out)
        return truncate(out, self.max_output_chars)

    @classmethod
    def from_function(
        cls,
        fn: Callable[..., str],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout_s: float | None = 10.0,
        max_output_chars: int = 8000,
    ) -> Tool:
        """Build a tool from a typed function; the docstring's first paragraph describes it and
        ``Args:`` lines describe the parameters."""
        doc = inspect.getdoc(fn) or ""
        summary = doc.split("\n\n")[0].replace("\n", " ").strip()
        return cls(
            name=name or fn.__name__,
            description=description or summary or fn.__name__,
            parameters=schema_from_signature(fn),
            fn=fn,
            timeout_s=timeout_s,
            max_output_chars=max_output_chars,
        )


def tool(
    fn: Callable[..., str] | None = None, **kwargs: Any
) -> Tool | Callable[[Callable[..., str]], Tool]:
    """Decorator form of ``Tool.from_function``: ``@tool`` or ``@tool(timeout_s=5)``."""
    if fn is not None:
        return Tool.from_function(fn, **kwargs)
    return lambda f: Tool.from_function(f, **kwargs)


def schema_from_signature(fn: Callable) -> dict:
    """JSON Schema for ``fn``'s keyword parameters from its type hints and ``Args:`` docstring lines."""
    hints = typing.get_type_hints(fn)
    arg_docs = _docstring_args(inspect.getdoc(fn) or "")
    props: dict[str, Any] = {}
    required: list[str] = []
    for pname, p in inspect.signature(fn).parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        prop = _json_type(hints.get(pname, str))
        if pname in arg_docs:
            prop["description"] = arg_docs[pname]
        if p.default is inspect.Parameter.empty:
            required.append(pname)
        else:
            prop["default"] = p.default
        props[pname] = prop
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def _json_type(tp: Any) -> dict:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        non_none = [a for a in typing.get_args(tp) if a is not type(None)]
        return _json_type(non_none[0]) if len(non_none) == 1 else {}
    if origin is typing.Literal:
        return {"enum": list(typing.get_args(tp))}
    if origin in (list, tuple):
        args = typing.get_args(tp)
        return {"type": "array", "items": _json_type(args[0])} if args else {"type": "array"}
    if origin is dict:
        return {"type": "object"}
    return {"type": _JSON_TYPES[tp]} if tp in _JSON_TYPES else {}


def _docstring_args(doc: str) -> dict[str, str]:
    out: dict[str, str] = {}
    in_args = False
    for line in doc.splitlines():
        s = line.strip()
        if s in ("Args:", "Arguments:", "Parameters:"):
            in_args = True
            continue
        if in_args:
            if not s or (s.endswith(":") and " " not in s):  # blank line or next section ends Args
                in_args = False
                continue
            if ":" in s:
                key, desc = s.split(":", 1)
                key = key.split("(")[0].strip()
                if key.isidentifier():
                    out[key] = desc.strip()
    return out


_FLAT_KEYS = {"type", "description", "default", "title"}
_TYPE_CHECKS = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def _flat_schema(schema: dict) -> tuple | None:
    """``(checks, required, closed)`` when the schema only uses keywords the fast path handles
    exactly (scalar ``type`` per property, ``required``, ``additionalProperties: false``); else None."""
    if set(schema) - {"type", "properties", "required", "additionalProperties", "title", "description"}:
        return None
    closed = schema.get("additionalProperties", True)
    if closed not in (True, False):
        return None
    checks = {}
    for name, prop in (schema.get("properties") or {}).items():
        if not isinstance(prop, dict) or set(prop) - _FLAT_KEYS or prop.get("type", "any") not in (*_TYPE_CHECKS, "any"):
            return None
        checks[name] = _TYPE_CHECKS.get(prop.get("type"), lambda v: True)
    return checks, tuple(schema.get("required") or ()), closed is False


def _flat_ok(flat: tuple, arguments: dict) -> bool:
    checks, required, closed = flat
    for k in required:
        if k not in arguments:
            return False
    for k, v in arguments.items():
        check = checks.get(k)
        if check is None:
            if closed:
                return False
        elif not check(v):
            return False
    return True


def truncate(text: str, limit: int) -> str:
    """Cut ``text`` to ``limit`` chars, saying how much was dropped (agents should know)."""
    if len(text) <= limit:
        return text
    dropped = len(text) - limit
    return text[:limit] + f"\n...[output truncated: {dropped} more characters]"


_pool: ThreadPoolExecutor | None = None


def _call_with_timeout(fn: Callable[..., str], args: dict, timeout_s: float | None) -> str:
    """Run ``fn(**args)`` with a wall-clock limit.

    On the main thread an interval timer (SIGALRM) interrupts Python code at near-zero cost, which
    keeps in-process tools like a TextWorld step cheap. Elsewhere the call runs on a worker thread
    and we stop waiting after the limit (the thread cannot be killed; code that can hang in C must
    run in a subprocess worker, which the rollout layer restarts on timeout).
    """
    if timeout_s is None:
        return fn(**args)
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
        return _call_with_alarm(fn, args, timeout_s)
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="turngym-tool")  # one per concurrent env step
    future = _pool.submit(fn, **args)
    try:
        return future.result(timeout=timeout_s)
    except FutureTimeout:
        raise ToolTimeout(f"timed out after {timeout_s:g}s") from None


def _call_with_alarm(fn: Callable[..., str], args: dict, timeout_s: float) -> str:
    def on_alarm(signum, frame):
        raise ToolTimeout(f"timed out after {timeout_s:g}s")

    previous_handler = signal.signal(signal.SIGALRM, on_alarm)
    previous_timer = signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        return fn(**args)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        if previous_timer[0] > 0:  # someone else's timer was running: give it back
            signal.setitimer(signal.ITIMER_REAL, *previous_timer)


class ToolRegistry:
    """The tools one env offers, by name. Dispatch is the whitelist + validate + call pipeline."""

    def __init__(self, tools: list[Tool] | None = None) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools or []:
            self.add(t)

    @classmethod
    def from_specs(cls, specs: list[ToolSpec]) -> ToolRegistry:
        """A registry that can parse and validate calls but not run them (what a policy sees)."""

        def not_here(**_: Any) -> str:
            raise RuntimeError("this registry only describes tools; the env runs them")

        return cls([Tool(s.name, s.description, s.parameters, not_here) for s in specs])

    def add(self, t: Tool) -> Tool:
        if t.name in self._tools:
            raise ValueError(f"tool {t.name!r} is already registered")
        self._tools[t.name] = t
        return t

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def __iter__(self):
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    @property
    def specs(self) -> list[ToolSpec]:
        return [t.spec for t in self._tools.values()]

    def dispatch(self, call: ToolCall) -> ToolResult:
        """Whitelist the name, validate the arguments, run the tool.

        Never raises, whatever the call holds: a name or arguments of any type, keys that are not
        strings, text that is not valid Unicode (a lone surrogate), a tool that fails or times out.
        Each comes back as an error result. Every result's text is valid UTF-8 (a lone surrogate
        in a tool's output is replaced), so it can be tokenized, logged and sent anywhere.
        """
        call_id = getattr(call, "id", None)
        call_id = call_id if call_id is None or isinstance(call_id, str) else repr(call_id)[:64]
        try:
            result = self._dispatch(call, call_id)
        except Exception as e:  # nothing should reach here; this keeps the promise if something does
            result = ToolResult(call_id, f"Error: the tool call could not be run: {type(e).__name__}: {_short(str(e))}", True)
        return ToolResult(
            _valid_text(result.call_id), _valid_text(result.content), result.is_error, _valid_text(result.name)
        )

    def _dispatch(self, call: ToolCall, call_id: str | None) -> ToolResult:
        name, arguments = getattr(call, "name", None), getattr(call, "arguments", None)
        if not isinstance(name, str):
            return ToolResult(
                call_id, f"Error: a tool name must be a string, not {type(name).__name__}. Available tools: {', '.join(self.names)}.", True
            )
        t = self._tools.get(name)
        if t is None:
            return ToolResult(
                call_id,
                f"Error: unknown tool {_short(name)!r}. Available tools: {', '.join(self.names)}.",
                is_error=True,
                name=name[:64],
            )
        if not isinstance(arguments, dict):
            return ToolResult(call_id, f"Error: arguments for {t.name!r} must be a JSON object, not {type(arguments).__name__}.", True, t.name)
        bad = plain_json_problem(arguments)
        if bad:
            return ToolResult(call_id, f"Error: arguments for {t.name!r}: {bad}.", True, t.name)
        problem = t.validation_error(arguments)
        if problem:
            return ToolResult(call_id, f"Error: {problem}. Schema: {_short(str(t.parameters), 400)}", True, t.name)
        try:
            return ToolResult(call_id, t(**arguments), False, t.name)
        except ToolTimeout as e:
            return ToolResult(call_id, f"Error: tool {t.name!r} {e}.", True, t.name)
        except Exception as e:  # a tool's own failure is information for the agent, not a crash
            return ToolResult(call_id, f"Error: tool {t.name!r} failed: {type(e).__name__}: {_short(str(e))}", True, t.name)


MAX_ARGUMENT_CHARS = 16_384  # a call's arguments as JSON text: what one utterance may hold
MAX_ARGUMENT_DEPTH = 32
_INT_BITS = 64  # integers past int64 are not portable JSON (and 5000-digit ones do not even print)


def plain_json_problem(value: Any, max_chars: int = MAX_ARGUMENT_CHARS) -> str | None:
    """Why ``value`` is not plain JSON a tool may receive, or None.

    Plain JSON is what ``json.loads`` gives for a small document: dicts with string keys, lists,
    strings that are valid Unicode, booleans, None, finite floats and 64-bit integers, nested at
    most ``MAX_ARGUMENT_DEPTH`` deep and about ``max_chars`` characters long as JSON text. An
    in-process caller can hand over anything (an object, a tuple, a list nested 990 deep, a
    5000-digit integer); each is refused here before a tool, a schema validator or the
    ``info`` record ever sees it. Iterative, and stops at the first problem.
    """
    stack = [("(arguments)", value, 0)]
    size = 0
    while stack:
        where, v, depth = stack.pop()
        if depth > MAX_ARGUMENT_DEPTH:
            return f"the value at {where} is nested more than {MAX_ARGUMENT_DEPTH} deep"
        if type(v) is str:
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                return f"the text at {where} is not valid Unicode ({e.reason} at character {e.start})"
            size += len(v) + 2
        elif v is None or type(v) is bool:
            size += 5
        elif type(v) is int:
            if v.bit_length() > _INT_BITS:
                return f"the integer at {where} has more than {_INT_BITS} bits"
            size += 20
        elif type(v) is float:
            if v != v or v in (float("inf"), float("-inf")):
                return f"the number at {where} is not finite"
            size += 24
        elif type(v) is dict:
            size += 2
            for k, item in v.items():
                if type(k) is not str:
                    return f"object keys must be strings, got {type(k).__name__} at {where}"
                key = k if where == "(arguments)" else f"{where}/{k}"
                stack.append((key, k, depth + 1))
                stack.append((key, item, depth + 1))
        elif type(v) is list:
            size += 2 + len(v)
            stack.extend((f"{where}/{i}", item, depth + 1) for i, item in enumerate(v))
        else:
            return f"the value at {where} is a {type(v).__name__}, which is not JSON"
        if size > max_chars:
            return f"the arguments are longer than {max_chars} characters as JSON"
    return None


def valid_unicode(s: str) -> str:
    """``s`` with lone surrogates replaced by U+FFFD, so it encodes as UTF-8.

    ``json.loads`` accepts ``"\\ud800"``, so model replies and third-party data can hold them.
    """
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _valid_text(s: object) -> str | None:
    return None if s is None else valid_unicode(s if isinstance(s, str) else str(s))


def _short(s: str, n: int = 120) -> str:
    return s if len(s) <= n else s[:n] + "..."
