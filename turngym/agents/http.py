"""``OpenAIPolicy``: an OpenAI-compatible chat-completions endpoint (OpenAI, vLLM serve, llama.cpp,
``transformers serve``...) as a turngym policy.

- Spec: ``openai:URL#MODEL?key=value&...`` (``OpenAIPolicy.from_spec``), e.g.
  ``openai:http://127.0.0.1:8000/v1#Qwen/Qwen2.5-7B-Instruct?timeout=300&retries=2&concurrency=4``.
  Keys: ``timeout`` (seconds to wait for a reply, ``none`` = no limit, the default),
  ``connect_timeout``, ``retries``, ``backoff``, ``concurrency``, ``token_ids`` (``auto`` | ``true`` |
  ``false``), ``native_tools`` (``true`` | ``false``). An unknown key is an error.
- Retries never duplicate a generation (see ``_post``): only a request that never reached the server,
  or that the server itself refused or failed (429, 500, 503), is sent again. A reply that is late
  is not: the server may still be generating it.
- Concurrency: the conversations of one ``act`` call are sent by a thread pool of ``concurrency``
  workers over one shared ``httpx.Client``.
- Tools: for ``hermes``/``openai`` envs they go as native ``tools=[...]`` (``native_tools=True``);
  calls the server returns are written back in the env's own format with ``render_call``, so the
  env parses them as usual. The history is converted the other way: an assistant message whose text
  holds calls becomes an OpenAI ``tool_calls`` message with the env's call ids (``t{turn}_{i}``).
  For ``xml``/``text`` envs, tools are described in the system message as text.
- Tokens: each request asks for log-probs (``logprobs: true``) and token ids (vLLM's
  ``return_token_ids: true``; the reply then carries ``prompt_token_ids`` at the top level and
  ``token_ids`` in the choice). With both, the prompt ids, ``action_ids`` and ``logprobs`` are the
  server's exact record (added to the episode's ``TokenRecord``) and the trajectory is trainable; for vLLM the log-probs are the raw model
  ones by default (``--logprobs-mode``). A server that rejects the field is asked again without it;
  a server that returns no ids gets a one-time warning and the utterance is recorded as text only
  (no ids, no log-probs), so a ``Turn`` never holds log-probs without their tokens.
  Over several turns, the prompt ids are what the server's chat template made of the history, which
  can differ from the tokens sampled before (re-tokenization: the record then starts a new segment);
  ``vllm:`` keeps one incremental token record.
"""

from __future__ import annotations

import json
import random
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import parse_qsl

import httpx

from turngym.agents.base import Conversation, SamplingParams
from turngym.tools.base import ToolRegistry
from turngym.tools.formats import format_stops, get_format
from turngym.types import RECORD_KEY, Message, ToolCall, TokenRecord, Utterance

# The retry rule. A request is sent again only when the server provably is not generating for it:
# - the connection never opened (connect error or timeout, no pooled connection free in time), so
#   nothing reached the server;
# - the server itself answered 429, 500 or 503: it refused the request or failed it, and is done.
# Everything else fails at once. A read timeout or a connection dropped mid-reply (ReadTimeout,
# ReadError, RemoteProtocolError) can leave the generation running on the server, and a gateway's
# 502/504 can too (its upstream may still be working); re-sending would run the same generation
# twice (measured against a slow server with a 60 s timeout: 10 requests received, 2 completed).
# That is also why generation has no read timeout by default, only a connect timeout.
RETRY_STATUS = {429, 500, 503}
NEVER_STARTED = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)

SPEC_KEYS = {
    "timeout": ("timeout_s", "float|none"),
    "connect_timeout": ("connect_timeout_s", "float"),
    "retries": ("max_retries", "int"),
    "backoff": ("backoff_s", "float"),
    "concurrency": ("concurrency", "int"),
    "token_ids": ("return_token_ids", "auto|bool"),
    "native_tools": ("native_tools", "bool"),
}


class PolicyHTTPError(RuntimeError):
    """The endpoint failed for good: a non-retryable status or error, or retries exhausted."""


class OpenAIPolicy:
    """A chat-completions endpoint answering conversations concurrently.

    Args:
        base_url: Up to and including ``/v1`` (``http://127.0.0.1:8000/v1``).
        model: Model name sent with each request.
        api_key: Bearer token (None: no Authorization header).
        timeout_s: How long to wait for a reply (read/write), None for no limit. A late reply is
            an error and is never retried (the server may still be generating it).
        connect_timeout_s: How long to wait for a connection; a failed connect is retried.
        max_retries: Retries after the first attempt, for requests that never started only.
        backoff_s: First retry delay; it doubles each retry (plus up to 10% jitter).
        concurrency: Requests in flight at once.
        native_tools: Send tools as OpenAI ``tools`` for hermes/openai envs.
        return_token_ids: None (auto): ask for token ids, fall back to text only (warned once) where
            the server has none. True: a reply without token ids is an error. False: never ask.
        extra_body: Merged into every request body (e.g. ``{"include_stop_str_in_output": True}``
            for vLLM, so the stop string stays in the text).

    Raises:
        ValueError: ``concurrency`` or ``max_retries`` out of range.
    """

    env_kwargs: dict[str, Any] = {}

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        timeout_s: float | None = None,
        connect_timeout_s: float = 10.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        concurrency: int = 8,
        native_tools: bool = True,
        return_token_ids: bool | None = None,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        if concurrency < 1 or max_retries < 0:
            raise ValueError(f"need concurrency >= 1 and max_retries >= 0, got {concurrency}, {max_retries}")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.max_retries, self.backoff_s = model, max_retries, backoff_s
        self.timeout_s, self.concurrency, self.native_tools = timeout_s, concurrency, native_tools
        self.return_token_ids, self.extra_body = return_token_ids, dict(extra_body or {})
        self._ask_ids = return_token_ids is not False
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
            headers=headers,
        )
        self._rng = random.Random(0)
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self.stats = {"requests": 0, "retries": 0}

    @classmethod
    def from_spec(cls, arg: str, api_key: str | None = None) -> OpenAIPolicy:
        """Build from ``URL#MODEL?key=value&...`` (the part after ``openai:``; keys in the module doc).

        Raises:
            ValueError: no URL or model, an unknown key, or a value of the wrong type.
        """
        url, _, rest = arg.partition("#")
        model, _, query = rest.partition("?")
        if not url or not model:
            raise ValueError("openai:URL#MODEL[?timeout=S&retries=N&concurrency=N&...], "
                             "e.g. openai:http://127.0.0.1:8000/v1#Qwen/Qwen2.5-7B-Instruct?concurrency=4")
        kwargs: dict[str, Any] = {}
        for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)):
            if key not in SPEC_KEYS:
                raise ValueError(f"unknown openai: option {key!r}; choose from {', '.join(SPEC_KEYS)}")
            name, kind = SPEC_KEYS[key]
            kwargs[name] = _spec_value(key, value, kind)
        return cls(url, model, api_key=api_key, **kwargs)

    def close(self) -> None:
        self.client.close()

    def act(self, conversations: list[Conversation], sampling: SamplingParams | None = None) -> list[Utterance]:
        """One utterance per conversation, requested concurrently.

        Raises:
            PolicyHTTPError: a request failed for good (after retries where they apply).
        """
        sampling = sampling or SamplingParams()
        if len(conversations) <= 1 or self.concurrency == 1:
            return [self._one(c, sampling) for c in conversations]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(conversations))) as pool:
            return list(pool.map(lambda c: self._one(c, sampling), conversations))

    # ----- one request -------------------------------------------------------------------
    def _one(self, conv: Conversation, sampling: SamplingParams) -> Utterance:
        body = self.request_body(conv, sampling)
        try:
            data = self._post(body)
        except _IdsRejected:  # the server refused the field before generating: ask once more without it
            self._warn_once("rejected", f"{self.url} rejects return_token_ids; recording text only "
                                        "(no token ids or log-probs, so these trajectories are not trainable)")
            with self._lock:
                self._ask_ids = False
            body.pop("return_token_ids", None)
            data = self._post(body)
        return self._utterance(conv, data)

    def _native(self, conv: Conversation) -> bool:
        return self.native_tools and bool(conv.tools) and conv.tool_format in ("hermes", "openai")

    def request_body(self, conv: Conversation, sampling: SamplingParams) -> dict[str, Any]:
        """The JSON body for one conversation."""
        native = self._native(conv)
        body: dict[str, Any] = {
            "model": self.model,
            "messages": _history(conv, native),
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_new_tokens,
            "logprobs": True,
        }
        stops = list(sampling.stop)
        if conv.tools and not native:
            stops += format_stops(conv.tool_format, conv.tools)
        if stops:
            body["stop"] = stops
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if native:
            body["tools"] = [s.to_openai() for s in conv.tools]
        if self._ask_ids:
            body["return_token_ids"] = True
        return {**body, **self.extra_body}

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST with the retry rule above. Raises ``PolicyHTTPError`` (or ``_IdsRejected``)."""
        last = "no attempt made"
        for attempt in range(self.max_retries + 1):
            if attempt:
                with self._lock:
                    self.stats["retries"] += 1
                    jitter = 1 + 0.1 * self._rng.random()
                time.sleep(self.backoff_s * (2 ** (attempt - 1)) * jitter)
            with self._lock:
                self.stats["requests"] += 1
            try:
                resp = self.client.post(self.url, json=body)
            except NEVER_STARTED as e:
                last = f"{type(e).__name__}: {e}"
                continue
            except httpx.TimeoutException as e:
                raise PolicyHTTPError(
                    f"{self.url} sent no reply within timeout={self.timeout_s}s ({type(e).__name__}); not retried, "
                    "since the server may still be generating it. Raise or drop the timeout (?timeout=none)."
                ) from None
            except httpx.TransportError as e:
                raise PolicyHTTPError(f"{self.url}: the connection failed mid-request ({type(e).__name__}: {e}); "
                                      "not retried, since the server may still be generating") from None
            if resp.status_code == 200:
                try:
                    return resp.json()
                except ValueError:
                    raise PolicyHTTPError(f"{self.url} returned invalid JSON: {resp.text[:300]!r}") from None
            last = f"HTTP {resp.status_code}: {resp.text[:300]}"
            if (self.return_token_ids is None and resp.status_code in (400, 422) and "return_token_ids" in body
                    and "return_token_ids" in resp.text):
                raise _IdsRejected(last)
            if resp.status_code not in RETRY_STATUS:
                raise PolicyHTTPError(f"{self.url} rejected the request ({last}); not retried")
        raise PolicyHTTPError(f"{self.url} failed after {self.max_retries + 1} attempts; last error: {last}")

    def _utterance(self, conv: Conversation, data: dict[str, Any]) -> Utterance:
        try:
            choice = data["choices"][0]
            msg = choice.get("message") or {}
        except (KeyError, IndexError, TypeError):
            raise PolicyHTTPError(f"{self.url} sent no choices: {json.dumps(data)[:300]}") from None
        text = msg.get("content") or ""
        if isinstance(choice.get("stop_reason"), str) and not text.endswith(choice["stop_reason"]):
            text += choice["stop_reason"]  # vLLM names the stop string it cut; the env needs it
        calls = _calls_from_message(msg)
        if calls:
            text = _with_calls(text, calls, conv.tool_format)
        prompt, ids, lps = self._tokens(data, choice)
        span = record = None
        if ids:  # the server's exact tokens join the episode's record
            record = conv.state.get(RECORD_KEY)
            if not isinstance(record, TokenRecord):
                record = conv.state[RECORD_KEY] = TokenRecord()
            span = record.add_turn(prompt, ids, lps)
        return Utterance(text=text, action_ids=ids, logprobs=lps,
                         finish_reason=str(choice.get("finish_reason") or "stop"), span=span, record=record)

    def _tokens(self, data: dict[str, Any], choice: dict[str, Any]) -> tuple[list[int], list[int], list[float]]:
        """``(prompt_ids, action_ids, logprobs)`` from a reply: all consistent, or text only (all empty)."""
        ids = choice.get("token_ids")
        if ids is None:
            if self.return_token_ids:
                raise PolicyHTTPError(f"{self.url} returned no token_ids although return_token_ids was requested")
            if self._ask_ids:
                self._warn_once("absent", f"{self.url} returns no token ids; recording text only (no token ids "
                                          "or log-probs, so these trajectories are not trainable)")
            return [], [], []
        prompt = data.get("prompt_token_ids") or choice.get("prompt_token_ids") or []
        lps = [float(t["logprob"]) for t in ((choice.get("logprobs") or {}).get("content") or []) if "logprob" in t]
        if len(lps) != len(ids):
            self._warn_once("mismatch", f"{self.url} returned {len(lps)} log-probs for {len(ids)} tokens; "
                                        "keeping the tokens, dropping the log-probs")
            lps = []
        return [int(t) for t in prompt], [int(t) for t in ids], lps

    def _warn_once(self, key: str, message: str) -> None:
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        warnings.warn(message, stacklevel=4)


class _IdsRejected(Exception):
    """The server refused ``return_token_ids`` (a 400 naming it): no generation started."""


def _spec_value(key: str, value: str, kind: str) -> Any:
    low = value.strip().lower()
    try:
        if kind == "float|none":
            return None if low in ("none", "") else float(value)
        if kind == "auto|bool" and low == "auto":
            return None
        if kind in ("bool", "auto|bool"):
            if low not in ("true", "false", "1", "0"):
                raise ValueError(value)
            return low in ("true", "1")
        return int(value) if kind == "int" else float(value)
    except ValueError:
        raise ValueError(f"openai: option {key}={value!r} is not a {kind.replace('|', ' or ')}") from None


def _with_calls(text: str, calls: list[ToolCall], tool_format: str) -> str:
    """Native tool calls written into the utterance text, in the env's format."""
    if tool_format == "openai":  # one JSON message holding every call, as OpenAIFormat.parse reads it
        entries = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
            for c in calls
        ]
        return json.dumps({"content": text, "tool_calls": entries})
    fmt = get_format(tool_format)
    return (text + "\n" + "\n".join(fmt.render_call(c) for c in calls)).strip()


def _calls_from_message(msg: dict[str, Any]) -> list[ToolCall]:
    out = []
    for i, entry in enumerate(msg.get("tool_calls") or []):
        fn = entry.get("function") or {}
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError:
                args = {"_raw": args}  # the env's validation reports it as a bad argument
        out.append(ToolCall(str(entry.get("id") or f"call_{i}"), str(fn.get("name", "")), args if isinstance(args, dict) else {}))
    return out


def _history(conv: Conversation, native: bool) -> list[dict[str, Any]]:
    """The conversation as OpenAI chat messages.

    Native mode: assistant text with calls becomes a ``tool_calls`` message whose ids are the env's
    (``t{turn}_{i}``), so tool results line up; results without a call id become user messages.
    Text mode: tools are described in the system message and tool results are user messages.
    """
    fmt = get_format(conv.tool_format)
    registry = ToolRegistry.from_specs(list(conv.tools))
    msgs: list[dict[str, Any]] = []
    turn = 0
    for m in conv.messages:
        if m.role == "assistant":
            turn += 1
            msgs.append(_assistant(m, fmt, registry, turn) if native else {"role": "assistant", "content": m.content})
        elif m.role == "tool" and native and m.tool_call_id and _answers(msgs, m.tool_call_id):
            msgs.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content})
        elif m.role == "tool":
            msgs.append({"role": "user", "content": m.content})
        else:
            msgs.append({"role": m.role, "content": m.content})
    if conv.tools and not native:
        text = fmt.render_tools(list(conv.tools))
        if msgs and msgs[0]["role"] == "system":
            msgs[0] = {"role": "system", "content": msgs[0]["content"] + "\n\n" + text}
        else:
            msgs.insert(0, {"role": "system", "content": text})
    return msgs


def _assistant(m: Message, fmt, registry: ToolRegistry, turn: int) -> dict[str, Any]:
    calls = m.tool_calls or (fmt.parse(m.content, registry, id_prefix=f"t{turn}").calls if len(registry) else [])
    if not calls:
        return {"role": "assistant", "content": m.content}
    content = fmt.parse(m.content, registry).content if not m.tool_calls else m.content
    return {
        "role": "assistant",
        "content": content or None,
        "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
            for c in calls
        ],
    }


def _answers(msgs: list[dict[str, Any]], call_id: str) -> bool:
    """Whether the latest assistant message asked for ``call_id`` (OpenAI rejects orphan tool results)."""
    for m in reversed(msgs):
        if m["role"] == "assistant":
            return any(c["id"] == call_id for c in m.get("tool_calls") or [])
    return False
