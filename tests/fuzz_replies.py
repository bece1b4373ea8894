"""A seeded generator of adversarial agent replies, for any env's tools and any tool format.

Each reply mixes some of: calls shaped right but carrying hostile values (interpreter backslash
commands, control characters, lone surrogates, huge or nested payloads), malformed JSON, non-string
tool names, null/list/string arguments, wrong tool names, several calls in one reply, another
format's tags, raw junk and over-long text. For the ``openai`` format some replies are ``Message``
objects whose ``ToolCall``s hold whatever types (the parser passes those through as they are).

``make_safe`` (optional) rewrites a call's arguments before rendering; the SWE fuzz uses it so that
shell commands only ever print their payload (the local sandbox runs them on this host).
"""

from __future__ import annotations

import json
import random
import shlex
from collections.abc import Callable
from typing import Any

from turngym.tools.base import ToolRegistry
from turngym.types import Message, ToolCall

FORMATS = ("hermes", "openai", "xml", "text")
SWE_KW = {"sandbox": "local", "n_tasks": 2, "command_timeout_s": 5.0, "test_timeout_s": 5.0, "grade_timeout_s": 10.0}
# family -> (env id, make kwargs, per-call limit of envs without an engine deadline)
FAMILIES = {
    "textworld": ("turngym/TextWorld-easy-v0", {"num_games": 1}, None),
    "alfworld": ("turngym/ALFWorld-v0", {"max_games": 2}, None),
    "sql": ("turngym/SQL-synthetic-v1", {}, 2.0),
    "search": ("turngym/Search-synthetic-v0", {}, 30.0),
    "swe": ("turngym/SWE-synthetic-v0", SWE_KW, 10.0),
    "wordle": ("turngym/Wordle-v0", {}, 10.0),
    "maze": ("turngym/Maze-partial-v0", {}, 10.0),
    "textnav": ("turngym/TextNav-v0", {}, 10.0),
    "twenty_questions": ("turngym/TwentyQuestions-v0", {}, 10.0),
    "guess_my_city": ("turngym/GuessMyCity-v0", {}, 10.0),
    "guess": ("tests/Guess-v0", {}, 10.0),
}

BACKSLASH = ["\\help", "\\s", "\\t", "\\x", "\\sf1", "\\mp0", "\\w99", "\\H", "\\N", "\\X", "\\U", "\\", "\\\\",
             "look \\_ restart", "inventory\\_quit", "\\help\\_look", "go north \\[", "\\d", "\\cm", "\\lt1"]
META = ["restart", "quit", "q", "save", "restore", "undo", "script", "verify", "version", "tw-print facts",
        "tw-trace-actions", "look. quit", "look then restart", "y", "n", "again", "g", "oops", "*", "!!"]
CONTROL = ["\x00", "\x1b[2J\x1b[H", "\r\n", "\r", "\t\t", "\x7f", "\x08\x08", "\u2028", "\u202e", "\ufeff",
           "\x1b]0;title\x07", "a\x00b", "\x0c", "\x85"]
SURROGATE = ["\ud800", "\udfff", "a\udc80b", "\ud83d", "\udbff\udc00x\ud800"]
UNICODE = ["caf\u00e9", "\u4e2d\u6587", "\U0001f600" * 3, "e\u0301" * 10, "\u200b\u200d", "\u00df\u0130",
           "\uff54\uff41\uff4b\uff45", "\U000e0041", "\u0000\u0000"]
INJECTION = ["'; DROP TABLE users; --", "\" OR 1=1 --", "$(id)", "`id`", "{{7*7}}", "${jndi:ldap://127.0.0.1/x}",
             "__import__('os').getcwd()", "../../../../etc/passwd", "/etc/shadow", "%s%s%s%n", "<script>x</script>"]
GAME = ["look", "go north", "take coin", "open door", "inventory", "examine table", "go to desk 1", "n", "e", "up",
        "SELECT 1", "select * from sqlite_master", "crane", "apple", "Is it alive?", "left", "3", "42", "Paris"]
FORMAT_TAGS = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<answer>", "</answer>", "<search>", "<sql>",
               "<act>", "</act>", "<guess>", '{"tool_calls": [', "```json", "<|im_end|>", "<|im_start|>assistant"]
WRONG_NAMES = ["rm", "os.system", "__import__", "eval", "", " ", "ACT", "act ", "a" * 300, "tool_call", "None",
               "\ud800", "act\x00", "function", "submit_answer", "../act", "Act", "\u0430ct"]


def payload_string(rng: random.Random) -> str:
    """One hostile string: from the pools above, very long, random junk, or a mix."""
    kind = rng.random()
    pools = [BACKSLASH, META, CONTROL, SURROGATE, UNICODE, INJECTION, GAME]
    if kind < 0.55:
        return rng.choice(rng.choice(pools))
    if kind < 0.65:
        return rng.choice(["a", "x ", "\\", "9", "\u00e9", "\ud800"]) * rng.choice([199, 200, 201, 1000, 5000, 20000])
    if kind < 0.85:
        return "".join(rng.choice(rng.choice(pools)) for _ in range(rng.randint(2, 4)))
    return "".join(chr(rng.choice([rng.randint(0, 0x7F), rng.randint(0x80, 0xFFFF), rng.randint(0xD800, 0xDFFF),
                                    rng.randint(0x10000, 0x10FFFF)])) for _ in range(rng.randint(1, 60)))


def payload_value(rng: random.Random) -> Any:
    """Any JSON-ish value: mostly strings, else the wrong types, huge numbers and deep nesting."""
    r = rng.random()
    if r < 0.6:
        return payload_string(rng)
    choices: list[Callable[[], Any]] = [
        lambda: None, lambda: True, lambda: rng.randint(-2**70, 2**70), lambda: float("nan"), lambda: 1e308,
        lambda: [payload_string(rng)], lambda: {"command": payload_string(rng)}, list,
        lambda: _nested(rng.randint(50, 400)), lambda: list(range(rng.randint(100, 3000))),
        lambda: {str(i): i for i in range(rng.randint(10, 500))},
    ]
    return rng.choice(choices)()


def _nested(depth: int) -> Any:
    v: Any = "deep"
    for i in range(depth):
        v = [v] if i % 2 else {"k": v}
    return v


class ReplyGen:
    """Adversarial replies for one env's tools in one format.

    Args:
        tools: The env's tool registry (names and schemas shape the calls).
        fmt: ``hermes`` | ``openai`` | ``xml`` | ``text``.
        seed: Seeds everything; the same seed gives the same replies.
        make_safe: ``(name, arguments) -> arguments`` applied to every call before rendering.
    """

    def __init__(self, tools: ToolRegistry, fmt: str, seed: int,
                 make_safe: Callable[[str, dict], dict] | None = None) -> None:
        self.tools, self.fmt, self.rng = tools, fmt, random.Random(seed)
        self.make_safe = make_safe or (lambda name, args: args)
        self._kinds = [self.hostile_call, self.hostile_call, self.malformed_json, self.bad_name, self.bad_arguments,
                       self.several_calls, self.other_format, self.junk, self.too_long, self.nested_args]
        if fmt == "openai":
            self._kinds.append(self.message_object)

    def __call__(self) -> str | Message:
        return self.rng.choice(self._kinds)()

    # ----- building blocks ------------------------------------------------------------------
    def _tool(self):
        return self.rng.choice(list(self.tools))

    def _args(self, tool) -> dict:
        props = list(tool.parameters.get("properties") or {})
        args = {p: payload_value(self.rng) if self.rng.random() < 0.7 else payload_string(self.rng) for p in props}
        if props and self.rng.random() < 0.2:
            args.pop(self.rng.choice(props))
        if self.rng.random() < 0.1:
            args["extra"] = payload_value(self.rng)
        return self.make_safe(tool.name, args)

    def _dumps(self, obj: Any) -> str:
        # ensure_ascii=False leaves lone surrogates raw in the text; True writes them as \ud800 escapes.
        try:
            return json.dumps(obj, ensure_ascii=self.rng.random() < 0.5)
        except (ValueError, RecursionError):
            return json.dumps(str(obj)[:1000])

    def render(self, name: Any, args: Any) -> str:
        """One call in this format, whatever the types of ``name`` and ``args``."""
        if self.fmt == "hermes":
            return f"<tool_call>{self._dumps({'name': name, 'arguments': args})}</tool_call>"
        if self.fmt == "openai":
            raw = self._dumps(args) if self.rng.random() < 0.8 else args
            fn = {"name": name, "arguments": raw}
            return self._dumps({"content": "", "tool_calls": [{"id": "c1", "type": "function", "function": fn}]})
        body = args
        if isinstance(args, dict) and len(args) == 1:
            body = next(iter(args.values()))
        body = body if isinstance(body, str) else self._dumps(body)
        if self.fmt == "xml":
            return f"<{name}>{body}</{name}>" if isinstance(name, str) else f"<{self._dumps(name)}>{body}"
        return body  # text: the utterance is the main argument

    # ----- kinds of reply -------------------------------------------------------------------
    def hostile_call(self) -> str:
        t = self._tool()
        return self.render(t.name, self._args(t))

    def malformed_json(self) -> str:
        t = self._tool()
        good = self.render(t.name, self.make_safe(t.name, {p: self.rng.choice(GAME) for p in (t.parameters.get("properties") or {})}))
        if self.rng.random() < 0.5:
            return good[: self.rng.randint(0, max(0, len(good) - 2))]
        i = self.rng.randrange(len(good)) if good else 0
        return good[:i] + self.rng.choice(['"', "{", "}", ",", ":", "\\", "\x00", "\ud800", "]", "\\u12"]) + good[i + 1:]

    def bad_name(self) -> str:
        name = self.rng.choice([None, 5, 3.5, True, [], {}, ["act"], {"name": "act"}, *WRONG_NAMES])
        return self.render(name, self._args(self._tool()))

    def bad_arguments(self) -> str:
        t = self._tool()
        args = self.rng.choice([None, [], [1, 2], "not json", "{bad", 7, True, "", "null", [{"command": "look"}]])
        if self.fmt == "hermes":
            return f"<tool_call>{self._dumps({'name': t.name, 'arguments': args})}</tool_call>"
        if self.fmt == "openai":
            fn = {"name": t.name, "arguments": args}
            return self._dumps({"tool_calls": [{"id": None, "function": fn}, None, "x", {"function": None}]})
        return self.render(t.name, args)

    def several_calls(self) -> str:
        n = self.rng.choice([2, 3, 5, 8, 9, 12, 40])
        parts = [self.hostile_call() if self.rng.random() < 0.7 else self.malformed_json() for _ in range(n)]
        if self.fmt == "openai":
            calls = [{"id": f"c{i}", "type": "function", "function": {"name": self._tool().name,
                                                                      "arguments": self._dumps(self._args(self._tool()))}}
                     for i in range(n)]
            return self._dumps({"content": payload_string(self.rng)[:200], "tool_calls": calls})
        return self.rng.choice(["", "\n", " then ", "<think>", "</think>"]).join(parts)

    def other_format(self) -> str:
        t = self._tool()
        args = self._args(t)
        others = [f for f in ("hermes", "openai", "xml", "text") if f != self.fmt]
        saved, self.fmt = self.fmt, self.rng.choice(others)
        try:
            text = self.render(t.name, args)
        finally:
            self.fmt = saved
        return self.rng.choice(FORMAT_TAGS) + text + self.rng.choice(FORMAT_TAGS)

    def junk(self) -> str:
        alphabet = "abc <>/{}[]\":,\\\n\t" + "".join(FORMAT_TAGS[self.rng.randrange(len(FORMAT_TAGS))])
        return "".join(self.rng.choice(alphabet) for _ in range(self.rng.randint(0, 300)))

    def too_long(self) -> str:
        t = self._tool()
        n = self.rng.choice([16_000, 16_384, 16_385, 50_000])
        props = list(t.parameters.get("properties") or {})
        args = self.make_safe(t.name, {p: "y" * n for p in props[:1]})
        return self.render(t.name, args) if props and self.rng.random() < 0.5 else "z" * n

    def nested_args(self) -> str:
        t = self._tool()
        props = list(t.parameters.get("properties") or {}) or ["x"]
        raw = self._dumps({"name": t.name, "arguments": {props[0]: "__N__"}})
        deep = "[" * self.rng.choice([100, 1000, 5000]) + "]" * self.rng.choice([0, 100, 5000])
        text = raw.replace('"__N__"', deep)
        return f"<tool_call>{text}</tool_call>" if self.fmt != "openai" else text

    def message_object(self) -> Message:
        calls = []
        for i in range(self.rng.randint(0, 10)):
            t = self._tool()
            name = t.name if self.rng.random() < 0.6 else self.rng.choice([None, 5, [], *WRONG_NAMES])
            args: Any = self._args(t) if self.rng.random() < 0.6 else self.rng.choice([None, [], "x", 3, {1: 2}])
            calls.append(ToolCall(self.rng.choice([f"c{i}", None, 7]), name, args))
        return Message("assistant", payload_string(self.rng)[:500], tool_calls=calls)


# ----- SWE: the local sandbox runs commands on this host, so the fuzz only ever prints them ----
_PRINTF = "printf %s "


def _printing(command: str) -> str:
    return _PRINTF + shlex.quote(command)


def _is_printing(command: str) -> bool:
    rest = command[len(_PRINTF):] if command.startswith(_PRINTF) else None
    try:
        parts = shlex.split(rest) if rest is not None else []
    except ValueError:
        return False
    return len(parts) == 1 and shlex.quote(parts[0]) == rest


def swe_make_safe(name: str, args: dict) -> dict:
    if name == "bash" and isinstance(args.get("command"), str):
        return {**args, "command": _printing(args["command"])}
    return args


def swe_guard(base, reply):
    """The reply as the env will parse it; any bash call that would run more than ``printf`` makes
    it a printing call instead (the text format makes every utterance a bash command)."""
    parsed = base.format.parse(reply, base.tools)
    for c in parsed.calls:
        cmd = c.arguments.get("command") if c.name == "bash" and isinstance(c.arguments, dict) else None
        if isinstance(cmd, str) and not _is_printing(cmd):
            text = reply.content if isinstance(reply, Message) else str(reply)
            return base.format.render_call(ToolCall("safe", "bash", {"command": _printing(text[:2000])}))
    return reply
