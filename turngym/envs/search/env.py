"""``SearchEnv``: answer a question by searching a corpus and reading pages.

Tools: ``answer(text)`` ends the episode; ``search(query, k)`` returns titles and snippets;
``open(title_or_id)`` returns a page. The reward on ``answer`` is exact match (default) or token
F1 (``reward="f1"``) after SQuAD normalisation; both are reported in ``info``.

The oracle searches each gold title, opens it, and then answers with the gold answer.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

from turngym.envs.base import StepOutcome, TextEnv
from turngym.envs.search.backends import BM25Backend, HTTPBackend, SearchError
from turngym.envs.search.corpus import QASuite, QATask, hotpot_suite, synthetic_suite
from turngym.envs.splits import split_of
from turngym.tools.base import Tool
from turngym.types import Message, ToolCall

SYSTEM_PROMPT = (
    "Answer the question using the search tools. Search for pages, open the ones that look useful, "
    "and reason across them: the answer usually needs facts from more than one page. When you know "
    "it, call answer with a short answer (a name, a year, a few words); that ends the episode.\n\n{tools}"
)


def load_suite(suite: str, seed: int = 0, data_dir: str | None = None, hotpot_file: str | None = None,
               sizes: dict | None = None) -> QASuite:
    """``synthetic`` (bundled; ``sizes``: ``synthetic_suite``'s ``n_people`` / ``n_companies``) or
    ``hotpotqa`` (a local copy or the download cache)."""
    if suite == "synthetic":
        return synthetic_suite(seed, **(sizes or {}))
    if suite == "hotpotqa":
        if hotpot_file:
            return hotpot_suite(hotpot_file)
        from turngym.data import dataset_path

        return hotpot_suite(dataset_path("hotpotqa", data_dir))
    raise ValueError(f"unknown search suite {suite!r}; choose 'synthetic' or 'hotpotqa'")


def task_split(task: QATask, split_by: str = "question") -> str:
    """``train`` or ``test``: by a hash of the question's id, or (``entity``) of its person's name."""
    if split_by == "entity":
        return split_of(f"entity:{task.entity}", test_fraction=0.25)
    return split_of(task.task_id)


class SearchEnv(TextEnv):
    """Multi-hop question answering with search / open / answer tools; reward = EM or F1."""

    default_tool_format = "xml"

    def __init__(
        self,
        suite: str = "synthetic",
        split: str = "train",
        seed: int = 0,
        data_dir: str | None = None,
        hotpot_file: str | None = None,
        backend: str = "bm25",
        http_url: str | None = None,
        http_timeout_s: float = 10.0,
        reward: str = "em",
        default_k: int = 3,
        n_people: int = 40,
        n_companies: int = 24,
        split_by: str = "question",
        **kw: Any,
    ) -> None:
        """Args:
            suite: ``synthetic`` or ``hotpotqa``.
            split: ``train`` / ``test`` (disjoint, by question) or ``all``.
            seed: Seed of the synthetic encyclopedia.
            data_dir: Local data folder for HotpotQA (else ``$TURNGYM_DATA`` or the cache).
            hotpot_file: A specific HotpotQA ``.jsonl``/``.json`` file (e.g. ``retrieved_500.jsonl``).
            backend: ``bm25`` (local index over the suite's corpus) or ``http`` (``http_url``).
            reward: ``em`` or ``f1``.
            default_k: Results per search when the agent gives no ``k``.
            n_people: People in the synthetic encyclopedia (more people and companies: more questions).
            n_companies: Companies in the synthetic encyclopedia.
            split_by: ``question`` (a hash of the question id) or ``entity`` (of the person the
                question is about, a quarter of them held out: no training question reads a held-out
                person's page, so a held-out score measures search, not recall).
        """
        super().__init__(**kw)
        if split not in ("train", "test", "all"):
            raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}")
        if reward not in ("em", "f1"):
            raise ValueError(f"reward must be 'em' or 'f1', got {reward!r}")
        self.suite_name, self.split, self.reward_kind, self.default_k = suite, split, reward, default_k
        self.qa = load_suite(suite, seed, data_dir, hotpot_file, {"n_people": n_people, "n_companies": n_companies})
        if split_by not in ("question", "entity") or (split_by == "entity" and suite != "synthetic"):
            raise ValueError(f"split_by must be question, or entity for the synthetic suite, got {split_by!r}")
        self.tasks = {t.task_id: t for t in self.qa.tasks if split == "all" or task_split(t, split_by) == split}
        self.task_ids = list(self.tasks)
        if backend == "bm25":
            self.backend = BM25Backend(self.qa.docs, self.qa.digest())
        elif backend == "http":
            if not http_url:
                raise ValueError("backend='http' needs http_url")
            self.backend = HTTPBackend(http_url, timeout_s=http_timeout_s)
        else:
            raise ValueError(f"unknown backend {backend!r}; choose 'bm25' or 'http'")
        self._task: QATask | None = None
        self._searched: set[str] = set()  # titles seen in search results
        self._queries: set[str] = set()
        self._missing: set[str] = set()  # pages that open could not find
        self._opened: set[str] = set()
        self._answer: str | None = None
        self._em = self._f1 = 0.0

    # ----- tools ------------------------------------------------------------------------------
    def _build_tools(self) -> list[Tool]:
        def answer(text: str) -> str:
            """Give your final answer (short). This ends the episode.

            Args:
                text: the answer
            """
            from turngym.envs.search.qa import exact_match, f1_score

            self._answer = text
            self._em, self._f1 = exact_match(text, self._task.answer), f1_score(text, self._task.answer)
            return f"Answer recorded: {text}"

        def search(query: str, k: int = self.default_k) -> str:
            """Search the encyclopedia; returns page titles and snippets.

            Args:
                query: keywords or a page title
                k: number of results, 1 to 10
            """
            if not query.strip():
                raise SearchError("the query is empty")
            hits = self.backend.search(query, max(1, min(int(k), 10)))
            self._queries.add(query.strip().lower())
            self._searched.update(h.title for h in hits)
            if not hits:
                return f"No results for {query!r}."
            return "\n".join(f"{i + 1}. {h.title} [{h.doc_id}]: {h.snippet}" for i, h in enumerate(hits))

        def open_page(title_or_id: str) -> str:
            """Open a page by its exact title or id and read it.

            Args:
                title_or_id: a title or [id] from the search results
            """
            doc = self.backend.get(title_or_id.strip().strip("[]"))
            if doc is None:
                self._missing.add(title_or_id.strip())
                raise SearchError(f"no page titled {title_or_id!r}; use a title or id from the search results")
            self._opened.add(doc.title)
            return f"{doc.title}\n{doc.text}"

        return [Tool.from_function(answer, timeout_s=None), Tool.from_function(search, timeout_s=30.0),
                Tool.from_function(open_page, name="open", timeout_s=30.0)]

    # ----- episode ----------------------------------------------------------------------------
    def _reset_task(self, task_id: str) -> list[Message]:
        if task_id not in self.tasks:
            raise KeyError(f"unknown task {task_id!r} for search suite {self.suite_name!r} split {self.split!r}")
        self._task = self.tasks[task_id]
        self._searched, self._queries, self._opened, self._answer = set(), set(), set(), None
        self._missing = set()
        self._em = self._f1 = 0.0
        system = SYSTEM_PROMPT.format(tools=self.format.render_tools(self.tools.specs))
        return [Message("system", system), Message("user", f"Question: {self._task.question}")]

    def _step_outcome(self, parsed, results) -> StepOutcome:
        if self._answer is None:
            return StepOutcome()
        reward = self._em if self.reward_kind == "em" else self._f1
        return StepOutcome(reward=reward, terminated=True, info={"em": self._em, "f1": self._f1})

    def outcome(self) -> float:
        return self._em

    def state_key(self) -> str:
        # What the agent knows: the pages it opened and the titles its searches listed. A search
        # that lists nothing new leaves the state as it was (a loop, for GiGPO anchors and branch
        # search); one that lists a new title moves it.
        known = sorted(self._opened) + ["?" + title for title in sorted(self._searched)]
        # surrogatepass: a title from third-party data may hold a lone surrogate
        digest = hashlib.sha1("\n".join(known).encode("utf-8", "surrogatepass")).hexdigest()[:12]
        return f"{self._task_id}:{'done' if self._answer is not None else digest}"

    def task_type(self, task_id: str) -> str:
        return self.tasks[task_id].qtype if task_id in self.tasks else "default"

    # ----- scripted hints ---------------------------------------------------------------------
    def oracle_action(self) -> str | None:
        t = self._task
        if t is None or self._answer is not None:
            return None
        if self.format.name != "text":  # the text format can only answer
            for title in t.gold_titles:
                if title in self._missing:  # not in this corpus (e.g. retrieved, not gold, paragraphs)
                    continue
                searched = title in self._searched or title.lower() in self._queries
                if not searched and title not in self._opened:
                    return self.format.render_call(ToolCall("oracle", "search", {"query": title}))
                if title not in self._opened:
                    return self.format.render_call(ToolCall("oracle", "open", {"title_or_id": title}))
        return self.format.render_call(ToolCall("oracle", "answer", {"text": t.answer}))

    def admissible_actions(self) -> list[str] | None:
        """A few searches built from the question's words, a few opens, and answers that belong
        to other questions (plausible, wrong)."""
        t = self._task
        if t is None or self._answer is not None:
            return None
        rng = random.Random(f"{self._task_id}:{self.turn}")
        words = [w.strip("?,.\"'") for w in t.question.split() if len(w) > 3]
        wrong = sorted({o.answer for o in self.tasks.values() if o.answer != t.answer} or {"unknown"})
        calls = [ToolCall("r", "answer", {"text": a}) for a in rng.sample(wrong, min(3, len(wrong)))]
        if self.format.name != "text":
            calls += [ToolCall("r", "search", {"query": " ".join(rng.sample(words, min(2, len(words))) or ["page"])}) for _ in range(3)]
            titles = sorted(self._searched) or [d.title for d in rng.sample(self.qa.docs, min(3, len(self.qa.docs)))]
            calls += [ToolCall("r", "open", {"title_or_id": x}) for x in rng.sample(titles, min(3, len(titles)))]
        return [self.format.render_call(c) for c in calls]

    def close(self) -> None:
        if isinstance(self.backend, HTTPBackend):
            self.backend.close()
        super().close()
