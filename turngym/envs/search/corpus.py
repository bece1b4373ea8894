"""Documents and QA tasks for the search envs: a generated encyclopedia and a HotpotQA loader.

The synthetic suite invents people, cities, countries, rivers and companies from a seed and
writes one encyclopedia page per entity. Every question needs two pages (a *bridge* entity, then
the page that holds the answer), and every answer is an invented name or year, so a model
cannot answer from memory.

HotpotQA (distractor setting): each question's 10 paragraphs (2 gold + 8 distractors) are pooled
into one corpus over the whole file, so a search can surface any question's paragraphs. Two
layouts of a record are read:

- the official one: ``_id``; ``context`` = ``[[title, [sentence, ...]], ...]``;
  ``supporting_facts`` = ``[[title, sentence_index], ...]`` (extra items after the title are
  ignored, as some re-packagings add them);
- the Hugging Face ``hotpot_qa`` one: ``id``; ``context`` = ``{"title": [...], "sentences":
  [[...], ...]}``; ``supporting_facts`` = ``{"title": [...], "sent_id": [...]}``.

A record without ``_id`` or ``id`` (some re-packagings drop it) gets a stable one from a hash of
its question (``hq-<sha1 of the question, 16 hex>``), and the file one warning. Anything else is a
``ValueError`` naming the file, the record and the field. Lone surrogates in the text (valid JSON,
invalid Unicode) become U+FFFD.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from turngym.data.warn import warn_once
from turngym.tools.base import valid_unicode

_SYL = ["ar", "bel", "cor", "dun", "el", "fal", "gor", "hal", "ith", "jor", "kel", "lun", "mor", "nex", "ol",
        "pra", "quor", "ril", "sev", "tal", "um", "var", "wyn", "xal", "yor", "zen", "bra", "dra", "fen", "gla"]


@dataclass(frozen=True)
class Doc:
    """One page: a stable id, a title and its text."""

    doc_id: str
    title: str
    text: str


@dataclass(frozen=True)
class QATask:
    """A question, its gold answer, and the titles of the pages that support it."""

    task_id: str
    question: str
    answer: str
    gold_titles: tuple[str, ...]
    qtype: str
    entity: str = ""  # the person the question is about (the synthetic suite): held-out splits by knowledge use it


@dataclass
class QASuite:
    """A corpus and the questions asked over it."""

    name: str
    docs: list[Doc]
    tasks: list[QATask] = field(default_factory=list)

    def digest(self) -> str:
        """A hash of the corpus (keys the cached BM25 index)."""
        h = hashlib.sha256()
        for d in self.docs:
            h.update(f"{d.doc_id}\x00{d.title}\x00{d.text}\x01".encode())
        return h.hexdigest()[:16]


def _unique_names(rng: random.Random, n: int, taken: set[str], suffix: str = "", parts: int = 1) -> list[str]:
    out = []
    while len(out) < n:
        name = " ".join("".join(rng.choice(_SYL) for _ in range(rng.choice((2, 3)))).capitalize() for _ in range(parts)) + suffix
        if name not in taken:
            taken.add(name)
            out.append(name)
    return out


def synthetic_suite(seed: int = 0, n_people: int = 40, n_companies: int = 24) -> QASuite:
    """The generated encyclopedia and its two-hop questions (deterministic in ``seed``).

    About ``2 n_companies + 0.8 n_people`` questions: the default sizes give 79 (16 in the test
    split), ``n_people=320, n_companies=192`` (``turngym/Search-synthetic-large-v0``) about 650.
    """
    rng = random.Random(f"search-synthetic:{seed}")
    taken: set[str] = set()
    countries = _unique_names(rng, 8, taken, suffix="ia")
    rivers = _unique_names(rng, 10, taken, suffix=" River")
    cities = _unique_names(rng, 24, taken)
    people = _unique_names(rng, n_people, taken, parts=2)
    companies = _unique_names(rng, n_companies, taken, suffix=" Works")
    city_country = {c: rng.choice(countries) for c in cities}
    capitals = {k: rng.choice([c for c in cities if city_country[c] == k] or [rng.choice(cities)]) for k in countries}
    for k, cap in capitals.items():
        city_country[cap] = k  # a capital lies in its own country
    city_river = {c: rng.choice(rivers) for c in cities}
    birth = {p: (rng.choice(cities), rng.randint(1850, 1990), rng.choice(["painter", "engineer", "poet", "chemist", "architect", "composer"]))
             for p in people}
    founders = {co: rng.choice(people) for co in companies}
    goods = ["lanterns", "clocks", "bicycles", "telescopes", "looms", "pianos", "compasses", "kettles", "typewriters",
             "barometers", "sextants", "gramophones", "lenses", "anvils", "bells", "sails", "ropes", "inks", "maps", "dyes",
             "tiles", "glassware", "saddles", "violins"]
    # more companies than goods (the large suite): goods repeat; no question asks for a product
    picks = rng.sample(goods, len(companies)) if len(companies) <= len(goods) else [rng.choice(goods) for _ in companies]
    products = dict(zip(companies, picks))
    docs = []
    for p, (city, year, job) in birth.items():
        made = [co for co, f in founders.items() if f == p]
        extra = f" {p.split()[0]} later founded {', '.join(made)}." if made else ""
        article = "an" if job[0] in "aeiou" else "a"
        docs.append((p, f"{p} (born {year}) is {article} {job} from {city}. {p} was born in {city} in {year}.{extra}"))
    for c in cities:
        k = city_country[c]
        role = f"the capital of {k}" if capitals[k] == c else f"a city in {k}"
        docs.append((c, f"{c} is {role}. The {city_river[c]} flows through {c}."))
    for k in countries:
        docs.append((k, f"{k} is a country whose capital is {capitals[k]}. Its cities include {', '.join(c for c in cities if city_country[c] == k)}."))
    for r in rivers:
        docs.append((r, f"The {r} flows through {', '.join(c for c in cities if city_river[c] == r) or 'no large city'}."))
    for co in companies:
        docs.append((co, f"{co} is a maker of {products[co]}. It was founded by {founders[co]}."))
    suite = QASuite("synthetic", [Doc(f"d{i:04d}", t, x) for i, (t, x) in enumerate(docs)])
    _synthetic_questions(suite, rng, birth, founders, city_country, capitals, city_river)
    return suite


def _synthetic_questions(suite, rng, birth, founders, city_country, capitals, city_river) -> None:
    qs = []
    for co, p in founders.items():
        qs.append(("founder-birthplace", f"In which city was the founder of {co} born?", birth[p][0], (co, p), p))
        qs.append(("founder-birthyear", f"In what year was the founder of {co} born?", str(birth[p][1]), (co, p), p))
    for p, (city, _, _) in list(birth.items())[::2]:
        qs.append(("birthplace-river", f"Which river flows through the city where {p} was born?", city_river[city], (p, city), p))
        k = city_country[city]
        if capitals[k] != city:
            qs.append(("birthplace-capital", f"What is the capital of the country where {p} was born?", capitals[k],
                       (p, city, k), p))
    for i, (qtype, q, a, gold, person) in enumerate(qs):
        suite.tasks.append(QATask(f"{qtype}-{i:03d}", q, a, tuple(gold), qtype, person))


def read_hotpot_records(path: Path) -> list[dict]:
    """Records from a ``.jsonl`` file (one per line) or a ``.json`` list (the official file).

    A ``.json`` file holding one object per line (what Hugging Face ``to_json`` writes) is read too.
    """
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".jsonl":
        try:
            data = json.loads(text)
            return data if isinstance(data, list) else [data]
        except json.JSONDecodeError:
            pass  # maybe JSON Lines under a .json name
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {n} is not JSON ({e.msg}); expected a JSON list or JSON Lines") from None
    return records


def find_hotpot_file(folder: Path) -> Path:
    """The questions file in a HotpotQA folder: the 100-question sample, else the official dev file."""
    for name in ("dev_distractor_100.jsonl", "hotpot_dev_distractor_v1.json"):
        if (folder / name).exists():
            return folder / name
    raise FileNotFoundError(f"no HotpotQA distractor file in {folder}")


def hotpot_suite(path: str | Path) -> QASuite:
    """Load HotpotQA in the distractor setting, pooling every question's paragraphs into one corpus.

    Args:
        path: A ``.jsonl`` / ``.json`` file, or a folder holding one (see ``find_hotpot_file``).
    """
    path = Path(path)
    if path.is_dir():
        path = find_hotpot_file(path)
    records = read_hotpot_records(path)
    by_title: dict[str, Doc] = {}
    suite = QASuite(f"hotpotqa:{path.name}", [])
    hashed, taken = 0, set()
    for i, r in enumerate(records):
        try:
            context, gold = hotpot_record_parts(r)
        except ValueError as e:
            raise ValueError(f"{path}: record {i}: {e}") from None
        for title, sentences in context:
            title = valid_unicode(title)
            if title not in by_title:
                text = valid_unicode("".join(sentences).strip())
                by_title[title] = Doc(f"hp{len(by_title):05d}", title, text)
        question, answer = valid_unicode(str(r["question"])), valid_unicode(str(r["answer"]))
        if "_id" in r or "id" in r:
            qid = valid_unicode(str(r.get("_id", r.get("id"))))
        else:
            qid, hashed = question_id(question, taken), hashed + 1
        taken.add(qid)
        suite.tasks.append(QATask(qid, question, answer, tuple(valid_unicode(t) for t in gold), str(r.get("type", "default"))))
    if hashed:
        warn_once(f"HotpotQA {path}: {hashed} of {len(records)} records have no id; each gets a stable one from a "
                  "hash of its question (hq-...)")
    suite.docs = list(by_title.values())
    return suite


def question_id(question: str, taken: set[str] = frozenset()) -> str:
    """A stable id for a record that has none: ``hq-`` and 16 hex digits of the question's SHA-1
    (``-2``, ``-3``, ... when the same question came earlier in the file)."""
    base = "hq-" + hashlib.sha1(question.encode("utf-8")).hexdigest()[:16]
    qid, n = base, 1
    while qid in taken:
        n += 1
        qid = f"{base}-{n}"
    return qid


def hotpot_record_parts(r: object) -> tuple[list[tuple[str, list[str]]], tuple[str, ...]]:
    """A record's ``[(title, sentences)]`` paragraphs and its supporting titles, in either layout.

    Raises:
        ValueError: the record is in neither layout (the message names the field).
    """
    if not isinstance(r, dict):
        raise ValueError(f"expected a JSON object, got {type(r).__name__}")
    missing = [k for k in ("question", "answer", "context", "supporting_facts") if k not in r]
    if missing:
        raise ValueError(f"missing field(s) {', '.join(missing)}; expected the official or the Hugging Face HotpotQA layout")
    ctx, sf = r["context"], r["supporting_facts"]
    if isinstance(ctx, dict):  # Hugging Face: dicts of parallel lists
        titles, sentences = ctx.get("title"), ctx.get("sentences")
        if not (isinstance(titles, list) and isinstance(sentences, list) and len(titles) == len(sentences)):
            raise ValueError("context is a dict but not {'title': [...], 'sentences': [[...], ...]} of equal lengths")
        pairs = list(zip(titles, sentences))
    elif isinstance(ctx, list) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in ctx):
        pairs = [(p[0], p[1]) for p in ctx]
    else:
        raise ValueError("context is neither [[title, sentences], ...] nor {'title': [...], 'sentences': [...]}")
    for title, sents in pairs:
        if not isinstance(title, str) or not isinstance(sents, list) or not all(isinstance(x, str) for x in sents):
            raise ValueError(f"context paragraph {str(title)[:60]!r}: expected a title string and a list of sentence strings")
    if isinstance(sf, dict) and isinstance(sf.get("title"), list):
        gold_titles = sf["title"]
    elif isinstance(sf, list) and all(isinstance(f, (list, tuple)) and f for f in sf):
        gold_titles = [f[0] for f in sf]
    else:
        raise ValueError("supporting_facts is neither [[title, sentence_index], ...] nor {'title': [...], 'sent_id': [...]}")
    if not all(isinstance(t, str) for t in gold_titles):
        raise ValueError("supporting_facts: every title must be a string")
    return pairs, tuple(dict.fromkeys(gold_titles))
