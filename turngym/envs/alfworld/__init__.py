"""ALFWorld: household tasks (six types) as text games, from ALFWorld's ``game.tw-pddl`` files.

``turngym/ALFWorld-v0``; ``make(..., split="valid_seen" | "valid_unseen" | "train")``. The data
comes from ``turngym data download alfworld`` or ``$TURNGYM_DATA/alfworld``. Entry points are
strings, so importing this package loads neither textworld nor alfworld.
"""

from turngym.envs.registry import register

register(
    "turngym/ALFWorld-v0",
    entry_point="turngym.envs.alfworld.env:ALFWorldEnv",
    max_turns=50,  # env.MAX_TURNS: ALFWorld's limit (literal here, so registering imports nothing)
    description="ALFWorld household tasks (pick, look, clean, heat, cool, pick two) as TextWorld PDDL games",
)
