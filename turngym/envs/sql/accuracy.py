"""Execution accuracy: does the submitted query return the same result as the gold query?

The rule (used for the reward):

- Both queries run on the same database. Each result is a list of rows; a row is a tuple of
  values compared by position (column names are ignored, column order is not).
- Floats are rounded to 6 decimals, so ``3`` equals ``3.0`` and harmless float noise is ignored.
- If the gold query has a **top-level** ``ORDER BY`` (one not inside parentheses), the results
  must be equal as ordered lists; otherwise they must be equal as **multisets** of rows
  (duplicates count).
- Partial credit (optional) is the F1 of the two row multisets.
"""

from __future__ import annotations

import re
from collections import Counter

_ORDER_BY = re.compile(r"\border\s+by\b", re.IGNORECASE)


def _norm_value(v):
    if isinstance(v, float):
        r = round(v, 6)
        return int(r) if r.is_integer() else r
    return v


def normalize_rows(rows: list[tuple]) -> list[tuple]:
    return [tuple(_norm_value(v) for v in r) for r in rows]


def strip_sql_literals(sql: str) -> str:
    """``sql`` with string literals, quoted identifiers and comments blanked out."""
    sql = re.sub(r"--[^\n]*", " ", sql)
    sql = re.sub(r"/\*.*?\*/", " ", sql, flags=re.DOTALL)
    return re.sub(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|`[^`]*`|\[[^\]]*\]", "''", sql)


def has_top_level_order_by(sql: str) -> bool:
    """True when ``sql`` has an ``ORDER BY`` outside every parenthesis (it orders the result)."""
    text = strip_sql_literals(sql)
    depth = 0
    flat = []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        flat.append(ch if depth == 0 and ch not in "()" else " ")
    return bool(_ORDER_BY.search("".join(flat)))


def results_match(pred: list[tuple], gold: list[tuple], ordered: bool) -> bool:
    """Equality under the rule above (lists if ``ordered``, else multisets)."""
    p, g = normalize_rows(pred), normalize_rows(gold)
    if ordered:
        return p == g
    return Counter(p) == Counter(g)


def row_f1(pred: list[tuple], gold: list[tuple]) -> float:
    """F1 of the row multisets (1.0 when both are empty)."""
    p, g = Counter(normalize_rows(pred)), Counter(normalize_rows(gold))
    if not p and not g:
        return 1.0
    common = sum((p & g).values())
    if common == 0:
        return 0.0
    precision, recall = common / sum(p.values()), common / sum(g.values())
    return 2 * precision * recall / (precision + recall)
