import threading
import time

import pytest

from turngym.tools import Tool, ToolRegistry, get_format, run_tools, tool
from turngym.tools.formats import MAX_ACTION_CHARS
from turngym.types import Message, ToolCall


@tool
def search(query: str, k: int = 3) -> str:
    """Search the corpus.

    Args:
        query: what to look for
        k: how many results
    """
    return f"{k} results for {query}"


@tool(timeout_s=0.2)
def sleepy(seconds: float) -> str:
    """Sleep."""
    time.sleep(seconds)
    return "awake"


def shout(text: str) -> str:
    """Repeat loudly."""
    return text.upper() * 1000


REG = ToolRegistry([search, sleepy, Tool.from_function(shout, max_output_chars=50)])


def test_schema_from_signature_and_mcp():
    assert search.parameters == {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "what to look for"},
            "k": {"type": "integer", "description": "how many results", "default": 3},
        },
        "required": ["query"],
        "additionalProperties": False,
    }
    assert search.description == "Search the corpus."
    assert search.to_mcp() == {"name": "search", "description": "Search the corpus.", "inputSchema": search.parameters}


def test_dispatch_pipeline_errors_are_results():
    ok = REG.dispatch(ToolCall("1", "search", {"query": "x"}))
    assert not ok.is_error and ok.content == "3 results for x"
    unknown = REG.dispatch(ToolCall("2", "rm", {}))
    assert unknown.is_error and "Available tools: search, sleepy, shout" in unknown.content
    bad = REG.dispatch(ToolCall("3", "search", {"query": 5}))
    assert bad.is_error and "query" in bad.content and "string" in bad.content
    extra = REG.dispatch(ToolCall("4", "search", {"query": "x", "evil": 1}))
    assert extra.is_error and "evil" in extra.content


def _nested(depth: int):
    v = "x"
    for _ in range(depth):
        v = [v]
    return v


@tool
def echo(text: str, options: dict | None = None) -> str:
    """Echo the text back (and the options, if any)."""
    return text + ("" if options is None else f" {options}")


@tool
def leak() -> str:
    """A tool whose output holds a lone surrogate."""
    return "bad \ud800 text"


HOSTILE = [
    ("non-string name", ToolCall("1", 123, {}), "must be a string"),
    ("None name", ToolCall("1", None, {}), "must be a string"),
    ("list name", ToolCall("1", ["echo"], {}), "must be a string"),
    ("dict name", ToolCall("1", {"a": 1}, {}), "must be a string"),
    ("surrogate in name", ToolCall("1", "ec\ud800ho", {}), "unknown tool"),
    ("huge name", ToolCall("1", "x" * 1_000_000, {}), "unknown tool"),
    ("None arguments", ToolCall("1", "echo", None), "must be a JSON object, not NoneType"),
    ("list arguments", ToolCall("1", "echo", ["hi"]), "must be a JSON object, not list"),
    ("number arguments", ToolCall("1", "echo", 3.5), "must be a JSON object, not float"),
    ("string arguments", ToolCall("1", "echo", '{"text": "hi"}'), "must be a JSON object, not str"),
    ("non-string key", ToolCall("1", "echo", {1: "hi"}), "keys must be strings"),
    ("surrogate in value", ToolCall("1", "echo", {"text": "a\udc80b"}), "not valid Unicode"),
    ("surrogate deep in value", ToolCall("1", "echo", {"text": "a", "options": {"k": ["\ud800"]}}), "options/k/0"),
    ("surrogate in key", ToolCall("1", "echo", {"te\ud800xt": "a"}), "not valid Unicode"),
    ("deeply nested", ToolCall("1", "echo", {"text": "a", "options": {"k": _nested(990)}}), "nested more than 32 deep"),
    ("deeply nested, schema would reject", ToolCall("1", "echo", {"text": _nested(5000)}), "nested more than 32 deep"),
    ("5000-digit integer", ToolCall("1", "echo", {"text": "a", "options": {"n": 10 ** 5000}}), "more than 64 bits"),
    ("an object", ToolCall("1", "echo", {"text": object()}), "object, which is not JSON"),
    ("a tuple", ToolCall("1", "echo", {"text": "a", "options": {"t": (1, 2)}}), "tuple, which is not JSON"),
    ("not a number", ToolCall("1", "echo", {"text": "a", "options": {"x": float("nan")}}), "not finite"),
    ("huge argument", ToolCall("1", "echo", {"text": "y" * 5_000_000}), "longer than 16384 characters"),
    ("wrong type", ToolCall("1", "echo", {"text": None}), "invalid arguments"),
    ("non-string id", ToolCall(7, "echo", None), "must be a JSON object"),
]


@pytest.mark.parametrize("name,call,message", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_dispatch_never_raises_on_hostile_calls(name, call, message):
    reg = ToolRegistry([echo, leak])
    result = reg.dispatch(call)
    assert result.is_error and message in result.content, result.content[:300]
    for text in (result.content, result.call_id, result.name):
        assert text is None or (isinstance(text, str) and text.encode("utf-8"))  # valid UTF-8 throughout
    assert len(result.content) < 2_000  # a huge name is not echoed back whole


def test_dispatch_output_is_valid_utf8_and_long_outputs_are_cut():
    reg = ToolRegistry([echo, leak])
    out = reg.dispatch(ToolCall("1", "leak", {}))
    assert not out.is_error and out.content == "bad \ufffd text"
    big = reg.dispatch(ToolCall("2", "echo", {"text": "y" * 16_000}))  # under the argument cap
    assert not big.is_error and "output truncated" in big.content


def test_plain_json_problem_by_hand():
    from turngym.tools.base import plain_json_problem

    assert plain_json_problem({"a": [1, 2.5, None, True, {"b": "c"}], "n": 2**63 - 1}) is None
    assert "64 bits" in plain_json_problem({"n": 2**64})
    assert "nested" in plain_json_problem({"a": _nested(33)}) and plain_json_problem({"a": _nested(31)}) is None
    # size: {"k": "xxxxxxxx"} counts 2 + (1 + 2) + (8 + 2) = 15 characters
    assert plain_json_problem({"k": "x" * 8}, max_chars=15) is None
    assert "longer than 14" in plain_json_problem({"k": "x" * 8}, max_chars=14)


def test_timeout_on_main_thread_and_in_threads():
    r = REG.dispatch(ToolCall("1", "sleepy", {"seconds": 5}))
    assert r.is_error and "timed out after 0.2s" in r.content
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("r", REG.dispatch(ToolCall("1", "sleepy", {"seconds": 5}))))
    th.start()
    th.join(timeout=3)
    assert out["r"].is_error and "timed out" in out["r"].content
    assert REG.dispatch(ToolCall("1", "sleepy", {"seconds": 0})).content == "awake"


def test_output_cap_says_what_was_dropped():
    r = REG.dispatch(ToolCall("1", "shout", {"text": "ab"}))
    assert r.content.startswith("AB" * 25) and "1950 more characters" in r.content


def test_raising_tool_becomes_error_result():
    def broken() -> str:
        """Breaks."""
        raise ValueError("disk on fire")

    r = ToolRegistry([Tool.from_function(broken)]).dispatch(ToolCall("1", "broken", {}))
    assert r.is_error and "ValueError: disk on fire" in r.content


@pytest.mark.parametrize("fmt", ["hermes", "openai", "xml"])
def test_render_then_parse_round_trips(fmt):
    f = get_format(fmt)
    call = ToolCall("call_0", "search", {"query": "who wrote <b>Dune</b>?", "k": 2})
    if fmt == "xml":  # multi-parameter tools take a JSON body in xml
        text = f.render_call(call)
        assert text.startswith("<search>{")
    parsed = f.parse(f.render_call(call), REG)
    assert parsed.errors == [] and parsed.calls[0].name == "search"
    assert parsed.calls[0].arguments == call.arguments


def test_hermes_multiple_calls_and_unclosed_block():
    f = get_format("hermes")
    text = 'think first <tool_call>{"name": "search", "arguments": {"query": "a"}}</tool_call>' \
           '<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"b\\"}"}'
    p = f.parse(text, REG, id_prefix="t3")
    assert [c.arguments["query"] for c in p.calls] == ["a", "b"]
    assert [c.id for c in p.calls] == ["t3_0", "t3_1"] and p.content == "think first"


def test_openai_format_accepts_messages_and_json():
    f = get_format("openai")
    msg = Message("assistant", "", tool_calls=[ToolCall("abc", "search", {"query": "q"})])
    assert f.parse(msg, REG).calls[0].id == "abc"
    text = f.render_call(ToolCall("xyz", "search", {"query": "q"}))
    assert f.parse(text, REG).calls[0] == ToolCall("xyz", "search", {"query": "q"})


def test_xml_single_value_coercion_and_think_tags():
    f = get_format("xml")
    reg = ToolRegistry([Tool("count", "count", {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}, lambda n: str(n * 2))])
    parsed, results = run_tools("<think>maybe <count>7</count></think> <count> 21 </count> <b><count>no</count></b>", reg, f)
    assert [r.content for r in results if not r.is_error] == ["42"]  # the call inside <think> did not run
    assert [r.is_error and "integer" in r.content for r in results] == [False, True]
    none = f.parse("<think>only thoughts</think><foo>x</foo>", reg)
    assert none.errors and "found tags: foo" in none.errors[0] and "<count>" in none.errors[0]


def test_text_format_uses_the_first_tool():
    f = get_format("text")
    p = f.parse("  go north  \nand more", REG)
    assert p.calls[0].name == "search" and p.calls[0].arguments == {"query": "go north"}
    assert f.parse("   ", REG).errors


def test_overlong_action_is_rejected_whole():
    for fmt in ("hermes", "openai", "xml", "text"):
        p = get_format(fmt).parse("x" * (MAX_ACTION_CHARS + 1), REG)
        assert p.errors and "limit" in p.errors[0] and not p.calls


def test_unknown_format_is_a_clear_error():
    with pytest.raises(ValueError, match="hermes"):
        get_format("yaml")


def test_fast_flat_validation_agrees_with_jsonschema():
    """The fast path for flat schemas must accept exactly what jsonschema accepts."""
    import itertools

    import jsonschema

    schema = {"type": "object", "properties": {"s": {"type": "string"}, "i": {"type": "integer"},
              "n": {"type": "number"}, "b": {"type": "boolean"}, "a": {"type": "array"}, "o": {"type": "object"},
              "z": {"type": "null"}, "any": {"description": "no type"}}, "required": ["s"], "additionalProperties": False}
    t = Tool("t", "t", schema, lambda **k: "")
    assert t._flat is not None
    values = ["x", 3, 3.0, 3.5, True, None, [1], {"k": 1}, -0.0]
    validator = jsonschema.Draft202012Validator(schema)
    for key, value in itertools.product(list(schema["properties"]) + ["extra"], values):
        args = {"s": "ok", key: value} if key != "s" else {"s": value}
        assert (t.validation_error(args) is None) == validator.is_valid(args), (key, value)
    assert t.validation_error({}) is not None and "s" in t.validation_error({})
    enum_tool = Tool("e", "e", {"type": "object", "properties": {"c": {"enum": ["a", "b"]}}}, lambda **k: "")
    assert enum_tool._flat is None and enum_tool.validation_error({"c": "z"}) is not None
