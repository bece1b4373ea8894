"""Memos for the pure, slow parts of TextWorld's PDDL engine, installed in the process that runs
``AlfworldEngine`` (its own child process by default).

Where an ALFWorld game spends its time on one core (a kitchen game, before these memos):

- Starting a game: TextWorld translates its PDDL to a planning task (``fast_downward.pddl2sas``)
  twice when it loads the game and twice again on every reset (once as is, once optimized for its
  replanner), 0.5-1.5 s each. The translation is a function of the domain and problem texts.
- Every step: the text of each applicable action is derived from the game's grammar, and each
  derivation parses its template string and the conditions of the rules it meets with TatSu (a
  PEG parser in pure Python), the same few dozen strings every step: most of a 0.1-0.2 s step.

So the translations of the latest games are kept, keyed by their texts, and the parses of
template and condition strings are kept per string (a derivation gets a deep copy of the parsed
symbols, which it then fills in). And where a derivation copies its context for each symbol,
TextWorld deep-copies the bindings of the grammar's variables (entity records and logic
variables, which derivations only read); the memos copy the two dicts and share their values,
which was the rest of a step's time. The optimized translation only serves TextWorld's replanner;
without ``replan`` the plain one stands in for it (the walkthrough comes from the game file, so
the replanner is never asked). ``tests/test_alfworld_splits.py`` plays games with and without the
memos and compares every observation.
"""

from __future__ import annotations

import copy
from typing import Any


class TranslationMemo:
    """``fast_downward.pddl2sas`` with its latest results kept, keyed by the texts it translates."""

    def __init__(self, translate: Any, optimize_for_replan: bool, size: int = 4) -> None:
        self.translate, self.optimize_for_replan, self.size = translate, optimize_for_replan, size
        self.results: dict[tuple, Any] = {}
        self.calls = self.misses = 0

    def __call__(self, domain: str, problem: str, verbose: bool = False, optimize: bool = False) -> Any:
        self.calls += 1
        optimize = optimize and self.optimize_for_replan
        key = (domain, problem, optimize)
        if key not in self.results:
            self.misses += 1
            if len(self.results) >= self.size:
                self.results.pop(next(iter(self.results)))  # the oldest game's
            self.results[key] = self.translate(domain, problem, verbose=verbose, optimize=optimize)
        return self.results[key]


class ParseMemo:
    """A string parser with its results kept per call; each call gets a deep copy (``copies``) or the
    kept object itself (read-only results)."""

    def __init__(self, parse: Any, copies: bool) -> None:
        self.parse, self.copies = parse, copies
        self.results: dict[tuple, Any] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = (args, tuple(sorted(kwargs.items())))
        if key not in self.results:
            self.results[key] = self.parse(*args, **kwargs)
        return copy.deepcopy(self.results[key]) if self.copies else self.results[key]


def install(replan: bool) -> TranslationMemo:
    """Put the memos in place of TextWorld's own functions in this process (once; a later call only
    updates whether the replanner's translation is optimized). Returns the translation memo."""
    import fast_downward
    from textworld.envs.pddl import logic as pddl_logic
    from textworld.envs.pddl import textgen
    from textworld.logic import Rule

    current = fast_downward.pddl2sas
    if isinstance(current, TranslationMemo):
        current.optimize_for_replan = current.optimize_for_replan or replan
        return current
    memo = TranslationMemo(current, optimize_for_replan=replan)
    # TextWorld's PddlState calls ``fast_downward.pddl2sas`` through the module
    fast_downward.pddl2sas = pddl_logic.fast_downward.pddl2sas = memo
    # derive() fills in the symbols it gets, so each call gets its own copy
    textgen._parse_and_convert = ParseMemo(textgen._parse_and_convert, copies=True)
    queries = ParseMemo(Rule.parse_conjunctive_query, copies=False)  # rules are only read

    class _Rule(Rule):
        parse_conjunctive_query = staticmethod(queries)

    textgen.Rule = _Rule  # textgen's own name for Rule: the rest of TextWorld keeps the original
    textgen.copy_context = _copy_context
    return memo


def _copy_context(context: dict) -> dict:
    """``textgen.copy_context`` with the bindings' dicts copied and their values shared: derivations
    add bindings to their own copy, and only read the values (in the grammar's ``{o.name}`` terms)."""
    return {"state": context["state"], "facts": context["facts"], "variables": dict(context["variables"]),
            "mapping": dict(context["mapping"]), "entity_infos": context["entity_infos"]}
