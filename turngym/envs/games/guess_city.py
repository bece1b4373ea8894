"""Guess My City: find the secret city by asking questions (some open, most yes/no).

The rule answerer knows the table below (written for turngym; the attributes are coarse,
well-established facts: continent, country, main languages, national capital, on the sea coast,
southern hemisphere, host of the Summer Olympics). Open questions ("What continent is it on?",
"What language do people speak there?") get a short phrase, never the city's name. LMRL-Gym's
100-city list can be used with a model answerer (``cities="lmrl"``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from turngym.envs.games.qgame import Entity, Question, QuestionGameEnv

# name; aliases | country | continent | languages | capital coast south olympics (1/0)
CITIES = """
Paris | France | Europe | French | 1 0 0 1
London | United Kingdom | Europe | English | 1 0 0 1
Berlin | Germany | Europe | German | 1 0 0 1
Madrid | Spain | Europe | Spanish | 1 0 0 0
Barcelona | Spain | Europe | Spanish, Catalan | 0 1 0 1
Rome | Italy | Europe | Italian | 1 0 0 1
Milan | Italy | Europe | Italian | 0 0 0 0
Lisbon | Portugal | Europe | Portuguese | 1 1 0 0
Vienna | Austria | Europe | German | 1 0 0 0
Moscow | Russia | Europe | Russian | 1 0 0 1
Stockholm | Sweden | Europe | Swedish | 1 1 0 1
Dublin | Ireland | Europe | English | 1 1 0 0
Oslo | Norway | Europe | Norwegian | 1 1 0 0
Helsinki | Finland | Europe | Finnish | 1 1 0 1
Tokyo | Japan | Asia | Japanese | 1 1 0 1
Osaka | Japan | Asia | Japanese | 0 1 0 0
Beijing;Peking | China | Asia | Chinese, Mandarin | 1 0 0 1
Shanghai | China | Asia | Chinese, Mandarin | 0 1 0 0
Seoul | South Korea | Asia | Korean | 1 0 0 1
Mumbai;Bombay | India | Asia | Marathi, Hindi | 0 1 0 0
Delhi;New Delhi | India | Asia | Hindi | 1 0 0 0
Sydney | Australia | Oceania | English | 0 1 1 1
Auckland | New Zealand | Oceania | English | 0 1 1 0
Cairo | Egypt | Africa | Arabic | 1 0 0 0
Nairobi | Kenya | Africa | Swahili, English | 1 0 1 0
Lagos | Nigeria | Africa | English, Yoruba | 0 1 0 0
Casablanca | Morocco | Africa | Arabic, French | 0 1 0 0
New York;New York City;NYC | United States | North America | English | 0 1 0 0
Los Angeles;LA | United States | North America | English | 0 1 0 1
Chicago | United States | North America | English | 0 0 0 0
Toronto | Canada | North America | English | 0 0 0 0
Montreal | Canada | North America | French | 0 0 0 1
Vancouver | Canada | North America | English | 0 1 0 0
Mexico City | Mexico | North America | Spanish | 1 0 0 1
Havana | Cuba | North America | Spanish | 1 1 0 0
Rio de Janeiro;Rio | Brazil | South America | Portuguese | 0 1 1 1
Sao Paulo;São Paulo | Brazil | South America | Portuguese | 0 0 1 0
Santiago | Chile | South America | Spanish | 1 0 1 0
Lima | Peru | South America | Spanish | 1 1 1 0
Bogota;Bogotá | Colombia | South America | Spanish | 1 0 0 0
"""

COUNTRY_ALIASES = {"United Kingdom": r"united kingdom|\buk\b|britain|england", "United States": r"united states|\busa\b|\bthe us\b|\bu s\b"}
FLAGS = [
    ("capital", "Is it the capital of its country?", r"\bcapital\b"),
    ("coast", "Is it on the sea coast?", r"\bcoast|\bsea\b|\bocean\b|\bbeach|\bport\b"),
    ("south", "Is it in the southern hemisphere?", r"\bsouth(ern)? hemisphere\b|\bsouth of the equator\b|\bbelow the equator\b"),
    ("olympics", "Has it hosted the Summer Olympics?", r"\bolympic"),
]


def builtin_cities() -> list[Entity]:
    out = []
    for line in CITIES.strip().splitlines():
        names, country, continent, langs, flags = [p.strip() for p in line.split("|")]
        name, *aliases = names.split(";")
        attrs = {"category": continent, "country": country, "continent": continent,
                 "languages": tuple(x.strip() for x in langs.split(","))}
        attrs.update({k: bool(int(v)) for (k, _, _), v in zip(FLAGS, flags.split())})
        out.append(Entity(name, tuple(aliases), attrs))
    return out


def lmrl_cities(data_dir: str | None = None) -> list[Entity]:
    """LMRL-Gym's ``global_cities.txt`` (``Rank; City; Country; Population``)."""
    from turngym.data import dataset_path

    out = []
    for line in (Path(dataset_path("lmrl", data_dir)) / "global_cities.txt").read_text(encoding="utf-8").splitlines()[1:]:
        parts = [p.strip() for p in line.split(";")]
        if len(parts) >= 3 and parts[1]:
            out.append(Entity(parts[1], (), {"category": parts[2], "country": parts[2]}))
    return out


class GuessMyCityEnv(QuestionGameEnv):
    """Guess My City: find the secret city by asking questions about it."""

    prefix = "city"
    subject = "city"
    cannot_answer = "I can only answer questions about the city's continent, country, language, and a few yes/no facts."

    def __init__(self, split: str = "train", cities: str = "builtin", data_dir: str | None = None, **kw: Any) -> None:
        """Args:
            cities: ``builtin`` (the table) or ``lmrl`` (LMRL-Gym's 100 cities; needs a model answerer).
            data_dir: Local data folder for ``cities="lmrl"``.
            **kw: See ``QuestionGameEnv`` and ``TextEnv``.
        """
        self._cities, self._data_dir = cities, data_dir
        if cities == "lmrl" and kw.get("answerer", "rules") == "rules":
            raise ValueError("cities='lmrl' needs a model answerer: the rule answerer only knows the built-in table")
        super().__init__(split=split, **kw)

    def build_entities(self) -> list[Entity]:
        if self._cities == "builtin":
            return builtin_cities()
        if self._cities == "lmrl":
            return lmrl_cities(self._data_dir)
        raise ValueError(f"cities must be 'builtin' or 'lmrl', got {self._cities!r}")

    def build_bank(self) -> list[Question]:
        if self._cities != "builtin":
            return []
        cities = builtin_cities()
        bank = [Question("continent", "What continent is the city on?", r"\bcontinent\b",
                         lambda e: f"It is in {e.attrs['continent']}.")]
        for cont in sorted({c.attrs["continent"] for c in cities}):
            bank.append(Question(f"continent:{cont}", f"Is it in {cont}?", rf"\b{cont.lower()}\b",
                                 lambda e, c=cont: "Yes." if e.attrs["continent"] == c else "No."))
        for country in sorted({c.attrs["country"] for c in cities}):
            pattern = COUNTRY_ALIASES.get(country, rf"\b{country.lower()}\b")
            bank.append(Question(f"country:{country}", f"Is the city in {country}?", pattern,
                                 lambda e, c=country: "Yes." if e.attrs["country"] == c else "No."))
        for lang in sorted({x for c in cities for x in c.attrs["languages"]}):
            bank.append(Question(f"language:{lang}", f"Do most people there speak {lang}?", rf"\b{lang.lower()}\b",
                                 lambda e, lg=lang: "Yes." if lg in e.attrs["languages"] else "No."))
        bank.append(Question("language", "What language do most people there speak?", r"\blanguages?\b|\bspeak\b",
                             lambda e: f"Mostly {' and '.join(e.attrs['languages'])}."))
        bank += [Question(k, text, pattern, lambda e, k=k: "Yes." if e.attrs[k] else "No.") for k, text, pattern in FLAGS]
        bank.append(Question("north", "Is it in the northern hemisphere?", r"\bnorth(ern)? hemisphere\b|\bnorth of the equator\b",
                             lambda e: "No." if e.attrs["south"] else "Yes."))
        return bank

    def intro(self) -> str:
        return ("Let's play Guess My City. I am thinking of a city; find it by asking questions, one per turn "
                "(about its continent, country, language, or yes/no facts). To guess, ask \"Is it <city>?\".")
