"""Fuzz the tool-call pipeline: malformed and adversarial utterances never raise, never run code,
and always come back to the agent as error observations."""

import json
import random

import pytest

import turngym
from turngym.tools import get_format, run_tools

DANGEROUS = [
    "__import__('os').system('touch {canary}')",
    "eval(\"open('{canary}','w')\")",
    "exec('import os; os.system(\"touch {canary}\")')",
    "$(touch {canary})",
    "`touch {canary}`",
    "{{{{ cycler.__init__.__globals__.os.popen('touch {canary}') }}}}",
    "'; DROP TABLE users; --",
    "${{jndi:ldap://127.0.0.1/x}}",
    "lambda: open('{canary}', 'w')",
    "().__class__.__bases__[0].__subclasses__()",
]
UNKNOWN_NAMES = ["rm", "os.system", "__import__", "eval", "guess ", "GUESS", "gue\u0073s\u200b", "", "exec", "a" * 500]
BAD_VALUES = ['"3"', "[3]", '{"n": 3}', "null", "true", "3.5", "-0.5e-3", '"three"', "NaN", "Infinity",
              "1" * 5000, '"' + "9" * 100000 + '"', "[" * 2000 + "]" * 2000]


def _is_broken_json(s):
    try:
        json.loads(s)
    except ValueError:
        return True
    return False


def _valid_args(rng):
    return {"number": rng.randint(1, 8)}


def hermes_cases(rng, canary):
    good = json.dumps({"name": "guess", "arguments": _valid_args(rng)})
    cases = []
    for _ in range(120):  # broken JSON: truncated or with a random character removed/inserted
        cut = rng.randint(0, len(good) - 2)
        cases.append(f"<tool_call>{good[:cut]}</tool_call>")
        i = rng.randint(0, len(good) - 1)
        mutated = good[:i] + rng.choice(['"', "{", "}", ",", ":", "\\", "\x00"]) + good[i + 1:]
        if _is_broken_json(mutated):
            cases.append(f"<tool_call>{mutated}</tool_call>")
    cases += [f'<tool_call>{{"name": {json.dumps(n)}, "arguments": {{"number": 1}}}}</tool_call>' for n in UNKNOWN_NAMES]
    cases += [f'<tool_call>{{"name": "guess", "arguments": {{"number": {v}}}}}</tool_call>' for v in BAD_VALUES]
    cases += [f'<tool_call>{{"name": "guess", "arguments": {{"number": {json.dumps(d.format(canary=canary))}}}}}</tool_call>' for d in DANGEROUS]
    cases += [f'<tool_call>{{"name": {json.dumps(d.format(canary=canary))}, "arguments": {{}}}}</tool_call>' for d in DANGEROUS]
    cases += [f"<tool_call>{d.format(canary=canary)}</tool_call>" for d in DANGEROUS]
    cases += [
        "", " ", "\n\n", "\x00\x01\x02", "\ud800", "<tool_call></tool_call>", "<tool_call>", "</tool_call>",
        "<tool_call><tool_call>" + good + "</tool_call></tool_call>",
        '<tool_call>{"name": "guess"}</tool_call>',  # missing required argument
        '<tool_call>{"name": "guess", "arguments": {"number": 1, "extra": 2}}</tool_call>',
        '<tool_call>{"name": "guess", "arguments": [1]}</tool_call>',
        '<tool_call>{"name": "guess", "arguments": "not json"}</tool_call>',
        '<tool_call>["guess", 1]</tool_call>', "<tool_call>42</tool_call>",
        "<tool_call>" + "x" * 20000 + "</tool_call>",
        '<tool_call>{"name": "guess", "arguments": {"number": "' + "A" * 15000 + '"}}</tool_call>',
        "I think the answer is 4.", "guess(4)", "<guess>4</guess>", json.dumps({"name": "guess", "arguments": {"number": 4}}),
    ]
    return cases


def openai_cases(rng, canary):
    def wrap(fn):
        return json.dumps({"content": "", "tool_calls": [{"id": "c1", "type": "function", "function": fn}]})

    cases = []
    good = wrap({"name": "guess", "arguments": json.dumps(_valid_args(rng))})
    for _ in range(120):
        cut = rng.randint(0, len(good) - 2)
        cases.append(good[:cut])
        i = rng.randint(0, len(good) - 1)
        mutated = good[:i] + rng.choice(["{", "}", ",", ":", "]", "\\"]) + good[i + 1:]
        if _is_broken_json(mutated):
            cases.append(mutated)
    cases += [wrap({"name": n, "arguments": '{"number": 1}'}) for n in UNKNOWN_NAMES]
    cases += [wrap({"name": "guess", "arguments": '{"number": ' + v + "}"}) for v in BAD_VALUES]
    cases += [wrap({"name": "guess", "arguments": json.dumps({"number": d.format(canary=canary)})}) for d in DANGEROUS]
    cases += [wrap({"name": d.format(canary=canary), "arguments": "{}"}) for d in DANGEROUS]
    cases += [
        "", "{}", "[]", "null", '{"tool_calls": []}', '{"tool_calls": "guess"}', '{"tool_calls": [null]}',
        '{"tool_calls": [{"function": null}]}', '{"tool_calls": [{"function": {"name": 5}}]}',
        wrap({"name": "guess", "arguments": "[1, 2]"}), wrap({"name": "guess", "arguments": "{bad"}),
        wrap({"name": "guess"}), "[" * 10000, '{"a":' * 5000,
    ]
    return cases


def xml_cases(rng, canary):
    cases = [f"<guess>{v}</guess>" for v in ["", "four", "4.5", "4 5", "0x4", "[4]", "None", "1e400", "\x00"]]
    cases += [f"<guess>{d.format(canary=canary)}</guess>" for d in DANGEROUS]
    cases += [f"<{n}>4</{n}>" for n in ["rm", "eval", "GUESS", "guesss", "tool_call"]]
    cases += ["<guess><guess>4</guess></guess>", "<guess>4", "guess>4</guess>", "<think><guess>4</guess></think>",
              "<guess>" + "9" * 10000 + "</guess>", "<guess>" + "<" * 5000 + "</guess>", "no tags at all", ""]
    letters = "abcdefghijklmnopqrstuvwxyz<>/ {}\"'"
    for _ in range(300):  # random junk with tag-like characters
        cases.append("".join(rng.choice(letters) for _ in range(rng.randint(0, 80))))
    return cases


def text_cases(rng, canary):
    cases = [d.format(canary=canary) for d in DANGEROUS] + ["", "   ", "four", "4.5", "1e3", "0x10", "\x00", "9" * 5000]
    for _ in range(200):
        s = "".join(rng.choice("abc xyz!?<>{}'\"") for _ in range(rng.randint(0, 40)))
        cases.append(s)
    return cases


GENERATORS = {"hermes": hermes_cases, "openai": openai_cases, "xml": xml_cases, "text": text_cases}


def test_fuzz_corpus_is_large_and_every_case_is_an_error_observation(tmp_path):
    canary = tmp_path / "pwned"
    rng = random.Random(1234)
    total = 0
    for fmt, gen in GENERATORS.items():
        env = turngym.make("tests/Guess-v0", tool_format=fmt, max_turns=10**6)
        env.reset(seed=0, options={"task_id": "4"})
        for case in gen(rng, canary):
            obs, reward, terminated, truncated, info = env.step(case)
            total += 1
            assert info["action_valid"] is False, (fmt, case[:200])
            assert obs and any(m.content.startswith("Error") for m in obs), (fmt, case[:200], obs)
            assert not terminated and reward == 0.0
            json.dumps(info)  # info stays serialisable whatever came in
        env.close()
    assert total >= 1000, total
    assert not canary.exists(), "model output was executed"


@pytest.mark.parametrize("fmt", sorted(GENERATORS))
def test_pipeline_never_raises_on_random_bytes(fmt):
    reg = turngym.make("tests/Guess-v0").unwrapped.tools
    rng = random.Random(fmt)
    for _ in range(300):
        junk = "".join(chr(rng.randint(0, 0x2FFF)) for _ in range(rng.randint(0, 200)))
        parsed, results = run_tools(junk, reg, get_format(fmt))
        assert all(isinstance(r.content, str) for r in results)
