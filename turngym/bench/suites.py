"""Named benchmark suites: lists of (env id, task split, episodes) entries.

A suite is extended by registration, like envs and agents::

    from turngym.bench.suites import register_suite
    register_suite("mine", [("turngym/Maze-v0", "test", 50), ("my/Env-v0", "test", 20, {"size": 6})])

Episode counts are chosen so that ``turngym bench --suite all --agent oracle`` finishes in a few
minutes on two CPU cores; ``--episodes N`` overrides every entry.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence


@dataclass(frozen=True)
class SuiteEntry:
    """One env of a suite.

    Args:
        env_id: A registered env id.
        split: Task split passed to the env (``""`` keeps the env's default).
        episodes: Episodes to play; they cycle over the split's tasks (spread evenly when fewer).
        env_kwargs: Extra constructor kwargs, as sorted ``(key, value)`` pairs (hashable).
    """

    env_id: str
    split: str = "test"
    episodes: int = 30
    env_kwargs: tuple[tuple[str, Any], ...] = ()

    @property
    def key(self) -> str:
        """The entry's name in reports: the env id, plus its extra kwargs if any."""
        if not self.env_kwargs:
            return self.env_id
        return f"{self.env_id}[{','.join(f'{k}={v}' for k, v in self.env_kwargs)}]"

    def make_kwargs(self) -> dict[str, Any]:
        """Constructor kwargs for ``turngym.make``."""
        return {**({"split": self.split} if self.split else {}), **dict(self.env_kwargs)}


_SUITES: dict[str, list[SuiteEntry]] = {}


def _entry(e: SuiteEntry | Sequence) -> SuiteEntry:
    if isinstance(e, SuiteEntry):
        return e
    env_id, split, episodes, *rest = e
    kwargs = tuple(sorted((rest[0] if rest else {}).items()))
    return SuiteEntry(env_id, split, int(episodes), kwargs)


def register_suite(name: str, entries: Sequence[SuiteEntry | Sequence]) -> list[SuiteEntry]:
    """Add (or replace) the suite ``name``.

    Args:
        name: Suite name for ``turngym bench --suite NAME``.
        entries: ``SuiteEntry`` objects or tuples ``(env_id, split, episodes[, env_kwargs])``.

    Returns:
        The suite's entries.

    Raises:
        ValueError: no entries, a non-positive episode count, or the same entry twice.
    """
    out = [_entry(e) for e in entries]
    if not out:
        raise ValueError(f"suite {name!r} has no entries")
    keys = [e.key for e in out]
    dup = {k for k in keys if keys.count(k) > 1}
    if dup:
        raise ValueError(f"suite {name!r} lists {sorted(dup)} more than once")
    bad = [e.key for e in out if e.episodes < 1]
    if bad:
        raise ValueError(f"suite {name!r}: episodes must be >= 1 for {bad}")
    _SUITES[name] = out
    return out


def get_suite(name: str, episodes: int | None = None) -> list[SuiteEntry]:
    """The entries of suite ``name``, each with ``episodes`` episodes if given.

    Raises:
        KeyError: unknown suite (the message lists the known ones).
    """
    if name not in _SUITES:
        raise KeyError(f"unknown suite {name!r}; known: {', '.join(list_suites())}")
    entries = _SUITES[name]
    if episodes is not None:
        if episodes < 1:
            raise ValueError(f"episodes must be >= 1, got {episodes}")
        entries = [replace(e, episodes=episodes) for e in entries]
    return list(entries)


def list_suites() -> list[str]:
    """Registered suite names, sorted."""
    return sorted(_SUITES)


_T = "turngym/"
_BUILTIN = {
    "textworld": [(f"{_T}TextWorld-{lvl}-v0", "test", 30) for lvl in ("easy", "medium", "hard")],
    "alfworld": [(f"{_T}ALFWorld-v0", "test", 30)],
    "sql": [(f"{_T}SQL-synthetic-v1", "test", 30), (f"{_T}SQL-spider-v1", "test", 30)],
    "search": [(f"{_T}Search-synthetic-v0", "test", 30), (f"{_T}Search-hotpotqa-v0", "test", 30)],
    # Each SWE episode builds a sandbox and runs the hidden tests, hence fewer episodes.
    "swe": [(f"{_T}SWE-synthetic-v0", "test", 20), (f"{_T}SWE-quixbugs-v0", "test", 20)],
    # The rule-answered games only; the -llm-v0 variants need a language model as the answerer.
    "lmrl": [
        (f"{_T}Maze-v0", "test", 30),
        (f"{_T}Maze-partial-v0", "test", 30),
        (f"{_T}TextNav-v0", "test", 30),
        (f"{_T}Wordle-v0", "test", 30),
        (f"{_T}Wordle-v0", "test", 30, {"words": "lmrl"}),  # LMRL-Gym's official word lists (data)
        (f"{_T}TwentyQuestions-v0", "test", 30),
        (f"{_T}GuessMyCity-v0", "test", 30),
        (f"{_T}Chess-v0", "test", 30),  # needs the stockfish binary (apt-get install stockfish)
        (f"{_T}Endgames-v0", "test", 30),
        (f"{_T}CarDealer-v0", "test", 30),
    ],
}
for _name, _entries in _BUILTIN.items():
    register_suite(_name, _entries)
register_suite("all", [e for n in _BUILTIN for e in _SUITES[n]])
