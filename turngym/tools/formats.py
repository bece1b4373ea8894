"""Tool-call formats: how calls are written in model output, and how tools and results are shown.

Four formats share one small interface (``ToolFormat``):

- ``hermes``: Hermes/Qwen ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks.
- ``openai``: OpenAI ``tool_calls`` (a ``Message`` with ``tool_calls``, or its JSON text).
- ``xml``: simple tags named after tools, ``<search>query</search>``, ``<answer>...</answer>``.
- ``text``: the whole utterance is the argument of the env's one main tool (plain commands).

Parsing never raises and never evaluates model output: text goes through regexes and
``json.loads`` only, and every problem becomes an entry in ``ParsedAction.errors``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Protocol

from turngym.tools.base import ToolRegistry, truncate
from turngym.types import Message, ToolCall, ToolResult, ToolSpec

MAX_ACTION_CHARS = 16_384  # longer utterances are rejected whole: no tool call needs more
MAX_CALLS_PER_ACTION = 8


@dataclass
class ParsedAction:
    """The calls found in one utterance, plus what went wrong while finding them."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    content: str = ""


class ToolFormat(Protocol):
    """How one format reads and writes tool calls."""

    name: str

    def parse(self, action: str | Message, tools: ToolRegistry, id_prefix: str = "call") -> ParsedAction: ...

    def render_tools(self, specs: list[ToolSpec]) -> str: ...

    def render_call(self, call: ToolCall, tools: ToolRegistry | None = None) -> str: ...

    def render_result(self, result: ToolResult) -> Message: ...

    def stop_strings(self, tools: ToolRegistry) -> list[str]: ...


def _too_long(text: str) -> str | None:
    if len(text) > MAX_ACTION_CHARS:
        return f"Error: the response is {len(text)} characters long; the limit is {MAX_ACTION_CHARS}."
    return None


def _load_json(raw: str) -> tuple[object, str | None]:
    try:
        return json.loads(raw), None
    except json.JSONDecodeError as e:
        return None, f"invalid JSON ({e.msg} at line {e.lineno} column {e.colno})"
    except (RecursionError, ValueError) as e:  # absurd nesting, or an int too long to convert
        return None, f"invalid JSON ({type(e).__name__}: {str(e)[:100]})"


def _as_text(action: str | Message) -> str:
    if isinstance(action, Message):
        return action.content
    return action if isinstance(action, str) else str(action)


def _without(text: str, matches: list) -> str:
    """``text`` with the matched spans cut out, stripped (one pass, no second regex scan)."""
    if not matches:
        return text.strip()
    parts, last = [], 0
    for m in matches:
        parts.append(text[last : m.start()])
        last = m.end()
    parts.append(text[last:])
    return "".join(parts).strip()


def _call_from_obj(obj: object, call_id: str) -> tuple[ToolCall | None, str | None]:
    """A ``{"name": ..., "arguments": {...}}`` object (arguments may be a JSON string) to a ToolCall."""
    if not isinstance(obj, dict):
        return None, f'a tool call must be a JSON object like {{"name": ..., "arguments": {{...}}}}, got {type(obj).__name__}'
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None, 'the tool call has no "name" string'
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # OpenAI sends arguments as a JSON-encoded string
        args, err = _load_json(args) if args.strip() else ({}, None)
        if err:
            return None, f"arguments of {name[:64]!r} are {err}"
    if not isinstance(args, dict):
        return None, f'"arguments" of {name[:64]!r} must be a JSON object, got {type(args).__name__}'
    return ToolCall(id=call_id, name=name, arguments=args), None


class HermesFormat:
    """``<tool_call>{json}</tool_call>``, as Hermes and Qwen2.5 chat templates render it."""

    name = "hermes"
    _block = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)

    def parse(self, action: str | Message, tools: ToolRegistry, id_prefix: str = "call") -> ParsedAction:
        text = _as_text(action)
        if err := _too_long(text):
            return ParsedAction(errors=[err])
        matches = list(self._block.finditer(text))
        blocks = [m.group(1) for m in matches]
        content = _without(text, matches)
        if not blocks:
            return ParsedAction(errors=[self._usage("no <tool_call> block found", tools)], content=content)
        out = ParsedAction(content=content)
        for i, raw in enumerate(blocks[:MAX_CALLS_PER_ACTION]):
            obj, err = _load_json(raw.strip())
            call, err = (None, err) if err else _call_from_obj(obj, f"{id_prefix}_{i}")
            if err:
                out.errors.append(self._usage(f"tool call {i + 1}: {err}", tools))
            else:
                out.calls.append(call)
        if len(blocks) > MAX_CALLS_PER_ACTION:
            out.errors.append(f"Error: at most {MAX_CALLS_PER_ACTION} tool calls per turn; the rest were ignored.")
        return out

    def _usage(self, problem: str, tools: ToolRegistry) -> str:
        example = self.render_call(ToolCall("x", tools.names[0], {}), tools) if len(tools) else ""
        return f"Error: {problem}. Call a tool like this: {example.strip()}"

    def render_tools(self, specs: list[ToolSpec]) -> str:
        lines = "\n".join(json.dumps(s.to_openai()) for s in specs)
        return (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{lines}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        )

    def render_call(self, call: ToolCall, tools: ToolRegistry | None = None) -> str:
        if not call.arguments and tools is not None and call.name in tools:
            args = {k: "..." for k in tools[call.name].parameters.get("required", [])}
        else:
            args = call.arguments
        return "<tool_call>\n" + json.dumps({"name": call.name, "arguments": args}) + "\n</tool_call>"

    def render_result(self, result: ToolResult) -> Message:
        return Message("tool", result.content, tool_call_id=result.call_id, name=result.name)

    def stop_strings(self, tools: ToolRegistry) -> list[str]:
        return ["</tool_call>"]


class OpenAIFormat(HermesFormat):
    """OpenAI ``tool_calls``: a Message carrying calls, or the JSON of one (``{"tool_calls": [...]}``).

    Each entry is ``{"id", "type": "function", "function": {"name", "arguments": "<json string>"}}``.
    """

    name = "openai"

    def parse(self, action: str | Message, tools: ToolRegistry, id_prefix: str = "call") -> ParsedAction:
        if isinstance(action, Message):
            if action.tool_calls:
                return ParsedAction(calls=list(action.tool_calls[:MAX_CALLS_PER_ACTION]), content=action.content)
            return ParsedAction(errors=[self._usage("the message has no tool_calls", tools)], content=action.content)
        text = _as_text(action)
        if err := _too_long(text):
            return ParsedAction(errors=[err])
        obj, err = _load_json(text.strip())
        if err:
            return ParsedAction(errors=[self._usage(f"the response is not an OpenAI message: {err}", tools)])
        if not isinstance(obj, dict) or not isinstance(obj.get("tool_calls"), list):
            return ParsedAction(errors=[self._usage('expected an object with a "tool_calls" list', tools)])
        out = ParsedAction(content=obj.get("content") if isinstance(obj.get("content"), str) else "")
        for i, entry in enumerate(obj["tool_calls"][:MAX_CALLS_PER_ACTION]):
            fn = entry.get("function") if isinstance(entry, dict) else None
            call_id = entry.get("id") if isinstance(entry, dict) and isinstance(entry.get("id"), str) else None
            call, err = _call_from_obj(fn, call_id or f"{id_prefix}_{i}")
            if err:
                out.errors.append(self._usage(f"tool call {i + 1}: {err}", tools))
            else:
                out.calls.append(call)
        if not obj["tool_calls"]:
            out.errors.append(self._usage("the tool_calls list is empty", tools))
        return out

    def render_tools(self, specs: list[ToolSpec]) -> str:
        lines = "\n".join(json.dumps(s.to_openai()) for s in specs)
        example = json.dumps({"content": "", "tool_calls": [{"id": "call_0", "type": "function", "function": {
            "name": "<function-name>", "arguments": "<arguments as a JSON string>"}}]})
        return (
            "# Tools\n\nYou may call these functions:\n" + lines + "\n\n"
            "Reply with one JSON object and nothing else, in OpenAI's tool-call layout:\n" + example
        )

    def render_call(self, call: ToolCall, tools: ToolRegistry | None = None) -> str:
        fn = {"name": call.name, "arguments": json.dumps(call.arguments)}
        return json.dumps({"content": "", "tool_calls": [{"id": call.id, "type": "function", "function": fn}]})

    def stop_strings(self, tools: ToolRegistry) -> list[str]:
        return []


def _main_param(spec_params: dict) -> str | None:
    """The parameter a single-value call (xml tag body, plain text) fills: the first required one."""
    required = spec_params.get("required") or []
    props = spec_params.get("properties") or {}
    if required:
        return required[0]
    return next(iter(props), None)


def _coerce(value: str, schema: dict) -> object:
    """Tag bodies are text; turn them into the schema's scalar type when that is unambiguous."""
    t = schema.get("type")
    try:
        if t == "integer":
            return int(value.strip())
        if t == "number":
            return float(value.strip())
    except ValueError:
        pass  # leave as text: validation then says what type was expected
    return value


def _single_value_call(tools: ToolRegistry, name: str, body: str, call_id: str) -> tuple[ToolCall | None, str | None]:
    params = tools[name].parameters
    props = params.get("properties") or {}
    stripped = body.strip()
    if len(props) > 1 and stripped.startswith("{"):  # several parameters: the body is a JSON object
        obj, err = _load_json(stripped)
        if err or not isinstance(obj, dict):
            return None, f"<{name}> body must be text or a JSON object of arguments ({err or 'not an object'})"
        return ToolCall(call_id, name, obj), None
    key = _main_param(params)
    if key is None:
        return ToolCall(call_id, name, {}), None
    return ToolCall(call_id, name, {key: _coerce(stripped, props.get(key, {}))}), None


class XMLFormat:
    """``<tool>argument</tool>`` tags named after tools, as in Search-R1 and SQL agents.

    A tool with one main parameter takes the tag body as that parameter; a tool with several takes
    a JSON object as the body. Other tags are ordinary text, searched through for tool tags;
    ``<think>`` blocks are reasoning, and tool tags inside them do not run.
    """

    name = "xml"
    _think = re.compile(r"<think>.*?(?:</think>|$)", re.DOTALL)
    _any_tag = re.compile(r"<([A-Za-z_][A-Za-z0-9_-]{0,63})>")

    def parse(self, action: str | Message, tools: ToolRegistry, id_prefix: str = "call") -> ParsedAction:
        text = _as_text(action)
        if err := _too_long(text):
            return ParsedAction(errors=[err])
        visible = self._think.sub("", text)  # reasoning is not action: calls inside <think> do not run
        out = ParsedAction()
        names = "|".join(re.escape(n) for n in tools.names)
        matches = list(re.finditer(rf"<({names})>(.*?)</\1>", visible, re.DOTALL)) if names else []
        for m in matches[:MAX_CALLS_PER_ACTION]:
            call, err = _single_value_call(tools, m.group(1), m.group(2), f"{id_prefix}_{len(out.calls)}")
            if err:
                out.errors.append(f"Error: {err}.")
            else:
                out.calls.append(call)
        if len(matches) > MAX_CALLS_PER_ACTION:
            out.errors.append(f"Error: at most {MAX_CALLS_PER_ACTION} tool calls per turn; the rest were ignored.")
        out.content = re.sub(rf"<({names})>(.*?)</\1>", "", visible, flags=re.DOTALL).strip() if names else visible
        if not matches:
            opened = sorted(set(self._any_tag.findall(visible)))
            seen = f" (found tags: {', '.join(opened[:5])})" if opened else ""
            tags = " ".join(f"<{n}>...</{n}>" for n in tools.names)
            out.errors.append(f"Error: no tool tag found{seen}. Use one of: {tags}")
        return out

    def render_tools(self, specs: list[ToolSpec]) -> str:
        lines = []
        for s in specs:
            props = s.parameters.get("properties") or {}
            body = _main_param(s.parameters) if len(props) <= 1 else "JSON arguments"
            lines.append(f"<{s.name}>{body or ''}</{s.name}>: {s.description}")
        return "You can use these tags, one or more per reply:\n" + "\n".join(lines)

    def render_call(self, call: ToolCall, tools: ToolRegistry | None = None) -> str:
        if len(call.arguments) == 1:
            body = str(next(iter(call.arguments.values())))
        elif not call.arguments:
            body = ""
        else:
            body = json.dumps(call.arguments)
        return f"<{call.name}>{body}</{call.name}>"

    def render_result(self, result: ToolResult) -> Message:
        return Message("user", result.content, name=result.name)

    def stop_strings(self, tools: ToolRegistry) -> list[str]:
        return [f"</{n}>" for n in tools.names]


class TextFormat:
    """The whole utterance is the main argument of the env's first tool: plain text commands."""

    name = "text"

    def parse(self, action: str | Message, tools: ToolRegistry, id_prefix: str = "call") -> ParsedAction:
        text = _as_text(action)
        if err := _too_long(text):
            return ParsedAction(errors=[err])
        if not len(tools):
            return ParsedAction(content=text)
        body = text.strip().splitlines()[0].strip() if text.strip() else ""
        if not body:
            return ParsedAction(errors=["Error: the response is empty; reply with a single command."])
        call, err = _single_value_call(tools, tools.names[0], body, f"{id_prefix}_0")
        return ParsedAction(calls=[call]) if call else ParsedAction(errors=[f"Error: {err}."])

    def render_tools(self, specs: list[ToolSpec]) -> str:
        return f"Reply with a single command on one line. {specs[0].description}" if specs else ""

    def render_call(self, call: ToolCall, tools: ToolRegistry | None = None) -> str:
        return str(next(iter(call.arguments.values()), ""))

    def render_result(self, result: ToolResult) -> Message:
        return Message("user", result.content, name=result.name)

    def stop_strings(self, tools: ToolRegistry) -> list[str]:
        return ["\n"]


FORMATS: dict[str, ToolFormat] = {f.name: f for f in (HermesFormat(), OpenAIFormat(), XMLFormat(), TextFormat())}


def get_format(name: str) -> ToolFormat:
    """The tool-call format registered under ``name`` (``hermes``, ``openai``, ``xml``, ``text``)."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown tool format {name!r}; choose from {sorted(FORMATS)}") from None


def format_stops(tool_format: str, tools: list[ToolSpec]) -> list[str]:
    """The stop strings a policy samples with for an env with these tools in this format (none
    without tools): the one definition every backend and the rollout use."""
    if not tools:
        return []
    return list(get_format(tool_format).stop_strings(ToolRegistry.from_specs(list(tools))))


def register_format(fmt: ToolFormat) -> None:
    """Add a format (e.g. a model family's own call syntax) under ``fmt.name``."""
    FORMATS[fmt.name] = fmt


def run_tools(action: str | Message, tools: ToolRegistry, fmt: ToolFormat, id_prefix: str = "call") -> tuple[ParsedAction, list[ToolResult]]:
    """The whole pipeline: parse, whitelist, validate, dispatch. Every failure is an error result."""
    parsed = fmt.parse(action, tools, id_prefix)
    results = [ToolResult(None, e, is_error=True, name="error") for e in parsed.errors]
    results += [tools.dispatch(c) for c in parsed.calls]
    for r in results:
        r.content = truncate(r.content, 4 * MAX_ACTION_CHARS)
    return parsed, results
