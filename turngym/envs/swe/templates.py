"""Reference functions for the synthetic SWE suite, each with the bugs that can be injected into it.

A function's source (``inspect.getsource``) becomes repository code; its expected outputs come
from calling it. Each ``Bug`` is a textual edit of that source (``old`` -> ``new``, unique in
the function) of one kind -- an off-by-one, a wrong operator or swapped arguments -- plus a
witness input on which the buggy version answers differently, so the hidden tests always catch it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

OFF_BY_ONE, WRONG_OPERATOR, SWAPPED_ARGS = "off_by_one", "wrong_operator", "swapped_args"
BUG_KINDS = (OFF_BY_ONE, WRONG_OPERATOR, SWAPPED_ARGS)


@dataclass(frozen=True)
class Bug:
    kind: str
    old: str
    new: str
    witness: tuple  # arguments on which the buggy function is wrong


@dataclass(frozen=True)
class Template:
    fn: Callable
    bugs: tuple[Bug, ...]
    cases: Callable[[random.Random], list[tuple]]  # random valid argument tuples

    @property
    def name(self) -> str:
        return self.fn.__name__


# ----- the reference functions (kept free of imports: their source is copied verbatim) ----------
def moving_sum(values, width):
    """Return the sums of every window of `width` consecutive values."""
    sums = []
    for start in range(len(values) - width + 1):
        sums.append(sum(values[start:start + width]))
    return sums


def factorial(n):
    """Return n! for a non-negative integer n."""
    result = 1
    for k in range(2, n + 1):
        result *= k
    return result


def is_leap(year):
    """Return True if `year` is a leap year in the Gregorian calendar."""
    return (year % 4 == 0 and year % 100 != 0) or year % 400 == 0


def dot(a, b):
    """Return the dot product of two equal-length lists of numbers."""
    return sum(x * y for x, y in zip(a, b))


def rotate(items, k):
    """Rotate a list right by k positions: rotate([1, 2, 3], 1) == [3, 1, 2]."""
    if not items:
        return []
    k %= len(items)
    return items[len(items) - k:] + items[:len(items) - k]


def power_mod(base, exp, mod):
    """Return (base ** exp) % mod, computed efficiently."""
    return pow(base, exp, mod)


def replace_word(text, old, new):
    """Return `text` with every occurrence of `old` replaced by `new`."""
    return text.replace(old, new)


def triangle(n):
    """Return the n-th triangular number 1 + 2 + ... + n."""
    return n * (n + 1) // 2


def last_index(items, x):
    """Return the index of the last occurrence of x in items, or -1 if absent."""
    for i in range(len(items) - 1, -1, -1):
        if items[i] == x:
            return i
    return -1


def digit_sum(n):
    """Return the sum of the decimal digits of a non-negative integer n."""
    total = 0
    while n > 0:
        total += n % 10
        n //= 10
    return total


def pairwise_diff(a, b):
    """Return [a[i] - b[i] for each i] for two equal-length lists."""
    return [x - y for x, y in zip(a, b)]


def chunks(items, size):
    """Split items into consecutive lists of length `size` (the last one may be shorter)."""
    return [items[i:i + size] for i in range(0, len(items), size)]


def count_above(values, threshold):
    """Return how many values are strictly greater than threshold."""
    return sum(1 for v in values if v > threshold)


def pad_left(text, width, fill):
    """Pad text on the left with the `fill` character up to `width` characters."""
    missing = width - len(text)
    return fill * missing + text if missing > 0 else text


def percent(part, whole):
    """Return part as a percentage of whole, rounded to one decimal place."""
    return round(100 * part / whole, 1)


# ----- random valid inputs ---------------------------------------------------------------------
def _ints(rng: random.Random, n: int, lo: int = -9, hi: int = 20) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(n)]


def _words(rng: random.Random) -> str:
    vocab = ["red", "blue", "cat", "dog", "sun", "sea", "cat", "sky"]
    return " ".join(rng.choice(vocab) for _ in range(rng.randint(2, 6)))


def _pair(rng: random.Random) -> list[tuple]:
    n = rng.randint(1, 6)
    return [(_ints(rng, n), _ints(rng, n))]


TEMPLATES: tuple[Template, ...] = (
    Template(moving_sum, (
        Bug(OFF_BY_ONE, "len(values) - width + 1", "len(values) - width", ([1, 2, 3], 2)),
        Bug(WRONG_OPERATOR, "start:start + width", "start:start - width", ([4, 5, 6], 2)),
    ), lambda r: [(_ints(r, r.randint(3, 8)), r.randint(1, 3))]),
    Template(factorial, (
        Bug(OFF_BY_ONE, "range(2, n + 1)", "range(2, n)", (5,)),
        Bug(WRONG_OPERATOR, "result *= k", "result += k", (4,)),
    ), lambda r: [(r.randint(0, 10),)]),
    Template(is_leap, (
        Bug(WRONG_OPERATOR, "year % 100 != 0", "year % 100 == 0", (2024,)),
        Bug(WRONG_OPERATOR, ") or year", ") and year", (2000,)),
    ), lambda r: [(r.choice([r.randint(1583, 2999), 4 * r.randint(396, 749), 100 * r.randint(16, 29),
                             400 * r.randint(4, 7)]),)]),  # any year, leap years, centuries, 400-multiples
    Template(dot, (
        Bug(WRONG_OPERATOR, "x * y", "x + y", ([1, 2], [3, 4])),
    ), _pair),
    Template(rotate, (
        Bug(SWAPPED_ARGS, "items[len(items) - k:] + items[:len(items) - k]",
            "items[:len(items) - k] + items[len(items) - k:]", ([1, 2, 3], 1)),
        Bug(OFF_BY_ONE, "items[len(items) - k:] +", "items[len(items) - k - 1:] +", ([1, 2, 3, 4], 1)),
    ), lambda r: [(_ints(r, r.randint(1, 6)), r.randint(0, 7))]),
    Template(power_mod, (
        Bug(SWAPPED_ARGS, "pow(base, exp, mod)", "pow(exp, base, mod)", (2, 5, 1000)),
    ), lambda r: [(r.randint(2, 9), r.randint(0, 12), r.randint(2, 97))]),
    Template(replace_word, (
        Bug(SWAPPED_ARGS, "text.replace(old, new)", "text.replace(new, old)", ("a cat", "cat", "dog")),
    ), lambda r: [(_words(r), "cat", r.choice(["dog", "owl", "CAT"]))]),
    Template(triangle, (
        Bug(OFF_BY_ONE, "n * (n + 1) // 2", "n * (n - 1) // 2", (3,)),
        Bug(WRONG_OPERATOR, "n * (n + 1) // 2", "n + (n + 1) // 2", (4,)),
    ), lambda r: [(r.randint(0, 50),)]),
    Template(last_index, (
        Bug(OFF_BY_ONE, "range(len(items) - 1, -1, -1)", "range(len(items) - 1, 0, -1)", ([7, 1, 2], 7)),
        Bug(WRONG_OPERATOR, "items[i] == x", "items[i] != x", ([5, 5, 6], 5)),
    ), lambda r: [(_ints(r, r.randint(0, 7), 0, 4), r.randint(0, 4))]),
    Template(digit_sum, (
        Bug(WRONG_OPERATOR, "total += n % 10", "total += n // 10", (123,)),
        Bug(OFF_BY_ONE, "while n > 0:", "while n > 9:", (7,)),
    ), lambda r: [(r.randint(0, 99999),)]),
    Template(pairwise_diff, (
        Bug(SWAPPED_ARGS, "zip(a, b)", "zip(b, a)", ([5], [2])),
        Bug(WRONG_OPERATOR, "x - y", "x + y", ([5], [2])),
    ), _pair),
    Template(chunks, (
        Bug(OFF_BY_ONE, "items[i:i + size]", "items[i:i + size - 1]", ([1, 2, 3, 4], 2)),
        Bug(SWAPPED_ARGS, "range(0, len(items), size)", "range(0, size, len(items))", ([1, 2, 3, 4, 5], 2)),
    ), lambda r: [(_ints(r, r.randint(0, 9)), r.randint(1, 4))]),
    Template(count_above, (
        Bug(OFF_BY_ONE, "v > threshold", "v >= threshold", ([1, 2, 3], 2)),
        Bug(WRONG_OPERATOR, "v > threshold", "v < threshold", ([1, 5, 9], 4)),
    ), lambda r: [(_ints(r, r.randint(0, 8)), r.randint(-3, 10))]),
    Template(pad_left, (
        Bug(OFF_BY_ONE, "width - len(text)", "width - len(text) - 1", ("ab", 5, "*")),
        Bug(SWAPPED_ARGS, "fill * missing + text", "text + fill * missing", ("7", 3, "0")),
    ), lambda r: [(r.choice(["x", "ab", "hello", ""]), r.randint(0, 8), r.choice(["*", "0", "."]))]),
    Template(percent, (
        Bug(SWAPPED_ARGS, "100 * part / whole", "100 * whole / part", (1, 4)),
        Bug(WRONG_OPERATOR, "100 * part / whole", "100 * part // whole", (1, 3)),
    ), lambda r: [(r.randint(0, 50), r.randint(1, 60))]),
)


def template(name: str) -> Template:
    """The template of the function called ``name``."""
    for t in TEMPLATES:
        if t.name == name:
            return t
    raise KeyError(name)
