"""Parametrised bug templates: one function, written once, that yields many tasks.

A ``PTemplate`` is a function's source with placeholders (``string.Template``: ``$fn`` for its
name, one per argument, one per constant), the pools each is drawn from, the constants' sampler,
a sampler of valid inputs, and the bugs that can be injected (textual edits of the rendered
source, each unique in it). Rendering draws a name, argument names and constants from a seeded
generator; the rendered source is both the repository's code and, run here, the reference
that expected values come from. The buggy version is the same source with one bug's edit.

Constants are written into the source as Python literals (``repr``), so a data shape (a record's
key names, a fill character, thresholds) is a constant too. Bugs must terminate on every valid
input: the generator calls buggy functions here to find inputs they get wrong.
"""

from __future__ import annotations

import copy
import random
import string
import textwrap
from dataclasses import dataclass, field
from typing import Any, Callable

OFF_BY_ONE, WRONG_OPERATOR, SWAPPED_ARGS = "off_by_one", "wrong_operator", "swapped_args"
WRONG_CONDITION, WRONG_VARIABLE, WRONG_INIT = "wrong_condition", "wrong_variable", "wrong_init"
BUG_KINDS = (OFF_BY_ONE, WRONG_OPERATOR, SWAPPED_ARGS, WRONG_CONDITION, WRONG_VARIABLE, WRONG_INIT)


@dataclass(frozen=True)
class PBug:
    """An injected bug: replace ``old`` (unique in the rendered function) with ``new``; both are
    rendered with the task's placeholders first."""

    kind: str
    old: str
    new: str


@dataclass(frozen=True)
class PTemplate:
    """A parametrised reference function and its bugs.

    Args:
        key: Names the template (unique over every template of every split).
        names: Function names to draw from.
        args: ``(placeholder, names to draw from)`` per argument, in order.
        doc: The docstring (one line; placeholders allowed).
        body: The function's body (placeholders allowed; its common indentation is removed).
        bugs: The bugs that can be injected.
        inputs: ``(rng, consts) -> args``: one valid argument tuple.
        consts: ``rng -> {placeholder: value}``: the constants of one rendering.
    """

    key: str
    names: tuple[str, ...]
    args: tuple[tuple[str, tuple[str, ...]], ...]
    doc: str
    body: str
    bugs: tuple[PBug, ...]
    inputs: Callable[[random.Random, dict], tuple]
    consts: Callable[[random.Random], dict] = field(default=lambda rng: {})


@dataclass(frozen=True)
class Rendered:
    """One rendering of a template: its function's name, docstring, source and constants."""

    template: PTemplate
    name: str
    doc: str
    source: str
    consts: dict[str, Any]
    subs: dict[str, str]

    def bugged(self, bug: PBug) -> str:
        """The source with ``bug`` injected.

        Raises:
            AssertionError: The bug's anchor is not unique in the rendered source (fix the template).
        """
        old, new = (string.Template(s).substitute(self.subs) for s in (bug.old, bug.new))
        if self.source.count(old) != 1:
            raise AssertionError(f"{self.template.key}: bug anchor {old!r} occurs {self.source.count(old)} times")
        return self.source.replace(old, new, 1)

    def function(self, source: str | None = None) -> Callable:
        """The function defined by ``source`` (default: the reference), run here."""
        namespace: dict = {}
        exec(compile(source or self.source, f"<{self.template.key}>", "exec"), namespace)
        return namespace[self.name]

    def sample(self, rng: random.Random) -> tuple:
        return self.template.inputs(rng, self.consts)


def render(t: PTemplate, rng: random.Random, taken: set[str] = frozenset()) -> Rendered:
    """Draw a name (not in ``taken``), argument names and constants, and write the source."""
    name = rng.choice([n for n in t.names if n not in taken])
    consts = t.consts(rng)
    subs = {"fn": name, **{ph: rng.choice(pool) for ph, pool in t.args}, **{k: repr(v) for k, v in consts.items()}}
    fill = lambda s: string.Template(s).substitute(subs)  # noqa: E731
    params = ", ".join(subs[ph] for ph, _ in t.args)
    doc = fill(t.doc)
    body = textwrap.indent(textwrap.dedent(fill(t.body)).strip("\n"), "    ")
    source = f'def {name}({params}):\n    """{doc}"""\n{body.rstrip()}\n'
    return Rendered(t, name, doc, source, consts, subs)


def is_wrong(wrong: Callable, right: Callable, args: tuple) -> bool:
    """The two functions answer ``args`` differently (a crash of ``wrong`` counts)."""
    try:
        return wrong(*copy.deepcopy(args)) != right(*copy.deepcopy(args))
    except Exception:
        return True


def exposing_inputs(r: Rendered, bug: PBug, rng: random.Random, n: int, avoid: list[tuple],
                    tries: int = 5000) -> list[tuple]:
    """``n`` distinct valid inputs, none in ``avoid``, on which the buggy function is wrong.

    Raises:
        AssertionError: Random inputs expose this bug too rarely (fix the template).
    """
    wrong, right = r.function(r.bugged(bug)), r.function()
    out: list[tuple] = []
    for _ in range(tries):
        args = r.sample(rng)
        if args not in avoid and args not in out and is_wrong(wrong, right, args):
            out.append(args)
            if len(out) == n:
                return out
    raise AssertionError(f"{r.template.key}/{bug.kind}: random inputs expose the bug too rarely")


# ----- input helpers the templates share ------------------------------------------------------------
def ints(rng: random.Random, n: int, lo: int = -9, hi: int = 20) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(n)]


def word(rng: random.Random, letters: str = "abcdefghij", lo: int = 1, hi: int = 6) -> str:
    return "".join(rng.choice(letters) for _ in range(rng.randint(lo, hi)))
