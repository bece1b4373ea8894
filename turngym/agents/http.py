"""``OpenAIPolicy``: an OpenAI-compatible chat-completions endpoint (OpenAI, vLLM serve, llama.cpp...)
as a turngym policy, for evaluation and benchmarking.

- Timeouts on every request; bounded retries with exponential backoff on timeouts, connection
  errors, 5xx and 429 (rate limit); any other 4xx fails at once (retrying a bad request cannot
  help). Exhausted retries raise ``PolicyHTTPError`` naming the URL, the status and the body.
- Concurrency: the conversations of one ``act`` call are sent by a thread pool of ``concurrency``
  workers over one shared ``httpx.Client``.
- Tools: for ``hermes``/``openai`` envs they go as native ``tools=[...]`` (``native_tools=True``);
  calls the server returns are written back in the env's own format with ``render_call``, so the
  env parses them as usual. The history is converted the other way: an assistant message whose text
  holds calls becomes an OpenAI ``tool_calls`` message with the env's call ids (``t{turn}_{i}``).
  For ``xml``/``text`` envs, tools are described in the system message as text.
- Tokens: the API speaks text, so ``prompt_ids``/``action_ids`` stay empty unless the server
  returns them (vLLM with ``return_token_ids=True``). ``logprobs`` are the per-token log-probs the
  server reports (``logprobs: true``), when it reports them: for vLLM the raw model log-probs by
  default (``--logprobs-mode``), for OpenAI those of the returned content tokens.
"""

from __future__ import annotations

import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from turngym.agents.base import Conversation, SamplingParams
from turngym.tools.base import ToolRegistry
from turngym.tools.formats import get_format
from turngym.types import Message, ToolCall, Utterance

RETRY_STATUS = {429, 500, 502, 503, 504}


class PolicyHTTPError(RuntimeError):
    """The endpoint failed for good: a non-retryable status, or retries exhausted."""


class OpenAIPolicy:
    """A chat-completions endpoint answering conversations concurrently.

    Args:
        base_url: Up to and including ``/v1`` (``http://127.0.0.1:8000/v1``).
        model: Model name sent with each request.
        api_key: Bearer token (None: no Authorization header).
        timeout_s: Per-request timeout (connect, read, write).
        max_retries: Retries after the first attempt, for retryable failures only.
        backoff_s: First retry delay; it doubles each retry (plus up to 10% jitter).
        concurrency: Requests in flight at once.
        native_tools: Send tools as OpenAI ``tools`` for hermes/openai envs.
        return_token_ids: Ask for token ids (vLLM extension ``return_token_ids``).
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
        timeout_s: float = 60.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        concurrency: int = 8,
        native_tools: bool = True,
        return_token_ids: bool = False,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        if concurrency < 1 or max_retries < 0:
            raise ValueError(f"need concurrency >= 1 and max_retries >= 0, got {concurrency}, {max_retries}")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.max_retries, self.backoff_s = model, max_retries, backoff_s
        self.concurrency, self.native_tools = concurrency, native_tools
        self.return_token_ids, self.extra_body = return_token_ids, dict(extra_body or {})
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(timeout=httpx.Timeout(timeout_s), headers=headers)
        self._rng = random.Random(0)
        self._lock = threading.Lock()
        self.stats = {"requests": 0, "retries": 0}

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
            stops += get_format(conv.tool_format).stop_strings(ToolRegistry.from_specs(list(conv.tools)))
        if stops:
            body["stop"] = stops
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if native:
            body["tools"] = [s.to_openai() for s in conv.tools]
        if self.return_token_ids:
            body["return_token_ids"] = True
        return {**body, **self.extra_body}

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
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
            except (httpx.TimeoutException, httpx.TransportError) as e:
                last = f"{type(e).__name__}: {e}"
                continue
            if resp.status_code == 200:
                try:
                    return resp.json()
                except ValueError:
                    raise PolicyHTTPError(f"{self.url} returned invalid JSON: {resp.text[:300]!r}") from None
            last = f"HTTP {resp.status_code}: {resp.text[:300]}"
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
        lps = [float(t["logprob"]) for t in ((choice.get("logprobs") or {}).get("content") or []) if "logprob" in t]
        return Utterance(
            text=text,
            prompt_ids=list(data.get("prompt_token_ids") or choice.get("prompt_token_ids") or []),
            action_ids=list(choice.get("token_ids") or []),
            logprobs=lps,
            finish_reason=str(choice.get("finish_reason") or "stop"),
        )


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
