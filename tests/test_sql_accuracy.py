"""Execution accuracy agrees with the official Spider evaluator (taoyds/test-suite-sql-eval,
``exec_eval.py``: ``result_eq`` and the ``order by`` rule of ``eval_exec_match``).

Each expected verdict below was worked out by hand from the official rules, which the
module docstring of ``turngym.envs.sql.accuracy`` restates. Results are ``(gold, pred)``.
"""

from __future__ import annotations

import pytest

from turngym.envs.sql.accuracy import order_matters, results_match

# (name, gold rows, predicted rows, order matters, official verdict)
CASES = [
    ("both empty", [], [], False, True),
    ("empty vs one row", [], [(1,)], False, False),
    ("one row vs empty", [(1,)], [], True, False),
    ("different column count", [(1, 2)], [(1,)], False, False),
    ("duplicates count (multiset, not set)", [(1,), (1,), (2,)], [(1,), (2,), (2,)], False, False),
    ("same multiset, other order", [(1,), (2,), (1,)], [(1,), (1,), (2,)], False, True),
    ("missing duplicate", [(1,), (1,)], [(1,)], False, False),
    ("rows swapped, order matters", [(1,), (2,)], [(2,), (1,)], True, False),
    ("rows swapped, order free", [(1,), (2,)], [(2,), (1,)], False, True),
    ("columns swapped", [(1, "a"), (2, "b")], [("a", 1), ("b", 2)], False, True),
    ("columns swapped, order matters, rows in order", [(1, "a"), (2, "b")], [("a", 1), ("b", 2)], True, True),
    ("columns swapped and rows reordered, order free", [(1, "a"), (2, "b")], [("b", 2), ("a", 1)], False, True),
    ("columns swapped and rows reordered, order matters", [(1, "a"), (2, "b")], [("b", 2), ("a", 1)], True, False),
    ("pairs broken by the swap", [(1, "a"), (2, "b")], [("b", 1), ("a", 2)], False, False),
    ("two equal columns", [(1, 2), (1, 3)], [(2, 1), (3, 1)], False, True),
    ("four columns permuted", [(1, "a", 2.5, None), (2, "b", 3.5, "x")], [(None, 2.5, "a", 1), ("x", 3.5, "b", 2)], True, True),
    ("four columns, one value differs", [(1, "a", 2.5, None), (2, "b", 3.5, "x")], [(None, 2.5, "a", 1), ("x", 3.5, "c", 2)], False, False),
    ("NULLs equal NULLs", [(None,), (1,)], [(1,), (None,)], False, True),
    ("NULL is not 0", [(None,)], [(0,)], False, False),
    ("NULL is not the text 'NULL'", [(None,)], [("NULL",)], False, False),
    ("NULL is not ''", [(None,)], [("",)], False, False),
    ("int equals float of the same value", [(3,)], [(3.0,)], False, True),
    ("no rounding: 0.1 + 0.2 != 0.3", [(0.3,)], [(0.1 + 0.2,)], False, False),
    ("text '1' is not 1", [("1",)], [(1,)], False, False),
    # The official quick check sorts each row's values by str(value) + str(type): 2 sorts after
    # 2.5 ("2<" > "2."), 2.0 before it, so these rows differ there although == holds. 1 and 1.0
    # both sort before 2.5, so those rows match.
    ("int/float tie-break: (2, 2.5) vs (2.0, 2.5)", [(2, 2.5)], [(2.0, 2.5)], False, False),
    ("int/float tie-break: (1, 2.5) vs (1.0, 2.5)", [(1, 2.5)], [(1.0, 2.5)], False, True),
]


@pytest.mark.parametrize("name,gold,pred,ordered,expected", CASES, ids=[c[0] for c in CASES])
def test_agrees_with_the_official_result_eq(name, gold, pred, ordered, expected):
    assert results_match(pred, gold, ordered) is expected


def test_strict_keeps_columns_in_place():
    assert results_match([("a", 1), ("b", 2)], [(1, "a"), (2, "b")], ordered=False)
    assert not results_match([("a", 1), ("b", 2)], [(1, "a"), (2, "b")], ordered=False, strict=True)
    assert results_match([(1, "a"), (2, "b")], [(1, "a"), (2, "b")], ordered=True, strict=True)
    assert not results_match([(1,), (1,), (2,)], [(1,), (2,), (2,)], ordered=False, strict=True)  # still a multiset


@pytest.mark.parametrize("sql,expected", [
    ("SELECT a FROM t ORDER BY a", True),
    ("select a from t order by a desc limit 3", True),
    ("SELECT a FROM t WHERE a IN (SELECT b FROM u ORDER BY b LIMIT 2)", True),  # anywhere counts
    ("SELECT 'order by' FROM t", True),  # the official test is a plain substring
    ("SELECT a FROM t ORDER  BY a", False),  # ... with exactly one space
    ("SELECT a FROM t GROUP BY a", False),
])
def test_order_matters_follows_the_official_substring_rule(sql, expected):
    assert order_matters(sql) is expected


def test_many_identical_columns_do_not_explode():
    # 12 all-NULL columns: 12! orders, but identical gold columns are only tried in one order
    gold = [tuple([None] * 12 + [i]) for i in range(3)]
    pred = [tuple([i] + [None] * 12) for i in range(3)]
    assert results_match(pred, gold, ordered=False)
    assert not results_match(pred, [tuple([None] * 12 + [i + 1]) for i in range(3)], ordered=False)
