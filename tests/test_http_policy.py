"""OpenAIPolicy against a local OpenAI-compatible stub server (127.0.0.1, started per test).

These are protocol tests of our client, not fakes of a model: the stub answers with scripted
replies, delays and errors so that timeouts, retries and concurrency limits can be observed from the
server side. Its ``flavor`` reproduces how real servers treat vLLM's ``return_token_ids`` field:
``vllm`` returns ``prompt_token_ids`` and the choice's ``token_ids`` only when asked (the field
names of vLLM's ChatCompletionResponse), ``openai`` rejects the unknown field with a 400 as
OpenAI's API does, and ``plain`` ignores it (``transformers serve``).
"""

from __future__ import annotations

import json
import threading
import time
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import toy_envs

from turngym.agents.base import Conversation, SamplingParams
from turngym.agents.http import OpenAIPolicy, PolicyHTTPError
from turngym.agents.registry import make_agent
from turngym.types import RECORD_KEY, Message


def _reply(content="", tool_calls=None, logprobs=None, finish="stop", **choice_extra) -> dict:
    msg = {"role": "assistant", "content": content}
    if tool_calls:
        msg["tool_calls"] = tool_calls
    choice = {"index": 0, "message": msg, "finish_reason": finish, **choice_extra}
    if logprobs is not None:
        choice["logprobs"] = {"content": [{"token": t, "logprob": lp} for t, lp in logprobs]}
    return {"id": "x", "object": "chat.completion", "choices": [choice]}


def _vllm_reply(content, ids, lps, prompt_ids, finish="stop") -> dict:
    """A reply as vLLM's OpenAI server builds it with ``return_token_ids`` and ``logprobs``."""
    out = _reply(content, logprobs=[(f"t{i}", lp) for i, lp in zip(ids, lps)], finish=finish, token_ids=list(ids))
    out["prompt_token_ids"] = list(prompt_ids)
    return out


OPENAI_REJECTS = {"error": {"message": "Unrecognized request argument supplied: return_token_ids",
                            "type": "invalid_request_error", "param": None, "code": None}}


class Stub:
    """A scripted chat-completions server. ``script`` items: a dict (200 JSON), an int (that
    status), ("sleep", seconds, item), or "drop" (close the connection without answering). When the
    script runs out, the last item repeats. ``flavor``: see the module docstring."""

    def __init__(self, script, delay_s: float = 0.0, flavor: str = "plain"):
        self.script, self.delay_s, self.flavor = list(script), delay_s, flavor
        self.bodies: list[dict] = []
        self.inflight = self.max_inflight = 0
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with stub.lock:
                    stub.bodies.append({"path": self.path, "auth": self.headers.get("Authorization"), **body})
                    item = stub.script.pop(0) if len(stub.script) > 1 else stub.script[0]
                    stub.inflight += 1
                    stub.max_inflight = max(stub.max_inflight, stub.inflight)
                try:
                    time.sleep(stub.delay_s)
                    if isinstance(item, tuple) and item[0] == "sleep":
                        time.sleep(item[1])
                        item = item[2]
                    if item == "drop":
                        self.close_connection = True
                        return
                    self._send(stub.flavored(body, item))
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout): nothing to answer
                finally:
                    with stub.lock:
                        stub.inflight -= 1

            def _send(self, item):
                if isinstance(item, tuple):
                    status, payload = item
                else:
                    status, payload = (200, item) if isinstance(item, dict) else (item, {"error": {"message": f"status {item}"}})
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def flavored(self, body, item):
        if self.flavor == "openai" and "return_token_ids" in body:
            return 400, OPENAI_REJECTS
        if isinstance(item, dict) and not (self.flavor == "vllm" and body.get("return_token_ids")):
            item = json.loads(json.dumps(item))  # vLLM sends ids only when asked
            item.pop("prompt_token_ids", None)
            for c in item.get("choices", []):
                c.pop("token_ids", None)
        return item

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub():
    made = []

    def make(script, delay_s=0.0, flavor="plain"):
        s = Stub(script, delay_s, flavor)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def _guess_conv(fmt="hermes") -> tuple[Conversation, toy_envs.GuessEnv]:
    env = toy_envs.GuessEnv(n_tasks=8, tool_format=fmt)
    obs, _ = env.reset(seed=0, options={"task_id": "5"})
    return Conversation(list(obs), env.tools.specs, fmt), env


def _policy(s, **kw) -> OpenAIPolicy:
    kw.setdefault("backoff_s", 0.01)
    return OpenAIPolicy(s.url, "test-model", api_key="k", **kw)


def test_native_tool_call_reply_is_written_in_the_envs_format(stub):
    call = {"id": "call_1", "type": "function", "function": {"name": "guess", "arguments": '{"number": 3}'}}
    s = stub([_reply("", [call], logprobs=[("a", -0.25), ("b", -1.5)], finish="tool_calls")])
    conv, env = _guess_conv()
    pol = _policy(s)
    with pytest.warns(UserWarning, match="returns no token ids; recording text only"):
        u = pol.act([conv], SamplingParams(temperature=0.5, max_new_tokens=20, seed=4))[0]
    assert u.text == '<tool_call>\n{"name": "guess", "arguments": {"number": 3}}\n</tool_call>'
    assert u.finish_reason == "tool_calls"
    # Log-probs without their token ids cannot train anything: the turn is text only.
    assert u.prompt_ids == [] and u.action_ids == [] and u.logprobs == []
    body = s.bodies[0]
    assert body["path"] == "/v1/chat/completions" and body["auth"] == "Bearer k"
    assert body["model"] == "test-model" and body["logprobs"] is True and body["seed"] == 4
    assert body["return_token_ids"] is True
    assert body["temperature"] == 0.5 and body["max_tokens"] == 20
    assert body["tools"][0]["function"]["name"] == "guess"
    # The env accepts the rendered call as a valid action.
    _, _, _, _, info = env.step(u.text)
    assert info["action_valid"]


def test_history_becomes_openai_tool_messages_with_the_envs_ids(stub):
    s = stub([_reply("ok")])
    conv, env = _guess_conv()
    action = '<tool_call>\n{"name": "guess", "arguments": {"number": 3}}\n</tool_call>'
    obs, *_ = env.step(action)
    conv.messages += [Message("assistant", action), *obs]
    _policy(s).act([conv])
    msgs = s.bodies[0]["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool"]
    assert msgs[2]["tool_calls"][0]["id"] == "t1_0" == msgs[3]["tool_call_id"] == obs[0].tool_call_id
    assert json.loads(msgs[2]["tool_calls"][0]["function"]["arguments"]) == {"number": 3}
    assert msgs[3]["content"] == "higher"


def test_xml_env_gets_tools_as_text_and_stop_strings(stub):
    s = stub([_reply("<guess>4", stop_reason="</guess>")])
    conv, _ = _guess_conv("xml")
    u = _policy(s).act([conv], SamplingParams(stop=["END"]))[0]
    body = s.bodies[0]
    assert "tools" not in body and body["stop"] == ["END", "</guess>"]
    assert "<guess>number</guess>" in body["messages"][0]["content"]
    assert u.text == "<guess>4</guess>"  # vLLM's stop_reason puts the cut stop string back


def test_5xx_then_success(stub):
    s = stub([503, 500, _reply("fine")])
    pol = _policy(s, max_retries=3)
    assert pol.act([_guess_conv()[0]])[0].text == "fine"
    assert pol.stats == {"requests": 3, "retries": 2} and len(s.bodies) == 3


def test_5xx_exhausted_is_a_clear_error(stub):
    s = stub([503])
    pol = _policy(s, max_retries=2)
    with pytest.raises(PolicyHTTPError, match=r"failed after 3 attempts; last error: HTTP 503"):
        pol.act([_guess_conv()[0]])
    assert len(s.bodies) == 3


def test_4xx_is_not_retried(stub):
    s = stub([400, _reply("never")])
    pol = _policy(s, max_retries=3)
    with pytest.raises(PolicyHTTPError, match="HTTP 400.*not retried"):
        pol.act([_guess_conv()[0]])
    assert len(s.bodies) == 1


def test_connection_refused_is_retried_then_reported(stub):
    s = stub([_reply("x")])
    url = s.url
    s.close()
    pol = OpenAIPolicy(url, "m", max_retries=1, backoff_s=0.01, timeout_s=1.0)
    with pytest.raises(PolicyHTTPError, match="failed after 2 attempts; last error: ConnectError"):
        pol.act([_guess_conv()[0]])


def test_concurrency_limit_is_respected(stub):
    s = stub([_reply("a")], delay_s=0.3)
    pol = _policy(s, concurrency=3)
    convs = [_guess_conv()[0] for _ in range(7)]
    out = pol.act(convs)
    assert [u.text for u in out] == ["a"] * 7
    assert s.max_inflight == 3


def test_registry_builds_it_from_a_spec(stub, monkeypatch):
    s = stub([_reply("hi")])
    monkeypatch.setenv("OPENAI_API_KEY", "from-env")
    pol = make_agent(f"openai:{s.url}#served-model")
    assert pol.act([_guess_conv()[0]])[0].text == "hi"
    assert s.bodies[0]["model"] == "served-model" and s.bodies[0]["auth"] == "Bearer from-env"
    with pytest.raises(ValueError, match="openai:URL#MODEL"):
        make_agent("openai:http://nowhere/v1")


# ----- exact tokens --------------------------------------------------------------------------
def test_vllm_flavor_gives_exact_tokens_that_make_a_valid_turn(stub):
    s = stub([_vllm_reply("<guess>4", [11, 12, 13], [-0.5, -0.25, -2.0], [1, 2, 3, 4], finish="stop")], flavor="vllm")
    conv, _ = _guess_conv("xml")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a server with ids gets no text-only warning
        u = _policy(s).act([conv])[0]
    assert s.bodies[0]["return_token_ids"] is True and s.bodies[0]["logprobs"] is True
    assert u.prompt_ids == [1, 2, 3, 4] and u.action_ids == [11, 12, 13] and u.logprobs == [-0.5, -0.25, -2.0]
    # The failure this fixes: "Turn has 0 action_ids but 24 logprobs": the record holds all three.
    rec = conv.state[RECORD_KEY]
    assert rec.ids[u.span[0] : u.span[1]] == [11, 12, 13] and rec.logprobs[u.span[0] : u.span[1]] == [-0.5, -0.25, -2.0]


def test_plain_server_without_ids_is_text_only_and_warns_once(stub):
    s = stub([_reply("a", logprobs=[("a", -0.1)])])
    pol = _policy(s, concurrency=1)
    with pytest.warns(UserWarning) as record:
        out = pol.act([_guess_conv()[0] for _ in range(3)])
    assert [str(w.message) for w in record if "no token ids" in str(w.message)] == [
        f"{s.url}/chat/completions returns no token ids; recording text only (no token ids or log-probs, "
        "so these trajectories are not trainable)"]
    assert all(u.text == "a" and u.action_ids == [] and u.logprobs == [] and u.prompt_ids == [] for u in out)
    assert out[0].span is None and out[0].record is None  # text only: nothing in a record


def test_server_rejecting_the_field_is_asked_again_without_it_then_never(stub):
    s = stub([_reply("ok")], flavor="openai")
    pol = _policy(s)
    with pytest.warns(UserWarning, match="rejects return_token_ids; recording text only"):
        first = pol.act([_guess_conv()[0]])[0]
    second = pol.act([_guess_conv()[0]])[0]
    assert first.text == second.text == "ok" and first.action_ids == []
    assert ["return_token_ids" in b for b in s.bodies] == [True, False, False]


def test_strict_token_ids_make_a_server_without_them_an_error(stub):
    s = stub([_reply("a")])
    with pytest.raises(PolicyHTTPError, match="no token_ids although return_token_ids was requested"):
        _policy(s, return_token_ids=True).act([_guess_conv()[0]])
    s2 = stub([_reply("a")], flavor="openai")
    with pytest.raises(PolicyHTTPError, match="HTTP 400.*not retried"):
        _policy(s2, return_token_ids=True).act([_guess_conv()[0]])
    assert len(s2.bodies) == 1


def test_token_ids_false_never_asks(stub):
    s = stub([_vllm_reply("x", [5], [-1.0], [1])], flavor="vllm")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        u = _policy(s, return_token_ids=False).act([_guess_conv()[0]])[0]
    assert "return_token_ids" not in s.bodies[0] and u.action_ids == [] and u.logprobs == []


def test_logprobs_of_another_length_are_dropped_and_the_ids_kept(stub):
    reply = _vllm_reply("x", [5, 6], [-1.0], [1])
    s = stub([reply], flavor="vllm")
    with pytest.warns(UserWarning, match="returned 1 log-probs for 2 tokens"):
        u = _policy(s).act([_guess_conv()[0]])[0]
    assert u.action_ids == [5, 6] and u.logprobs == [] and u.prompt_ids == [1]


# ----- no duplicated generations ---------------------------------------------------------------
def _settled(s, deadline_s=30.0):
    """Wait until the stub has no request in flight (a hang guard, not a timing assertion)."""
    end = time.monotonic() + deadline_s
    while s.inflight and time.monotonic() < end:
        time.sleep(0.05)
    assert s.inflight == 0


def test_a_late_reply_is_not_retried_so_the_server_generates_once(stub):
    s = stub([("sleep", 1.5, _reply("late"))])
    pol = _policy(s, timeout_s=0.3, max_retries=3)
    with pytest.raises(PolicyHTTPError, match=r"no reply within timeout=0.3s.*not retried.*still be generating"):
        pol.act([_guess_conv()[0]])
    _settled(s)
    assert len(s.bodies) == 1 and pol.stats == {"requests": 1, "retries": 0}


def test_without_a_read_timeout_a_slow_generation_is_awaited_once(stub):
    s = stub([("sleep", 1.0, _reply("slow but sure"))])
    pol = _policy(s, max_retries=3)  # default: no read timeout, only a connect timeout
    assert pol.client.timeout.read is None and pol.client.timeout.connect == 10.0
    out = pol.act([_guess_conv()[0] for _ in range(4)])
    assert [u.text for u in out] == ["slow but sure"] * 4
    assert len(s.bodies) == 4 and pol.stats["retries"] == 0


@pytest.mark.parametrize("item", [502, 504, "drop"])
def test_gateway_errors_and_dropped_connections_are_not_retried(stub, item):
    s = stub([item, _reply("never")])
    pol = _policy(s, max_retries=3)
    with pytest.raises(PolicyHTTPError, match="not retried"):
        pol.act([_guess_conv()[0]])
    _settled(s)
    assert len(s.bodies) == 1


def test_429_is_retried(stub):
    s = stub([429, _reply("fine")])
    pol = _policy(s, max_retries=1)
    assert pol.act([_guess_conv()[0]])[0].text == "fine" and len(s.bodies) == 2


# ----- the spec ---------------------------------------------------------------------------------
def test_spec_sets_timeout_retries_concurrency_and_token_ids(stub):
    s = stub([_reply("hi")])
    pol = make_agent(f"openai:{s.url}#org/model-7b?timeout=120&connect_timeout=2.5&retries=1&concurrency=4"
                     "&backoff=0.01&token_ids=false&native_tools=false")
    assert pol.model == "org/model-7b" and pol.max_retries == 1 and pol.concurrency == 4
    assert pol.client.timeout.read == 120.0 and pol.client.timeout.connect == 2.5 and pol.backoff_s == 0.01
    assert pol.return_token_ids is False and pol.native_tools is False
    assert make_agent(f"openai:{s.url}#m?timeout=none").client.timeout.read is None
    assert make_agent(f"openai:{s.url}#m?token_ids=auto").return_token_ids is None
    assert make_agent(f"openai:{s.url}#m?token_ids=true").return_token_ids is True
    with pytest.raises(ValueError, match="unknown openai: option 'timout'"):
        make_agent(f"openai:{s.url}#m?timout=3")
    with pytest.raises(ValueError, match="retries='two' is not a int"):
        make_agent(f"openai:{s.url}#m?retries=two")
    with pytest.raises(ValueError, match="token_ids='maybe' is not a auto or bool"):
        make_agent(f"openai:{s.url}#m?token_ids=maybe")
