"""SQL environments: text-to-SQL with tools over read-only SQLite, scored by execution accuracy.

v1 (2026-11-23): accuracy follows the official Spider metric (columns in any order, no float rounding,
rows ordered when the gold query has ORDER BY anywhere); v0 compared columns in order and rounded floats.
v2: the generated suite, 1,200 training and 360 held-out tasks over 78 databases; held-out databases
come from domains no training database uses (``turngym.envs.sql.generated``). v1 keeps its three databases.
"""

from turngym.envs.registry import register

register(
    "turngym/SQL-synthetic-v1",
    entry_point="turngym.envs.sql.env:SQLEnv",
    kwargs={"suite": "synthetic"},
    max_turns=10,
    description="Text-to-SQL over 3 generated databases (shop, school, flights); easy/medium/hard",
)
register(
    "turngym/SQL-synthetic-v2",
    entry_point="turngym.envs.sql.env:SQLEnv",
    kwargs={"suite": "generated"},
    max_turns=10,
    description="Text-to-SQL over 78 generated databases in 16 domains; held-out databases are from unseen domains",
)
register(
    "turngym/SQL-spider-v1",
    entry_point="turngym.envs.sql.env:SQLEnv",
    kwargs={"suite": "spider"},
    max_turns=10,
    description="Text-to-SQL on Spider (needs `turngym data download spider` or TURNGYM_DATA)",
)
