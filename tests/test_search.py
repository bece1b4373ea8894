"""Search envs: QA metrics, the synthetic encyclopedia, BM25 caching, HTTP failure modes, HotpotQA."""

from __future__ import annotations

import http.server
import importlib.util
import json
import threading
import time
import urllib.parse

import pytest

import turngym
from turngym.agents.scripted import OracleAgent, RandomAgent
from turngym.envs.search.backends import BM25Backend, HTTPBackend, SearchError
from turngym.envs.search.corpus import synthetic_suite
from turngym.envs.search.qa import exact_match, f1_score, normalize_answer
from turngym.rollout import episode_specs, make_env_factory, rollout

needs_bm25 = pytest.mark.skipif(importlib.util.find_spec("bm25s") is None, reason="bm25s not installed (pip install 'turngym[search]')")


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("TURNGYM_CACHE", str(tmp_path_factory.getbasetemp() / "search-cache"))


# ----- metrics -----------------------------------------------------------------------------------
def test_normalisation_and_metrics_by_hand():
    assert normalize_answer("The  Cat, sat!") == "cat sat"
    assert exact_match("an Apple.", "apple") == 1.0 and exact_match("apples", "apple") == 0.0
    # pred {cat, sat} vs gold {cat, sat, down}: P = 1, R = 2/3, F1 = 0.8
    assert f1_score("the cat sat", "cat sat down") == pytest.approx(0.8)
    assert f1_score("yes", "no") == 0.0 and f1_score("no", "no") == 1.0
    assert f1_score("yes it is", "it is") == pytest.approx(0.8)  # only an exact yes/no/noanswer is special
    assert f1_score("", "x") == 0.0


# ----- the synthetic suite -------------------------------------------------------------------------
def test_synthetic_questions_need_two_pages():
    suite = synthetic_suite(0)
    assert suite.digest() == synthetic_suite(0).digest() != synthetic_suite(1).digest()
    pages = {d.title: d.text for d in suite.docs}
    assert len(suite.tasks) >= 60
    for t in suite.tasks:
        assert all(g in pages for g in t.gold_titles)
        assert t.answer in pages[t.gold_titles[-1]]
        assert t.answer not in pages[t.gold_titles[0]], t  # the first page alone does not answer it


@needs_bm25
def test_large_synthetic_suite_holds_out_128_questions_the_oracle_solves():
    train = turngym.make("turngym/Search-synthetic-large-v0", split="train").unwrapped
    test = turngym.make("turngym/Search-synthetic-large-v0", split="test").unwrapped
    assert len(test.task_ids) == 128 and len(train.task_ids) == 522  # the protocol's 128 held-out games
    assert not set(train.task_ids) & set(test.task_ids)
    assert synthetic_suite(0).digest() == "d1a073b0afce3be0"  # sizing the suite left the default one as it was
    oracle, _ = _success("turngym/Search-synthetic-large-v0", OracleAgent(), test.task_ids[:16], split="test")
    assert oracle >= 0.99


@needs_bm25
def test_bm25_index_is_cached_on_disk(tmp_path):
    suite = synthetic_suite(0)
    a = BM25Backend(suite.docs, "k1", cache_dir=tmp_path)
    assert (tmp_path / "k1" / "params.index.json").exists()
    BM25Backend._memo.pop("k1")
    b = BM25Backend(suite.docs, "k1", cache_dir=tmp_path)
    title = suite.tasks[0].gold_titles[0]
    assert [h.title for h in a.search(title, 3)] == [h.title for h in b.search(title, 3)]
    assert a.search(title, 3)[0].title == title
    assert a.search("the of and", 3) == []  # only stopwords: no results, no crash
    assert a.get(title.upper()).title == title and a.get(suite.docs[0].doc_id) == suite.docs[0]


def _success(env_id, agent, ids, **kw):
    trajs = rollout(agent, make_env_factory(env_id, **agent.env_kwargs, **kw), episode_specs(ids, len(ids)), progress=False)
    return sum(t.outcome for t in trajs) / len(trajs), trajs


@needs_bm25
@pytest.mark.parametrize("fmt", ["xml", "hermes", "openai", "text"])
def test_oracle_solves_synthetic_suite_and_random_does_not(fmt):
    ids = turngym.make("turngym/Search-synthetic-v0", split="all").unwrapped.task_ids
    oracle, trajs = _success("turngym/Search-synthetic-v0", OracleAgent(), ids, split="all", tool_format=fmt)
    rand, _ = _success("turngym/Search-synthetic-v0", RandomAgent(seed=2), ids, split="all", tool_format=fmt)
    assert oracle >= 0.99 and rand <= 0.1
    if fmt != "text":  # the oracle really searched and opened every gold page
        t = trajs[0]
        names = [c.name for turn in t.turns for c in turn.tool_calls]
        assert names.count("open") >= 2 and names[-1] == "answer"


@needs_bm25
def test_env_basics():
    env = turngym.make("turngym/Search-synthetic-v0", reward="f1").unwrapped
    te = turngym.make("turngym/Search-synthetic-v0", split="test").unwrapped
    assert env.task_ids and te.task_ids and not set(env.task_ids) & set(te.task_ids)
    a, _ = env.reset(seed=5)
    b, info = env.reset(seed=5)
    assert [m.content for m in a] == [m.content for m in b]
    task = env.tasks[info["task_id"]]
    obs, r, term, _, info = env.step("<open>No Such Page</open>")
    assert "no page titled" in obs[0].content and info["action_valid"] is False and not term
    obs, r, term, _, info = env.step("<search>   </search>")
    assert "empty" in obs[0].content and info["action_valid"] is False
    obs, r, term, _, info = env.step(f"<answer>the {task.answer} maybe</answer>")
    assert term and info["em"] == 0.0 and 0 < r == info["f1"] < 1
    json.dumps(info)


@needs_bm25
def test_state_key_moves_only_when_the_agent_learns_something():
    env = turngym.make("turngym/Search-synthetic-v0").unwrapped
    _, info = env.reset(seed=1)
    start, title = info["state_key"], env.qa.docs[0].title
    _, _, _, _, info = env.step(f"<search>{title}</search>")
    listed = info["state_key"]
    assert listed != start  # new titles listed
    _, _, _, _, info = env.step(f"<search>{title}</search>")
    assert info["state_key"] == listed  # the same search again lists nothing new: a loop
    _, _, _, _, info = env.step(f"<open>{title}</open>")
    assert info["state_key"] not in (start, listed)
    _, _, _, _, info = env.step("<answer>x</answer>")
    assert info["state_key"].endswith(":done")


# ----- HTTP backend ------------------------------------------------------------------------------
class _Stub:
    """A local search service whose behaviour the test switches: ok, slow, 500, garbage, malformed."""

    def __init__(self, docs):
        self.mode = "ok"
        self.hits: list[float] = []
        by_title = {d.title: d for d in docs}
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, body: bytes):
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                outer.hits.append(time.monotonic())
                url = urllib.parse.urlparse(self.path)
                q = urllib.parse.parse_qs(url.query)
                if outer.mode == "slow":
                    time.sleep(1.0)
                if outer.mode == "500":
                    return self._send(500, b"{}")
                if outer.mode == "garbage":
                    return self._send(200, b"<html>not json{")
                if outer.mode == "malformed":
                    return self._send(200, b'{"results": "nope"}')
                if url.path == "/search":
                    words = q["q"][0].lower().split()
                    found = [d for d in docs if any(w in d.title.lower() for w in words)][: int(q["k"][0])]
                    return self._send(200, json.dumps({"results": [{"id": d.doc_id, "title": d.title, "text": d.text} for d in found]}).encode())
                d = by_title.get(q["id"][0])
                if d is None:
                    return self._send(404, b"{}")
                return self._send(200, json.dumps({"id": d.doc_id, "title": d.title, "text": d.text}).encode())

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def stub():
    s = _Stub(synthetic_suite(0).docs)
    yield s
    s.close()


def _http_env(stub, **kw):
    env = turngym.make("turngym/Search-synthetic-v0", split="all", backend="http", http_url=stub.url,
                       http_timeout_s=0.3, scripted_hints=True, **kw).unwrapped
    env.backend.backoff_s = 0.01
    return env


def test_http_backend_plays_an_episode(stub):
    env = _http_env(stub)
    obs, info = env.reset(seed=0)
    for _ in range(10):
        obs, r, term, _, info = env.step(info["oracle_action"])
        assert info["action_valid"], obs[0].content
        if term:
            break
    assert term and r == 1.0


@pytest.mark.parametrize("mode,message", [
    ("slow", "timed out"),
    ("500", "HTTP 500"),
    ("garbage", "invalid JSON"),
    ("malformed", "malformed"),
])
def test_http_failures_become_error_observations(stub, mode, message):
    env = _http_env(stub)
    env.reset(seed=0)
    stub.mode = mode
    for action in ("<search>Works</search>", f"<open>{env.qa.docs[0].title}</open>"):
        obs, r, term, _, info = env.step(action)
        assert info["action_valid"] is False and not term and r == 0.0
        assert obs[0].content.startswith("Error") and message in obs[0].content
    stub.mode = "ok"  # the service recovers, and so does the episode
    obs, *_ , info = env.step("<search>Works</search>")
    assert info["action_valid"] is True


def test_http_retries_then_succeeds_and_rate_limit(stub):
    backend = HTTPBackend(stub.url, timeout_s=1.0, retries=2, max_requests_per_s=20.0, backoff_s=0.01)
    stub.mode = "500"
    with pytest.raises(SearchError, match="after 3 attempts"):
        backend.search("x", 2)
    assert len(stub.hits) == 3
    stub.mode, stub.hits[:] = "ok", []
    sent = []  # send times at the client, where the limiter acts (server arrival times jitter under load)
    real_get = backend._client.get
    backend._client.get = lambda *a, **k: (sent.append(time.monotonic()), real_get(*a, **k))[1]
    for _ in range(4):
        backend.search("Works", 2)
    # 20 requests/s: the limiter schedules sends 50 ms apart; our timestamps land a little after
    # each scheduled time under load, so check the rate over the run, with 10 ms of slack
    assert len(stub.hits) == 4 and sent[-1] - sent[0] >= 3 * 0.05 - 0.01
    assert backend.get("No Such Page") is None


# ----- HotpotQA ----------------------------------------------------------------------------------
@needs_bm25
@pytest.mark.data
def test_hotpotqa_oracle_gets_em_1(shared_data):
    kw = {"split": "all", "data_dir": str(shared_data)}
    env = turngym.make("turngym/Search-hotpotqa-v0", **kw).unwrapped
    assert len(env.task_ids) == 100 and len(env.qa.docs) > 900  # 10 paragraphs x 100 questions, pooled
    em, trajs = _success("turngym/Search-hotpotqa-v0", OracleAgent(), env.task_ids, **kw)
    print(f"hotpotqa oracle EM = {em:.3f} over {len(trajs)} questions")
    assert em == 1.0
    assert all(t.turns[-1].info["f1"] == 1.0 for t in trajs)
    rand, _ = _success("turngym/Search-hotpotqa-v0", RandomAgent(seed=0), env.task_ids, **kw)
    assert rand <= 0.1
    assert {env.task_type(t) for t in env.task_ids} == {"bridge", "comparison"}


# ----- HotpotQA layouts (hand-made records) ------------------------------------------------------
_PARAS = [("Ivo Marn", ["Ivo Marn is a painter.", " He was born in Selby."]), ("Selby", ["Selby is a town on the Ure."]),
          ("Distractor Page", ["Nothing here."])]
_OFFICIAL = {"_id": "q1", "question": "Which river flows through the town where Ivo Marn was born?", "answer": "Ure",
             "type": "bridge", "level": "easy", "context": [[t, s] for t, s in _PARAS],
             "supporting_facts": [["Ivo Marn", 1], ["Selby", 0]]}
_HF = {"id": "q1", "question": _OFFICIAL["question"], "answer": "Ure", "type": "bridge", "level": "easy",
       "context": {"title": [t for t, _ in _PARAS], "sentences": [s for _, s in _PARAS]},
       "supporting_facts": {"title": ["Ivo Marn", "Selby"], "sent_id": [1, 0]}}


def _suite_view(suite):
    return [(d.title, d.text) for d in suite.docs], [(t.task_id, t.question, t.answer, t.gold_titles, t.qtype) for t in suite.tasks]


def test_hotpot_official_and_hugging_face_layouts_load_the_same(tmp_path):
    from turngym.envs.search.corpus import hotpot_suite

    (tmp_path / "official.json").write_text(json.dumps([_OFFICIAL]))
    (tmp_path / "hf.jsonl").write_text(json.dumps(_HF) + "\n")
    (tmp_path / "hf_lines.json").write_text(json.dumps(_HF) + "\n" + json.dumps({**_HF, "id": "q2"}) + "\n")  # to_json writes lines
    official = _suite_view(hotpot_suite(tmp_path / "official.json"))
    assert official == _suite_view(hotpot_suite(tmp_path / "hf.jsonl"))
    docs, tasks = official
    assert docs[0] == ("Ivo Marn", "Ivo Marn is a painter. He was born in Selby.")
    assert tasks == [("q1", _OFFICIAL["question"], "Ure", ("Ivo Marn", "Selby"), "bridge")]
    assert [t.task_id for t in hotpot_suite(tmp_path / "hf_lines.json").tasks] == ["q1", "q2"]


@pytest.mark.parametrize("record,message", [
    ({k: v for k, v in _HF.items() if k != "context"}, "missing field"),
    ({**_HF, "context": {"title": ["a", "b"], "sentences": [["x"]]}}, "equal lengths"),
    ({**_OFFICIAL, "context": [["a", "b", "c"]]}, "context is neither"),
    ({**_OFFICIAL, "context": [["a", "not a list"]]}, "list of sentence strings"),
    ({**_OFFICIAL, "supporting_facts": {"sent_id": [0]}}, "supporting_facts is neither"),
    ({**_OFFICIAL, "supporting_facts": [[3, 0]]}, "every title must be a string"),
    (["not", "an", "object"], "expected a JSON object"),
])
def test_hotpot_unknown_layout_is_a_clear_error(tmp_path, record, message):
    from turngym.envs.search.corpus import hotpot_suite

    (tmp_path / "bad.jsonl").write_text(json.dumps(_OFFICIAL) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(ValueError, match=rf"bad.jsonl: record 1: .*{message}"):
        hotpot_suite(tmp_path / "bad.jsonl")
    (tmp_path / "broken.jsonl").write_text("{not json\n")
    with pytest.raises(ValueError, match="line 1 is not JSON"):
        hotpot_suite(tmp_path / "broken.jsonl")


def test_hotpot_records_without_an_id_get_a_stable_one_and_one_warning(tmp_path):
    import hashlib

    from turngym.data import forget_warnings
    from turngym.envs.search.corpus import hotpot_suite

    forget_warnings()
    no_id = {k: v for k, v in _HF.items() if k != "id"}
    (tmp_path / "noid.jsonl").write_text("\n".join(json.dumps(r) for r in (no_id, no_id, _OFFICIAL)) + "\n")
    with pytest.warns(UserWarning, match="2 of 3 records have no id") as record:
        suite = hotpot_suite(tmp_path / "noid.jsonl")
    assert len(record) == 1
    h = "hq-" + hashlib.sha1(_HF["question"].encode()).hexdigest()[:16]
    assert [t.task_id for t in suite.tasks] == [h, f"{h}-2", "q1"]
    import warnings

    with warnings.catch_warnings(record=True) as again:  # the next env loading the file stays quiet
        warnings.simplefilter("always")
        assert [t.task_id for t in hotpot_suite(tmp_path / "noid.jsonl").tasks] == [h, f"{h}-2", "q1"]
    assert again == []


@needs_bm25
def test_hotpot_hugging_face_layout_plays_an_episode(tmp_path):
    (tmp_path / "hf.jsonl").write_text(json.dumps(_HF) + "\n")
    kw = {"split": "all", "hotpot_file": str(tmp_path / "hf.jsonl")}
    em, trajs = _success("turngym/Search-hotpotqa-v0", OracleAgent(), ["q1"], **kw)
    assert em == 1.0 and trajs[0].turns[-1].info["f1"] == 1.0


@needs_bm25
def test_hotpot_text_with_a_lone_surrogate_never_raises(tmp_path):
    # json.dumps escapes the lone surrogate as \ud800, which json.loads turns back into one
    record = {**_OFFICIAL, "context": [["Bad \ud800 Title", ["Broken \udc80 text."]], *_OFFICIAL["context"]]}
    (tmp_path / "odd.jsonl").write_text(json.dumps(record) + "\n")
    env = turngym.make("turngym/Search-hotpotqa-v0", split="all", hotpot_file=str(tmp_path / "odd.jsonl"), tool_format="hermes").unwrapped
    assert env.qa.docs[0].title == "Bad \ufffd Title" and env.qa.docs[0].text == "Broken \ufffd text."  # made valid at load
    env.reset(seed=0, options={"task_id": "q1"})
    for name, args in (("search", {"query": "Bad Title"}), ("open", {"title_or_id": "hp00000"}), ("answer", {"text": "Ure"})):
        obs, reward, terminated, _, info = env.step("<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>")
        obs[0].content.encode("utf-8")  # observations are valid UTF-8
        assert isinstance(info["state_key"], str)
    assert terminated and reward == 1.0


def test_the_large_v1_suite_holds_out_people_no_training_question_reads():
    from turngym.envs.search.env import task_split

    suite = synthetic_suite(0, n_people=320, n_companies=192)  # turngym/Search-synthetic-large-v1's corpus
    split = {t.task_id: task_split(t, "entity") for t in suite.tasks}
    train = [t for t in suite.tasks if split[t.task_id] == "train"]
    test = [t for t in suite.tasks if split[t.task_id] == "test"]
    assert (len(train), len(test)) == (520, 130)
    assert not {t.entity for t in train} & {t.entity for t in test}  # a held-out question is about a new person
    # no training question reads a held-out person's page: the fact each held-out question turns on is new
    assert not {t.entity for t in test} & {title for t in train for title in t.gold_titles}
