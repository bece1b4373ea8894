"""Execution accuracy: does the submitted query return the same result as the gold query?

The rule (used for the reward) is the official Spider execution metric's (``result_eq`` and
``eval_exec_match`` in taoyds/test-suite-sql-eval, ``exec_eval.py``):

- Both queries run on the same database. Each result is a list of rows.
- Two empty results match. Otherwise both need the same number of rows and of columns.
- Column names are ignored, and so is column order: the results match if some permutation of
  the submitted result's columns makes them equal. ``strict=True`` keeps the columns in place.
- If the gold query contains ``order by`` (the official test: the lower-cased text holds that
  substring, sub-queries included), rows are compared as ordered lists; otherwise as
  **multisets** (duplicates count).
- Values compare with Python's ``==``: ``3`` equals ``3.0``, ``0.1 + 0.2`` does not equal ``0.3``,
  ``NULL`` equals ``NULL``. Like the official code, a first check compares each row's values
  sorted by their text and type name, which can tell apart rows that ``==`` alone would not
  (``(2, 2.5)`` vs ``(2.0, 2.5)``); we keep that so our verdicts agree with the official ones.
- The official evaluator also removes ``DISTINCT`` from both queries unless run with
  ``--keep_distinct``; we run the queries as written, i.e. as ``--keep_distinct``.
- Partial credit (optional) is the F1 of the two row multisets, columns in place.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

MAX_PERMUTATIONS = 50_000  # column permutations tried before giving up (identical columns are pruned first)


def order_matters(gold_sql: str) -> bool:
    """Whether row order counts, by the official rule: ``"order by" in gold_sql.lower()``."""
    return "order by" in gold_sql.lower()


def _unordered(row: tuple) -> tuple:
    return tuple(sorted(row, key=lambda v: f"{v}{type(v)}"))


def _same_unordered_rows(pred: list[tuple], gold: list[tuple], ordered: bool) -> bool:
    """The official quick rejection: rows with their values sorted must agree (as a set if unordered)."""
    p, g = [_unordered(r) for r in pred], [_unordered(r) for r in gold]
    return p == g if ordered else set(p) == set(g)


def _column_permutations(pred: list[tuple], gold: list[tuple]) -> Iterator[tuple[int, ...]]:
    """Orders of ``pred``'s columns that could equal ``gold``: ``perm[i]`` is the pred column put
    at gold position ``i``. A pred column is a candidate for position ``i`` only if all its values
    occur in gold column ``i``; of identical gold columns only one assignment order is tried."""
    n = len(gold[0])
    gold_sets = [{r[i] for r in gold} for i in range(n)]
    pred_cols = [[r[j] for r in pred] for j in range(n)]
    gold_cols = [tuple(r[i] for r in gold) for i in range(n)]
    options = [[j for j in range(n) if all(v in gold_sets[i] for v in pred_cols[j])] for i in range(n)]
    twin = [next((k for k in reversed(range(i)) if gold_cols[k] == gold_cols[i]), None) for i in range(n)]
    perm: list[int] = []

    def extend() -> Iterator[tuple[int, ...]]:
        i = len(perm)
        if i == n:
            yield tuple(perm)
            return
        for j in options[i]:
            if j in perm or (twin[i] is not None and j < perm[twin[i]]):
                continue
            perm.append(j)
            yield from extend()
            perm.pop()

    return extend()


def results_match(pred: list[tuple], gold: list[tuple], ordered: bool, strict: bool = False) -> bool:
    """Equality under the rule above.

    Args:
        pred: The submitted query's rows.
        gold: The gold query's rows.
        ordered: Rows must come in the same order (see ``order_matters``).
        strict: Columns must also be in the same order (no permutation is searched).
    """
    if not pred and not gold:
        return True
    if len(pred) != len(gold) or len(pred[0]) != len(gold[0]):
        return False
    if not _same_unordered_rows(pred, gold, ordered):
        return False
    perms = [tuple(range(len(gold[0])))] if strict else _column_permutations(pred, gold)
    gold_set, gold_bag = set(gold), None
    for tried, perm in enumerate(perms):
        if tried >= MAX_PERMUTATIONS:
            return False
        moved = [tuple(r[j] for j in perm) for r in pred]
        if ordered:
            if moved == gold:
                return True
        elif set(moved) == gold_set:  # cheap necessary condition before counting duplicates
            gold_bag = gold_bag or Counter(gold)
            if Counter(moved) == gold_bag:
                return True
    return False


def row_f1(pred: list[tuple], gold: list[tuple]) -> float:
    """F1 of the row multisets, columns in place (1.0 when both are empty)."""
    p, g = Counter(pred), Counter(gold)
    if not p and not g:
        return 1.0
    common = sum((p & g).values())
    if common == 0:
        return 0.0
    precision, recall = common / sum(p.values()), common / sum(g.values())
    return 2 * precision * recall / (precision + recall)
