"""The held-out bug templates of ``turngym/SWE-synthetic-v1``: functions, names, record keys and
packages that no training task uses (training templates: ``templates_train.py``)."""

from __future__ import annotations

from turngym.envs.swe.param_templates import (
    OFF_BY_ONE,
    SWAPPED_ARGS,
    WRONG_CONDITION,
    WRONG_INIT,
    WRONG_OPERATOR,
    WRONG_VARIABLE,
    PBug,
    PTemplate,
    ints,
    word,
)


def _luhn_code(r, c):
    """A digit string that passes the Luhn check half of the time."""
    digits = [r.randint(0, 9) for _ in range(r.randint(1, 9))]
    total = sum((d * 2 - 9 if d * 2 > 9 else d * 2) if i % 2 == 0 else d for i, d in enumerate(reversed(digits)))
    check = (10 - total % 10) % 10 if r.random() < 0.5 else r.randint(0, 9)
    return ("".join(map(str, digits + [check])),)


def _grid(r, c):
    cols = r.randint(1, 4)
    return ([ints(r, cols, 0, 9) for _ in range(r.randint(1, 4))],)


HELDOUT_TEMPLATES: tuple[PTemplate, ...] = (
    PTemplate(
        "luhn_valid", ("luhn_valid", "check_digits_ok", "passes_checksum", "luhn_ok", "valid_card_number"),
        (("code", ("code", "digits", "number", "card", "serial")),),
        "Return True if the digit string `$code` passes the Luhn check: from the right, double every second digit "
        "(subtracting 9 from results above 9); the sum of the digits must be divisible by 10.",
        '''\
            total = 0
            for pos, ch in enumerate(reversed($code)):
                d = int(ch)
                if pos % 2 == 1:
                    d *= 2
                    if d > 9:
                        d -= 9
                total += d
            return total % 10 == 0
        ''',
        (PBug(OFF_BY_ONE, "if pos % 2 == 1:", "if pos % 2 == 0:"), PBug(WRONG_OPERATOR, "d -= 9", "d -= 10")),
        _luhn_code),
    PTemplate(
        "transpose", ("transpose", "flip_grid", "columns_of", "swap_axes", "turn_table"),
        (("grid", ("grid", "matrix", "table", "cells", "board")),),
        "Return the transpose of the rectangular list of lists `$grid`: row i of the result is column i of `$grid`.",
        '''\
            if not $grid:
                return []
            return [[row[c] for row in $grid] for c in range(len($grid[0]))]
        ''',
        (PBug(OFF_BY_ONE, "range(len($grid[0]))", "range(len($grid[0]) - 1)"),
         PBug(WRONG_VARIABLE, "range(len($grid[0]))", "range(len($grid))")),
        _grid),
    PTemplate(
        "climb_cost", ("climb_cost", "ascent_effort", "uphill_cost"),
        (("heights", ("heights", "profile", "altitudes")),),
        "Return the cost of walking along `$heights`: each unit of rise from one height to the next costs $cost; "
        "descents are free.",
        '''\
            total = 0
            for prev, cur in zip($heights, $heights[1:]):
                if cur > prev:
                    total += (cur - prev) * $cost
            return total
        ''',
        (PBug(WRONG_CONDITION, "if cur > prev:", "if cur < prev:"), PBug(SWAPPED_ARGS, "(cur - prev)", "(prev - cur)")),
        lambda r, c: (ints(r, r.randint(0, 7), 0, 12),),
        lambda r: {"cost": r.randint(2, 9)}),
    PTemplate(
        "longest_rise", ("longest_rise", "longest_increasing_run", "best_streak", "max_climb_run", "rising_span"),
        (("vals", ("samples", "track", "sequence", "prices", "temps")),),
        "Return the length of the longest run of consecutive, strictly increasing items of `$vals` "
        "(0 when it is empty).",
        '''\
            if not $vals:
                return 0
            best = cur = 1
            for prev, nxt in zip($vals, $vals[1:]):
                cur = cur + 1 if nxt > prev else 1
                best = max(best, cur)
            return best
        ''',
        (PBug(WRONG_CONDITION, "if nxt > prev else", "if nxt >= prev else"),
         PBug(WRONG_INIT, "best = cur = 1", "best = cur = 0")),
        lambda r, c: (ints(r, r.randint(0, 8), 0, 6),)),
    PTemplate(
        "tally_by", ("tally_by", "sum_per_group", "group_totals"), (("rows", ("rows", "ledger", "entries")),),
        "Return a dict mapping each value of row[$kg] among the dicts `row` in `$rows` to the sum of row[$kv] over "
        "the rows with that value.",
        '''\
            totals = {}
            for row in $rows:
                totals[row[$kg]] = totals.get(row[$kg], 0) + row[$kv]
            return totals
        ''',
        (PBug(WRONG_VARIABLE, "totals.get(row[$kg], 0) + row[$kv]", "totals.get(row[$kg], 0) + 1"),
         PBug(WRONG_OPERATOR, "= totals.get(row[$kg], 0) + row[$kv]", "= max(totals.get(row[$kg], 0), row[$kv])")),
        lambda r, c: ([{c["kg"]: r.choice(["x", "y", "z"]), c["kv"]: r.randint(0, 9)}
                       for _ in range(r.randint(0, 6))],),
        lambda r: dict(zip(("kg", "kv"), r.choice([("team", "points"), ("city", "visits"), ("tag", "weight"),
                                                    ("owner", "amount")])))),
    PTemplate(
        "balanced", ("balanced", "brackets_match", "well_nested", "pairs_closed", "nesting_ok"),
        (("text", ("expr", "source", "snippet", "markup", "formula")),),
        "Return True if every $op in `$text` is closed by a later $cl and no $cl comes before its $op.",
        '''\
            depth = 0
            for ch in $text:
                if ch == $op:
                    depth += 1
                elif ch == $cl:
                    depth -= 1
                    if depth < 0:
                        return False
            return depth == 0
        ''',
        (PBug(WRONG_OPERATOR, "return depth == 0", "return depth >= 0"), PBug(OFF_BY_ONE, "if depth < 0:",
                                                                            "if depth < -1:")),
        lambda r, c: ("".join(r.choice([c["op"], c["cl"], "q"]) for _ in range(r.randint(0, 8))),),
        lambda r: dict(zip(("op", "cl"), r.choice(["()", "[]", "{}", "<>"])))),
    PTemplate(
        "every_nth", ("every_nth", "take_stride", "sample_every"), (("items", ("pool", "stream", "queue")),
                                                                    ("step", ("step", "stride", "gap"))),
        "Return every `$step`-th item of `$items`, starting at index $offset.",
        '''\
            return $items[$offset::$step]
        ''',
        (PBug(SWAPPED_ARGS, "$items[$offset::$step]", "$items[$step::$offset]"),
         PBug(OFF_BY_ONE, "$items[$offset::$step]", "$items[$offset + 1::$step]")),
        lambda r, c: (ints(r, r.randint(0, 9)), r.randint(1, 3)),
        lambda r: {"offset": r.randint(0, 2)}),
    PTemplate(
        "tax_due", ("tax_due", "levy", "income_tax"), (("income", ("income", "earnings", "salary")),),
        "Return the tax on `$income`, rounded down: nothing up to $t1, $r1 percent of the part between $t1 and $t2, "
        "and $r2 percent of the part above $t2.",
        '''\
            tax = 0
            if $income > $t2:
                tax += ($income - $t2) * $r2
                $income = $t2
            if $income > $t1:
                tax += ($income - $t1) * $r1
            return tax // 100
        ''',
        (PBug(WRONG_VARIABLE, "($income - $t2) * $r2", "($income - $t2) * $r1"),
         PBug(SWAPPED_ARGS, "($income - $t1)", "($t1 - $income)")),
        lambda r, c: (r.randint(0, 2 * c["t2"]),),
        lambda r: (lambda t1, r1: {"t1": t1, "t2": t1 + r.choice([3000, 5000, 10000]), "r1": r1,
                                   "r2": r1 + r.randint(5, 25)})(r.choice([1000, 2000, 5000]), r.randint(5, 20))),
    PTemplate(
        "wrap_words", ("wrap_words", "fold_text", "break_lines"), (("text", ("prose", "para", "body")),
                                                                  ("width", ("width", "limit", "cols"))),
        "Split `$text` into lines of space-separated words, greedily, so that no line is longer than `$width` "
        "characters unless it is a single word.",
        '''\
            lines = []
            cur = ""
            for w in $text.split():
                if cur and len(cur) + 1 + len(w) > $width:
                    lines.append(cur)
                    cur = w
                else:
                    cur = cur + " " + w if cur else w
            if cur:
                lines.append(cur)
            return lines
        ''',
        (PBug(OFF_BY_ONE, "len(cur) + 1 + len(w) > $width", "len(cur) + 1 + len(w) >= $width"),
         PBug(WRONG_VARIABLE, "            cur = w\n", "            cur = \"\"\n")),
        lambda r, c: (" ".join(word(r, "abc", 1, 5) for _ in range(r.randint(0, 6))), r.randint(3, 12))),
    PTemplate(
        "walk_position", ("walk_position", "final_spot", "follow_moves", "end_point", "trace_walk"),
        (("moves", ("moves", "route", "trail", "commands", "directions")),),
        "Start at (0, 0) and follow `$moves`, a string of $up (y + 1), $down (y - 1), $right (x + 1) and $left "
        "(x - 1); return the final (x, y).",
        '''\
            x = y = 0
            for m in $moves:
                if m == $up:
                    y += 1
                elif m == $down:
                    y -= 1
                elif m == $right:
                    x += 1
                elif m == $left:
                    x -= 1
            return (x, y)
        ''',
        (PBug(SWAPPED_ARGS, "return (x, y)", "return (y, x)"), PBug(WRONG_OPERATOR, "y -= 1", "y += 1")),
        lambda r, c: ("".join(r.choice([c["up"], c["down"], c["right"], c["left"]]) for _ in range(r.randint(0, 8))),),
        lambda r: dict(zip(("up", "down", "right", "left"), r.choice([("N", "S", "E", "W"), ("U", "D", "R", "L")])))),
    PTemplate(
        "median_low", ("median_low", "lower_median", "middle_value", "central_item", "median_floor"),
        (("vals", ("sizes", "weights", "lengths", "ages", "votes")),),
        "Return the lower median of the non-empty list `$vals`: its middle item once sorted, or the smaller of the "
        "two middle items.",
        '''\
            ordered = sorted($vals)
            return ordered[(len(ordered) - 1) // 2]
        ''',
        (PBug(OFF_BY_ONE, "(len(ordered) - 1) // 2", "len(ordered) // 2"),
         PBug(WRONG_VARIABLE, "ordered = sorted($vals)", "ordered = list($vals)")),
        lambda r, c: (ints(r, r.randint(1, 7)),)),
    PTemplate(
        "to_roman", ("to_roman", "roman_numeral", "as_roman", "roman_of", "numeral"),
        (("n", ("num", "amount", "qty", "year_no", "k")),),
        "Return the Roman numeral of the integer 1 <= `$n` <= 399, written with C, XC, L, XL, X, IX, V, IV and I.",
        '''\
            out = ""
            for value, sym in ((100, "C"), (90, "XC"), (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")):
                while $n >= value:
                    out += sym
                    $n -= value
            return out
        ''',
        (PBug(WRONG_CONDITION, "while $n >= value:", "while $n > value:"),
         PBug(WRONG_VARIABLE, "(9, \"IX\")", "(9, \"XI\")")),
        lambda r, c: (r.randint(1, 399),)),
)
