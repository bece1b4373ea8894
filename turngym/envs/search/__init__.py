"""Search environments: multi-hop QA with search / open / answer tools, scored by EM or F1."""

from turngym.envs.registry import register

register(
    "turngym/Search-synthetic-v0",
    entry_point="turngym.envs.search.env:SearchEnv",
    kwargs={"suite": "synthetic"},
    max_turns=12,
    description="Multi-hop QA over a generated encyclopedia of fictional entities (BM25 search)",
)
register(
    "turngym/Search-synthetic-large-v0",
    entry_point="turngym.envs.search.env:SearchEnv",
    kwargs={"suite": "synthetic", "n_people": 320, "n_companies": 192},
    max_turns=12,
    description="The synthetic encyclopedia at 8x the size: about 650 questions, 130 of them held out",
)
register(
    "turngym/Search-synthetic-large-v1",
    entry_point="turngym.envs.search.env:SearchEnv",
    kwargs={"suite": "synthetic", "n_people": 320, "n_companies": 192, "split_by": "entity"},
    max_turns=12,
    description="The large encyclopedia held out by knowledge: a quarter of its people, and every question "
                "about them, are test only",
)
register(
    "turngym/Search-hotpotqa-v0",
    entry_point="turngym.envs.search.env:SearchEnv",
    kwargs={"suite": "hotpotqa"},
    max_turns=12,
    description="HotpotQA distractor setting, paragraphs pooled into a BM25 corpus (needs the data)",
)
