"""Search backends behind one small interface: local BM25 (bm25s) and a user's HTTP service.

``search(query, k) -> list[Hit]`` and ``get(title_or_id) -> Doc | None``. A backend failure
raises ``SearchError`` with a readable message; the env's tools turn that into an error
observation, so a flaky service never crashes an episode.

HTTP protocol (for your own service):

- ``GET {base_url}/search?q=QUERY&k=K`` -> ``{"results": [{"id": ..., "title": ..., "text": ...}, ...]}``
  (``snippet`` may replace ``text``);
- ``GET {base_url}/doc?id=TITLE_OR_ID`` -> ``{"id": ..., "title": ..., "text": ...}``, or 404.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from turngym.data.registry import cache_root
from turngym.envs.search.corpus import Doc

SNIPPET_CHARS = 200


class SearchError(RuntimeError):
    """The backend could not answer (timeout, server error, malformed reply)."""


@dataclass(frozen=True)
class Hit:
    doc_id: str
    title: str
    snippet: str
    score: float = 0.0


class SearchBackend(Protocol):
    def search(self, query: str, k: int = 3) -> list[Hit]: ...

    def get(self, title_or_id: str) -> Doc | None: ...


def snippet(text: str, n: int = SNIPPET_CHARS) -> str:
    return text if len(text) <= n else text[:n].rsplit(" ", 1)[0] + " ..."


class BM25Backend:
    """BM25 over an in-memory corpus (title + text indexed), with the index cached on disk.

    Args:
        docs: The corpus.
        key: A digest of the corpus; the index is saved under ``<cache>/search/bm25/<key>``.
        cache_dir: Override the cache folder (None: ``<cache>/search/bm25``).
    """

    _memo: dict[str, object] = {}  # one index per corpus per process

    def __init__(self, docs: list[Doc], key: str, cache_dir: Path | None = None) -> None:
        self.docs = docs
        self.by_id = {d.doc_id: d for d in docs}
        self.by_title = {d.title.lower(): d for d in docs}
        self.key = key
        self.cache_dir = Path(cache_dir) if cache_dir else cache_root() / "search" / "bm25"
        self.retriever = self._index()

    def _index(self):
        try:
            import bm25s
        except ImportError:
            raise ImportError("the BM25 search backend needs bm25s: pip install 'turngym[search]'") from None
        if self.key in self._memo:
            return self._memo[self.key]
        folder = self.cache_dir / self.key
        if (folder / "params.index.json").exists():
            retriever = bm25s.BM25.load(str(folder), show_progress=False)
        else:
            tokens = bm25s.tokenize([f"{d.title}. {d.text}" for d in self.docs], stopwords="en", show_progress=False)
            retriever = bm25s.BM25()
            retriever.index(tokens, show_progress=False)
            tmp = folder.with_name(f"{folder.name}.{os.getpid()}.tmp")
            retriever.save(str(tmp), show_progress=False)
            try:
                tmp.replace(folder)
            except OSError:  # another process saved it first
                shutil.rmtree(tmp, ignore_errors=True)
        self._memo[self.key] = retriever
        return retriever

    def search(self, query: str, k: int = 3) -> list[Hit]:
        import bm25s

        words = bm25s.tokenize([query], stopwords="en", return_ids=False, show_progress=False)[0]
        vocab = self.retriever.vocab_dict
        words = [w for w in words if w in vocab]
        if not words or not self.docs:
            return []
        idx, scores = self.retriever.retrieve([words], k=min(k, len(self.docs)), show_progress=False)
        hits = []
        for i, s in zip(idx[0], scores[0]):
            if s > 0:
                d = self.docs[int(i)]
                hits.append(Hit(d.doc_id, d.title, snippet(d.text), float(s)))
        return hits

    def get(self, title_or_id: str) -> Doc | None:
        key = title_or_id.strip()
        return self.by_id.get(key) or self.by_title.get(key.lower())


class HTTPBackend:
    """A search service over HTTP (httpx) with timeouts, retries and a client-side rate limit.

    Args:
        base_url: The service root (see the module docstring for the protocol).
        timeout_s: Per-request timeout.
        retries: Extra attempts after a timeout, a connection error or a 5xx reply.
        max_requests_per_s: Requests are spaced at least ``1 / max_requests_per_s`` apart.
        backoff_s: Sleep before retry ``i`` is ``backoff_s * 2**i``.
    """

    def __init__(self, base_url: str, timeout_s: float = 10.0, retries: int = 2, max_requests_per_s: float = 5.0,
                 backoff_s: float = 0.5, headers: dict[str, str] | None = None) -> None:
        import httpx

        self.base_url = base_url.rstrip("/")
        self.retries, self.backoff_s = retries, backoff_s
        self.min_interval = 1.0 / max_requests_per_s if max_requests_per_s > 0 else 0.0
        self._client = httpx.Client(timeout=timeout_s, headers=headers or {})
        self._lock = threading.Lock()
        self._next_at = 0.0

    def _wait_turn(self) -> None:
        with self._lock:
            now = time.monotonic()
            wait = self._next_at - now
            self._next_at = max(now, self._next_at) + self.min_interval
        if wait > 0:
            time.sleep(wait)

    def _get(self, path: str, params: dict) -> object | None:
        import httpx

        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            self._wait_turn()
            try:
                r = self._client.get(self.base_url + path, params=params)
            except httpx.TimeoutException:
                last = "the search service timed out"
                continue
            except httpx.TransportError as e:
                last = f"cannot reach the search service ({type(e).__name__})"
                continue
            if r.status_code == 404:
                return None
            if r.status_code >= 500 or r.status_code == 429:
                last = f"the search service answered HTTP {r.status_code}"
                continue
            if r.status_code >= 400:
                raise SearchError(f"the search service rejected the request (HTTP {r.status_code})")
            try:
                return r.json()
            except ValueError:
                raise SearchError("the search service returned invalid JSON") from None
        raise SearchError(f"{last} (after {self.retries + 1} attempts)")

    def search(self, query: str, k: int = 3) -> list[Hit]:
        data = self._get("/search", {"q": query, "k": k})
        results = data.get("results") if isinstance(data, dict) else None
        if not isinstance(results, list):
            raise SearchError('the search service reply is malformed: it has no "results" list')
        hits = []
        for r in results[:k]:
            if not isinstance(r, dict) or not isinstance(r.get("title"), str):
                raise SearchError("the search service returned a malformed result")
            text = str(r.get("snippet") or r.get("text") or "")
            hits.append(Hit(str(r.get("id", r["title"])), r["title"], snippet(text), float(r.get("score", 0.0) or 0.0)))
        return hits

    def get(self, title_or_id: str) -> Doc | None:
        data = self._get("/doc", {"id": title_or_id})
        if data is None:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("title"), str) or not isinstance(data.get("text"), str):
            raise SearchError("the search service returned a malformed document")
        return Doc(str(data.get("id", data["title"])), data["title"], data["text"])

    def close(self) -> None:
        self._client.close()
