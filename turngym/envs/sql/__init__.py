"""SQL environments: text-to-SQL with tools over read-only SQLite, scored by execution accuracy."""

from turngym.envs.registry import register

register(
    "turngym/SQL-synthetic-v0",
    entry_point="turngym.envs.sql.env:SQLEnv",
    kwargs={"suite": "synthetic"},
    max_turns=10,
    description="Text-to-SQL over 3 generated databases (shop, school, flights); easy/medium/hard",
)
register(
    "turngym/SQL-spider-v0",
    entry_point="turngym.envs.sql.env:SQLEnv",
    kwargs={"suite": "spider"},
    max_turns=10,
    description="Text-to-SQL on Spider (needs `turngym data download spider` or TURNGYM_DATA)",
)
