"""Chat assembly on real chat templates: incremental prompts, loss masks, and every way a fresh
tokenization of the finished conversation can differ from the recorded tokens.

The "policy" here writes known texts and records their canonical token ids, so that the recorded
sequence can be compared token for token with ``apply_chat_template`` + tokenize of the whole
conversation. The env is the real GuessEnv (tests/toy_envs.py), so tool results are real.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import toy_envs

from turngym.agents.base import Conversation
from turngym.agents.chat import STATE_KEY, ChatRenderer, chatml_tools_template
from turngym.tools.formats import get_format
from turngym.types import RECORD_KEY, Message, TokenRecord, ToolCall


def _trl_template(name: str) -> str:
    trl = pytest.importorskip("trl")
    path = Path(trl.__file__).parent / "chat_templates" / name
    if not path.exists():
        pytest.skip(f"this trl has no {name}")
    return path.read_text()


@pytest.fixture(scope="module")
def smollm2_template() -> str:
    from turngym.agents.default_model import original_chat_template

    try:
        return original_chat_template()
    except (ModuleNotFoundError, KeyError) as e:
        pytest.skip(f"SmolLM2 GGUF template unavailable: {e}")


def _call(fmt: str, n: int) -> str:
    return get_format(fmt).render_call(ToolCall("c", "guess", {"number": n}))


def _script(fmt: str) -> list[tuple[str, bool]]:
    """Ten turns for secret 8: wrong guesses, a text-only reply, a malformed call, then the answer.
    The flag says whether the "model" ended the turn with the EOS token (<|im_end|>)."""
    bad = {"hermes": "<tool_call>\n{not json}\n</tool_call>", "xml": "<guess>many</guess>", "text": "eight-ish"}[fmt]
    turns = [(_call(fmt, n), n % 2 == 0) for n in (1, 2, 3, 4)]
    turns += [("Let me think about it.", True), (bad, False)]
    turns += [(_call(fmt, n), n % 2 == 1) for n in (5, 6, 7)]
    return turns + [(_call(fmt, 8), False)]


def _play(renderer: ChatRenderer, fmt: str, script=None):
    """Drive GuessEnv for len(script) turns, recording canonical ids. Returns (conv, turns)."""
    env = toy_envs.GuessEnv(n_tasks=8, tool_format=fmt)
    obs, _ = env.reset(seed=0, options={"task_id": "8"})
    conv = Conversation(list(obs), env.tools.specs, fmt)
    eos = renderer.tokenizer.convert_tokens_to_ids("<|im_end|>")
    turns = []
    for text, with_eos in script or _script(fmt):
        prompt = renderer.prompt_ids(conv)
        action = renderer.encode(text) + ([eos] if with_eos else [])
        span = renderer.record(conv, action)
        obs, _, terminated, _, _ = env.step(text)
        turns.append(Played(prompt, action, span, list(obs)))
        conv.messages += [Message("assistant", text), *obs]
    return conv, turns


@dataclass
class Played:
    prompt_ids: list[int]
    action_ids: list[int]
    span: tuple[int, int]
    observation: list


def _fresh(renderer: ChatRenderer, conv: Conversation) -> list[int]:
    msgs, tools = renderer.chat_inputs(conv)
    return renderer.encode(renderer.render(msgs, tools, add_generation_prompt=True))


TEMPLATES = ["smollm2", "chatml_tools", "qwen2_5"]


def _template(name: str, smollm2_template: str) -> str:
    return {"smollm2": lambda: smollm2_template, "chatml_tools": chatml_tools_template,
            "qwen2_5": lambda: _trl_template("qwen2_5.jinja")}[name]()


@pytest.mark.parametrize("fmt", ["hermes", "xml", "text"])
@pytest.mark.parametrize("name", TEMPLATES)
def test_ten_turn_record_equals_fresh_tokenization(tiny_tokenizer, smollm2_template, name, fmt):
    renderer = ChatRenderer(tiny_tokenizer, _template(name, smollm2_template))
    conv, turns = _play(renderer, fmt)
    assert len(turns) == 10
    assert sum(bool(t.observation) for t in turns) == 10
    final = renderer.prompt_ids(conv)
    # Prefix property, turn by turn: prompt(k) + action(k) starts prompt(k+1).
    for a, b in zip(turns, turns[1:]):
        assert b.prompt_ids[: len(a.prompt_ids) + len(a.action_ids)] == a.prompt_ids + a.action_ids
    assert final[: len(turns[-1].prompt_ids)] == turns[-1].prompt_ids
    # ChatML puts special tokens at every edge, so the record is exactly a fresh tokenization.
    assert final == _fresh(renderer, conv)


def test_tools_are_rendered_in_the_envs_format(tiny_tokenizer, smollm2_template):
    env = toy_envs.GuessEnv(n_tasks=8)
    obs, _ = env.reset(seed=0, options={"task_id": "8"})
    spec_json = json.dumps(env.tools.specs[0].to_openai())
    # A template with tools=: the template writes them (same text as the hermes format's own).
    chatml = ChatRenderer(tiny_tokenizer, chatml_tools_template())
    assert chatml.supports_tools
    text = tiny_tokenizer.decode(chatml.prompt_ids(Conversation(list(obs), env.tools.specs, "hermes")))
    assert spec_json in text and "<tool_call>" in text
    # SmolLM2's own template ignores tools=: they go into the system message as format text.
    own = ChatRenderer(tiny_tokenizer, smollm2_template)
    assert not own.supports_tools
    text = tiny_tokenizer.decode(own.prompt_ids(Conversation(list(obs), env.tools.specs, "hermes")))
    assert get_format("hermes").render_tools(env.tools.specs) in text
    assert text.startswith("<|im_start|>system\nFind the number.\n\n# Tools")
    # xml is always shown as its own text, even where the template could render tools.
    text = tiny_tokenizer.decode(chatml.prompt_ids(Conversation(list(obs), env.tools.specs, "xml")))
    assert get_format("xml").render_tools(env.tools.specs) in text and spec_json not in text


def test_loss_mask_marks_exactly_the_sampled_tokens(tiny_tokenizer):
    renderer = ChatRenderer(tiny_tokenizer, chatml_tools_template())
    conv, turns = _play(renderer, "hermes")
    rec = conv.state[RECORD_KEY]
    assert conv.state[STATE_KEY].record is rec and rec.starts == [0]  # one segment
    assert sum(rec.loss_mask) == sum(len(t.action_ids) for t in turns)
    for t in turns:
        start, end = t.span
        assert rec.ids[start:end] == t.action_ids and rec.prompt(t.span) == t.prompt_ids
        assert set(rec.loss_mask[start:end]) == {1}
        assert rec.loss_mask[start - 1] == 0  # the generation prompt before it is env text
    # The closing <|im_end|> the model did not sample (stop-string turns) is masked out.
    im_end = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    sampled_ends = [i for i, t in enumerate(rec.ids) if t == im_end and rec.loss_mask[i] == 1]
    assert len(sampled_ends) == sum(bool(t.action_ids) and t.action_ids[-1] == im_end for t in turns)
    assert 0 < len(sampled_ends) < rec.ids.count(im_end)


def test_bpe_merge_at_the_action_edge_is_kept_as_sampled(tiny_tokenizer):
    """Case (b): an action starting with newlines. Fresh tokenization merges them with the
    generation prompt's newline; the record keeps what the model actually produced."""
    renderer = ChatRenderer(tiny_tokenizer, chatml_tools_template())
    script = [("\n\n" + _call("hermes", 8), False)]
    conv, turns = _play(renderer, "hermes", script)
    final, fresh = renderer.prompt_ids(conv), _fresh(renderer, conv)
    assert final != fresh
    assert tiny_tokenizer.decode(final) == tiny_tokenizer.decode(fresh)  # same text, different cut
    start = len(turns[0].prompt_ids)
    assert final[:start - 1] == fresh[:start - 1]  # only the edge token differs...
    assert final[start:][-20:] == fresh[-20:]  # ...and everything after the action agrees


def test_non_canonical_sampled_tokens_are_kept(tiny_tokenizer):
    """Case (a): the model spelled a word with other tokens than the tokenizer would."""
    renderer = ChatRenderer(tiny_tokenizer, chatml_tools_template())
    env = toy_envs.GuessEnv(n_tasks=8)
    obs, _ = env.reset(seed=0, options={"task_id": "8"})
    conv = Conversation(list(obs), env.tools.specs, "hermes")
    prompt = renderer.prompt_ids(conv)
    text = "Thinking"
    odd = [tiny_tokenizer.convert_tokens_to_ids(c) for c in text]  # one token per letter
    assert odd != renderer.encode(text) and tiny_tokenizer.decode(odd) == text
    renderer.record(conv, odd)
    obs, *_ = env.step(text)
    conv.messages += [Message("assistant", text), *obs]
    final = renderer.prompt_ids(conv)
    assert final[len(prompt): len(prompt) + len(odd)] == odd
    assert tiny_tokenizer.decode(final) == tiny_tokenizer.decode(_fresh(renderer, conv))


def test_trimming_template_keeps_sampled_whitespace(tiny_tokenizer):
    """Case (c): a template that trims assistant content. The record keeps the whitespace the
    model sampled; the prefix property still holds; fresh text differs only by that whitespace."""
    trimming = chatml_tools_template().replace(
        "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}",
        "{{- '<|im_start|>' + message.role + '\\n' + (message.content | trim) + '<|im_end|>' + '\\n' }}",
    )
    assert trimming != chatml_tools_template()
    renderer = ChatRenderer(tiny_tokenizer, trimming)
    script = [("  I will guess.  ", True), (_call("hermes", 8), False)]
    conv, turns = _play(renderer, "hermes", script)
    final = renderer.prompt_ids(conv)
    assert final[: len(turns[1].prompt_ids)] == turns[1].prompt_ids
    assert "  I will guess.  " in tiny_tokenizer.decode(final)
    fresh = tiny_tokenizer.decode(_fresh(renderer, conv))
    assert "\nI will guess.<|im_end|>" in fresh
    assert tiny_tokenizer.decode(final).replace("  I will guess.  ", "I will guess.") == fresh


def test_template_that_rewrites_earlier_reasoning(tiny_tokenizer):
    """Case (c): Qwen3's template re-renders earlier turns' <think> blocks. The record keeps the
    reasoning exactly as sampled and stays one prefix-consistent segment (no fallback)."""
    renderer = ChatRenderer(tiny_tokenizer, _trl_template("qwen3.jinja"))
    script = [("<think>low first</think>\n" + _call("hermes", 3), False), (_call("hermes", 8), False)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback re-render would warn
        conv, turns = _play(renderer, "hermes", script)
        final = renderer.prompt_ids(conv)
    assert conv.state[RECORD_KEY].starts == [0]
    assert "<think>low first</think>\n<tool_call>" in tiny_tokenizer.decode(final)
    assert "<think>low first</think>" not in tiny_tokenizer.decode(_fresh(renderer, conv))


def test_template_that_drops_the_reply_falls_back_to_a_new_segment(tiny_tokenizer):
    drop = "{% for m in messages %}{% if m.role != 'assistant' %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    renderer = ChatRenderer(tiny_tokenizer, drop)
    with pytest.warns(UserWarning, match="new segment"):
        conv, turns = _play(renderer, "hermes", [(_call("hermes", 3), True), (_call("hermes", 8), True)])
    assert conv.state[STATE_KEY].resets == 1
    rec = conv.state[RECORD_KEY]
    assert len(rec.starts) == 2 and rec.segment_start(turns[1].span[0]) == rec.starts[1]
    assert rec.prompt(turns[1].span) == turns[1].prompt_ids  # the re-rendered prompt, on its own


def test_asking_again_without_new_messages_resamples_the_same_turn(tiny_tokenizer):
    renderer = ChatRenderer(tiny_tokenizer, chatml_tools_template())
    conv, turns = _play(renderer, "hermes", [(_call("hermes", 3), True)])
    p1 = renderer.prompt_ids(conv)
    renderer.record(conv, renderer.encode("first try"))
    p2 = renderer.prompt_ids(conv)
    assert p1 == p2
    renderer.record(conv, renderer.encode("second try"))
    assert tiny_tokenizer.decode(conv.state[STATE_KEY].ids).endswith("assistant\nsecond try")


def test_edited_conversation_is_rendered_afresh(tiny_tokenizer):
    renderer = ChatRenderer(tiny_tokenizer, chatml_tools_template())
    conv, _ = _play(renderer, "hermes", [(_call("hermes", 3), True)])
    renderer.prompt_ids(conv)
    conv.messages[1] = Message("user", "A different task.")
    again = renderer.prompt_ids(conv)
    assert again == _fresh(renderer, conv)
    assert "A different task." in tiny_tokenizer.decode(again)


def test_record_add_turn_starts_a_segment_where_prompts_stop_extending():
    """A policy given whole prompts (an HTTP server's) records turns with ``add_turn``."""
    rec = TokenRecord()
    spans = [rec.add_turn([1, 2], [3], [-0.5]), rec.add_turn([1, 2, 3, 4], [5, 6], [-0.1, -0.2]),
             rec.add_turn([9], [7], [-0.3])]
    assert rec.ids == [1, 2, 3, 4, 5, 6, 9, 7] and rec.starts == [0, 6]
    assert rec.loss_mask == [0, 0, 1, 0, 1, 1, 0, 1]
    assert rec.logprobs == [0.0, 0.0, -0.5, 0.0, -0.1, -0.2, 0.0, -0.3]
    assert spans == [(2, 3), (4, 6), (7, 8)]
    assert [rec.prompt(s) for s in spans] == [[1, 2], [1, 2, 3, 4], [9]]
