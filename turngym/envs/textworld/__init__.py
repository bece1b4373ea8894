"""TextWorld text adventures on a complexity ladder: easy, medium and hard suites.

Importing this registers the env ids only; ``textworld`` itself loads when an env is made, and
games are generated (once, cached on disk) when a split is first used.
"""

from turngym.envs.registry import register

_ENTRY = "turngym.envs.textworld.env:TextWorldEnv"

# max_turns mirrors turngym.envs.textworld.games.SUITES[level].max_turns (kept literal here so
# registering stays import-light); a test checks they agree.
register(
    "turngym/TextWorld-easy-v0", entry_point=_ENTRY, kwargs={"level": "easy"}, max_turns=10,
    description="TextWorld coin collector: follow the stated route through 2-5 rooms, take the coin (2-5 moves).",
)
register(
    "turngym/TextWorld-medium-v0", entry_point=_ENTRY, kwargs={"level": "medium"}, max_turns=30,
    description="TextWorld treasure hunter and small cooking games: doors, containers, about 10 moves.",
)
register(
    "turngym/TextWorld-hard-v0", entry_point=_ENTRY, kwargs={"level": "hard"}, max_turns=60,
    description="TextWorld cooking over 9-12 rooms: find, cook and cut 2-3 ingredients (15-40 moves).",
)
