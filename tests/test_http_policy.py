"""OpenAIPolicy against a local OpenAI-compatible stub server (127.0.0.1, started per test).

The stub stands in for a remote service only: it answers with scripted replies, delays and errors so
that timeouts, retries and concurrency limits can be observed from the server side.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import toy_envs

from turngym.agents.base import Conversation, SamplingParams
from turngym.agents.http import OpenAIPolicy, PolicyHTTPError
from turngym.agents.registry import make_agent
from turngym.types import Message


def _reply(content="", tool_calls=None, logprobs=None, finish="stop", **choice_extra) -> dict:
    msg = {"role": "assistant", "content": content}
    if tool_calls:
        msg["tool_calls"] = tool_calls
    choice = {"index": 0, "message": msg, "finish_reason": finish, **choice_extra}
    if logprobs is not None:
        choice["logprobs"] = {"content": [{"token": t, "logprob": lp} for t, lp in logprobs]}
    return {"id": "x", "object": "chat.completion", "choices": [choice]}


class Stub:
    """A scripted chat-completions server. ``script`` items: a dict (200 JSON), an int (that
    status), or ("sleep", seconds, item). When the script runs out, the last item repeats."""

    def __init__(self, script, delay_s: float = 0.0):
        self.script, self.delay_s = list(script), delay_s
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
                    self._send(item)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout): nothing to answer
                finally:
                    with stub.lock:
                        stub.inflight -= 1

            def _send(self, item):
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

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub():
    made = []

    def make(script, delay_s=0.0):
        s = Stub(script, delay_s)
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
    u = pol.act([conv], SamplingParams(temperature=0.5, max_new_tokens=20, seed=4))[0]
    assert u.text == '<tool_call>\n{"name": "guess", "arguments": {"number": 3}}\n</tool_call>'
    assert u.logprobs == [-0.25, -1.5] and u.finish_reason == "tool_calls"
    assert u.prompt_ids == [] and u.action_ids == []
    body = s.bodies[0]
    assert body["path"] == "/v1/chat/completions" and body["auth"] == "Bearer k"
    assert body["model"] == "test-model" and body["logprobs"] is True and body["seed"] == 4
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


def test_timeout_is_retried(stub):
    s = stub([("sleep", 1.0, _reply("late")), _reply("on time")])
    pol = _policy(s, timeout_s=0.3, max_retries=2)
    u = pol.act([_guess_conv()[0]])[0]
    assert u.text == "on time"
    assert pol.stats == {"requests": 2, "retries": 1}


def test_5xx_then_success(stub):
    s = stub([503, 500, _reply("fine")])
    pol = _policy(s, max_retries=3)
    assert pol.act([_guess_conv()[0]])[0].text == "fine"
    assert pol.stats == {"requests": 3, "retries": 2} and len(s.bodies) == 3


def test_5xx_exhausted_is_a_clear_error(stub):
    s = stub([502])
    pol = _policy(s, max_retries=2)
    with pytest.raises(PolicyHTTPError, match=r"failed after 3 attempts; last error: HTTP 502"):
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
