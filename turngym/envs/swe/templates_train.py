"""The training bug templates of ``turngym/SWE-synthetic-v1`` (held-out ones: ``templates_heldout.py``).

Each template is one small function with a precise docstring, the bugs that can be injected into
it, and samplers of its constants and of valid inputs (see ``param_templates.py``). Anchors that a
number could be a prefix of end in a newline, so they stay unique whatever the constants are.
"""

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

SEQ = ("values", "numbers", "data", "readings", "series")
ITEMS = ("items", "seq", "elements", "entries", "things")
TEXT = ("text", "phrase", "line", "sentence", "words_in")


def _palindromish(r, c):
    w = word(r, "abcAB", 0, 4)
    return (r.choice([w + w[::-1], w + r.choice("xyz") + w[::-1], word(r, "abcAB", 0, 6), w.upper() + w[::-1]]),)


TRAIN_TEMPLATES: tuple[PTemplate, ...] = (
    PTemplate(
        "window_sums", ("window_sums", "rolling_totals", "block_sums", "sliding_sums"),
        (("seq", SEQ), ("w", ("width", "size", "span"))),
        "Return the sums of every run of `$w` consecutive items of `$seq`, in order.",
        '''\
            sums = []
            for start in range(len($seq) - $w + 1):
                sums.append(sum($seq[start:start + $w]))
            return sums
        ''',
        (PBug(OFF_BY_ONE, "len($seq) - $w + 1", "len($seq) - $w"),
         PBug(WRONG_OPERATOR, "start:start + $w]", "start:start - $w]")),
        lambda r, c: (ints(r, r.randint(3, 8)), r.randint(1, 3))),
    PTemplate(
        "product_range", ("product_range", "range_product", "multiply_span", "span_product"),
        (("lo", ("low", "first", "start")), ("hi", ("high", "last", "stop"))),
        "Return the product of every integer from `$lo` to `$hi`, both included (1 when `$lo` > `$hi`).",
        '''\
            result = 1
            for k in range($lo, $hi + 1):
                result *= k
            return result
        ''',
        (PBug(OFF_BY_ONE, "range($lo, $hi + 1)", "range($lo, $hi)"), PBug(WRONG_OPERATOR, "result *= k", "result += k"),
         PBug(WRONG_INIT, "result = 1\n", "result = 0\n")),
        lambda r, c: (lambda lo: (lo, lo + r.randint(-1, 5)))(r.randint(-3, 6))),
    PTemplate(
        "is_leap", ("is_leap", "leap_year", "has_leap_day", "is_leap_year", "leap_check"),
        (("y", ("year", "yr", "when", "y")),),
        "Return True if `$y` is a leap year in the Gregorian calendar.",
        '''\
            return ($y % 4 == 0 and $y % 100 != 0) or $y % 400 == 0
        ''',
        (PBug(WRONG_OPERATOR, "$y % 100 != 0", "$y % 100 == 0"), PBug(WRONG_CONDITION, ") or $y", ") and $y")),
        lambda r, c: (r.choice([r.randint(1583, 2999), 4 * r.randint(396, 749), 100 * r.randint(16, 29),
                                400 * r.randint(4, 7)]),)),
    PTemplate(
        "rotate_right", ("rotate_right", "shift_right", "cycle_right", "spin_right"),
        (("items", ITEMS), ("k", ("k", "steps", "n"))),
        "Rotate `$items` right by `$k` positions: the last `$k` items move to the front "
        "([1, 2, 3] by 1 gives [3, 1, 2]).",
        '''\
            if not $items:
                return []
            cut = len($items) - $k % len($items)
            return $items[cut:] + $items[:cut]
        ''',
        (PBug(SWAPPED_ARGS, "$items[cut:] + $items[:cut]", "$items[:cut] + $items[cut:]"),
         PBug(OFF_BY_ONE, "len($items) - $k % len($items)\n", "len($items) - $k % len($items) - 1\n")),
        lambda r, c: (ints(r, r.randint(1, 6)), r.randint(0, 7))),
    PTemplate(
        "clamp", ("clamp", "bound", "limit_to_range", "squeeze"), (("x", ("x", "value", "reading")),),
        "Return `$x` limited to the range $low..$high: $low if it is below, $high if it is above, else `$x` itself.",
        '''\
            if $x < $low:
                return $low
            if $x > $high:
                return $high
            return $x
        ''',
        (PBug(WRONG_VARIABLE, "        return $high\n", "        return $low\n"),
         PBug(WRONG_CONDITION, "if $x < $low:", "if $x > $low:")),
        lambda r, c: (r.randint(c["low"] - 15, c["high"] + 15),),
        lambda r: (lambda low: {"low": low, "high": low + r.randint(3, 40)})(r.randint(-20, 10))),
    PTemplate(
        "count_above", ("count_above", "how_many_over", "tally_above", "num_greater"),
        (("vals", ("values", "scores", "levels")), ("t", ("threshold", "cutoff", "bar"))),
        "Return how many of `$vals` are strictly greater than `$t`.",
        '''\
            return sum(1 for v in $vals if v > $t)
        ''',
        (PBug(OFF_BY_ONE, "v > $t", "v >= $t"), PBug(WRONG_OPERATOR, "v > $t", "v < $t")),
        lambda r, c: (ints(r, r.randint(0, 8)), r.randint(-3, 10))),
    PTemplate(
        "pad_left", ("pad_left", "left_pad", "fill_left", "right_align"),
        (("text", ("text", "label", "s")), ("width", ("width", "size"))),
        "Pad `$text` on the left with $fill up to `$width` characters (longer text is returned unchanged).",
        '''\
            missing = $width - len($text)
            return $fill * missing + $text if missing > 0 else $text
        ''',
        (PBug(OFF_BY_ONE, "$width - len($text)", "$width - len($text) - 1"),
         PBug(SWAPPED_ARGS, "$fill * missing + $text", "$text + $fill * missing")),
        lambda r, c: (r.choice(["x", "ab", "hello", "", "7"]), r.randint(0, 8)),
        lambda r: {"fill": r.choice("*0.-#")}),
    PTemplate(
        "digit_sum", ("digit_sum", "sum_of_digits", "digit_total", "add_digits"), (("n", ("n", "number", "value")),),
        "Return the sum of the digits of the non-negative integer `$n` written in base $base.",
        '''\
            total = 0
            while $n > 0:
                total += $n % $base
                $n //= $base
            return total
        ''',
        (PBug(WRONG_OPERATOR, "total += $n % $base", "total += $n // $base"),
         PBug(OFF_BY_ONE, "while $n > 0:", "while $n > 1:")),
        lambda r, c: (r.randint(0, 99999),),
        lambda r: {"base": r.choice([10, 10, 8, 16, 2, 5])}),
    PTemplate(
        "chunks", ("chunks", "split_every", "batches", "group_by_size"),
        (("items", ITEMS), ("size", ("size", "n", "step"))),
        "Split `$items` into consecutive lists of `$size` items; the last one may be shorter.",
        '''\
            return [$items[i:i + $size] for i in range(0, len($items), $size)]
        ''',
        (PBug(OFF_BY_ONE, "$items[i:i + $size]", "$items[i:i + $size - 1]"),
         PBug(SWAPPED_ARGS, "range(0, len($items), $size)", "range(0, $size, len($items))")),
        lambda r, c: (ints(r, r.randint(0, 9)), r.randint(1, 4))),
    PTemplate(
        "last_index", ("last_index", "rfind_item", "last_position", "index_from_end"),
        (("items", ITEMS), ("x", ("x", "target", "wanted"))),
        "Return the index of the last occurrence of `$x` in `$items`, or -1 if it is absent.",
        '''\
            for i in range(len($items) - 1, -1, -1):
                if $items[i] == $x:
                    return i
            return -1
        ''',
        (PBug(OFF_BY_ONE, "range(len($items) - 1, -1, -1)", "range(len($items) - 1, 0, -1)"),
         PBug(WRONG_OPERATOR, "$items[i] == $x", "$items[i] != $x")),
        lambda r, c: (ints(r, r.randint(0, 7), 0, 4), r.randint(0, 4))),
    PTemplate(
        "percent_of", ("percent_of", "share_percent", "as_percent", "percent_floor"),
        (("part", ("part", "done", "hits")), ("whole", ("whole", "total", "count"))),
        "Return `$part` as a whole percentage of `$whole`, rounded down.",
        '''\
            return 100 * $part // $whole
        ''',
        (PBug(SWAPPED_ARGS, "100 * $part // $whole", "100 * $whole // $part"),
         PBug(WRONG_OPERATOR, "100 * $part // $whole", "100 * $part % $whole")),
        lambda r, c: (lambda whole: (r.randint(0, whole), whole))(r.randint(1, 60))),
    PTemplate(
        "sum_of_multiples", ("sum_of_multiples", "multiple_total", "stacked_sum"), (("n", ("n", "count", "terms")),),
        "Return the sum of the first `$n` positive multiples of $k.",
        '''\
            return $k * $n * ($n + 1) // 2
        ''',
        (PBug(OFF_BY_ONE, "$n * ($n + 1)", "$n * ($n - 1)"),
         PBug(WRONG_OPERATOR, "$k * $n * ($n + 1) // 2", "$k + $n * ($n + 1) // 2")),
        lambda r, c: (r.randint(0, 50),),
        lambda r: {"k": r.randint(2, 9)}),
    PTemplate(
        "total_cost", ("total_cost", "order_total", "sum_line_items", "basket_total"),
        (("rows", ("records", "lines", "entries")),),
        "Return the total, over the dicts in `$rows`, of each one's $ka value times its $kb value.",
        '''\
            total = 0
            for row in $rows:
                total += row[$ka] * row[$kb]
            return total
        ''',
        (PBug(WRONG_OPERATOR, "row[$ka] * row[$kb]", "row[$ka] + row[$kb]"),
         PBug(WRONG_VARIABLE, "row[$ka] * row[$kb]", "row[$ka] * row[$ka]"),
         PBug(WRONG_INIT, "total = 0\n", "total = 1\n")),
        lambda r, c: ([{c["ka"]: r.randint(0, 20), c["kb"]: r.randint(0, 5)} for _ in range(r.randint(0, 5))],),
        lambda r: dict(zip(("ka", "kb"), r.choice([("price", "qty"), ("cost", "count"), ("rate", "hours"),
                                                    ("fee", "units")])))),
    PTemplate(
        "word_counts", ("word_counts", "count_words", "tally_words", "word_frequencies"), (("text", TEXT),),
        "Return a dict mapping each $sep-separated word of `$text` to how many times it occurs "
        "(empty words are skipped).",
        '''\
            counts = {}
            for w in $text.split($sep):
                if w:
                    counts[w] = counts.get(w, 0) + 1
            return counts
        ''',
        (PBug(WRONG_INIT, "counts.get(w, 0) + 1", "counts.get(w, 1) + 1"),
         PBug(WRONG_CONDITION, "        if w:\n", "        if not w:\n")),
        lambda r, c: (c["sep"].join(r.choice(["ab", "cd", "ab", "ef", ""]) for _ in range(r.randint(0, 6))),),
        lambda r: {"sep": r.choice([" ", ",", ";"])}),
    PTemplate(
        "running_max", ("running_max", "prefix_maxima", "best_so_far", "high_water_marks", "cumulative_max"),
        (("vals", ("values", "scores", "series", "heights", "xs")),),
        "Return a list whose i-th item is the largest of the first i + 1 items of `$vals`.",
        '''\
            out = []
            best = None
            for v in $vals:
                best = v if best is None else max(best, v)
                out.append(best)
            return out
        ''',
        (PBug(WRONG_OPERATOR, "max(best, v)", "min(best, v)"),
         PBug(WRONG_CONDITION, "v if best is None else", "v if best is not None else")),
        lambda r, c: (ints(r, r.randint(0, 7)),)),
    PTemplate(
        "first_over", ("first_over", "index_above", "first_exceeding", "find_above"),
        (("items", ITEMS), ("limit", ("limit", "level", "mark"))),
        "Return the index of the first item of `$items` greater than `$limit`, or -1 if there is none.",
        '''\
            for i, v in enumerate($items):
                if v > $limit:
                    return i
            return -1
        ''',
        (PBug(OFF_BY_ONE, "if v > $limit:", "if v >= $limit:"), PBug(WRONG_VARIABLE, "            return i\n",
                                                                     "            return v\n")),
        lambda r, c: (ints(r, r.randint(0, 7), 0, 9), r.randint(0, 9))),
    PTemplate(
        "caesar", ("caesar", "shift_letters", "rotate_letters", "encode_shift"),
        (("text", ("text", "message", "plain")),),
        "Shift every lowercase letter of `$text` $shift places forward in the alphabet, wrapping from z to a; "
        "other characters stay.",
        '''\
            out = []
            for ch in $text:
                if "a" <= ch <= "z":
                    ch = chr((ord(ch) - ord("a") + $shift) % 26 + ord("a"))
                out.append(ch)
            return "".join(out)
        ''',
        (PBug(WRONG_OPERATOR, "+ $shift) % 26", "- $shift) % 26"), PBug(OFF_BY_ONE, "% 26 + ord", "% 25 + ord")),
        lambda r, c: (word(r, "abcxyz -A", 0, 8),),
        lambda r: {"shift": r.choice([s for s in range(1, 26) if s != 13])}),  # 13 forward is 13 back
    PTemplate(
        "merge_sorted", ("merge_sorted", "merge_two", "combine_sorted", "merge_ascending"),
        (("a", ("a", "left", "first")), ("b", ("b", "right", "second"))),
        "Merge the ascending lists `$a` and `$b` into one ascending list.",
        '''\
            i = j = 0
            out = []
            while i < len($a) and j < len($b):
                if $a[i] <= $b[j]:
                    out.append($a[i])
                    i += 1
                else:
                    out.append($b[j])
                    j += 1
            return out + $a[i:] + $b[j:]
        ''',
        (PBug(WRONG_CONDITION, "if $a[i] <= $b[j]:", "if $a[i] >= $b[j]:"),
         PBug(OFF_BY_ONE, "out + $a[i:] + $b[j:]", "out + $a[i + 1:] + $b[j:]")),
        lambda r, c: (sorted(ints(r, r.randint(0, 5))), sorted(ints(r, r.randint(0, 5))))),
    PTemplate(
        "pairwise_gaps", ("pairwise_gaps", "step_sizes", "differences", "deltas", "neighbour_diffs"),
        (("vals", ("values", "points", "marks", "xs", "steps_in")),),
        "Return the differences between items $lag apart in `$vals`: item i + $lag minus item i, for each i.",
        '''\
            return [$vals[i + $lag] - $vals[i] for i in range(len($vals) - $lag)]
        ''',
        (PBug(SWAPPED_ARGS, "$vals[i + $lag] - $vals[i]", "$vals[i] - $vals[i + $lag]"),
         PBug(OFF_BY_ONE, "range(len($vals) - $lag)", "range(len($vals) - $lag - 1)")),
        lambda r, c: (ints(r, r.randint(0, 7)),),
        lambda r: {"lag": r.choice([1, 1, 2, 3])}),
    PTemplate(
        "mean_floor", ("mean_floor", "floor_average", "int_mean", "average_down", "whole_mean"),
        (("vals", ("values", "samples", "counts", "nums", "observations")),),
        "Return the average of the non-empty list `$vals`, rounded down to an integer.",
        '''\
            return sum($vals) // len($vals)
        ''',
        (PBug(OFF_BY_ONE, "sum($vals) // len($vals)", "sum($vals) // (len($vals) + 1)"),
         PBug(WRONG_OPERATOR, "sum($vals) // len($vals)", "sum($vals) % len($vals)")),
        lambda r, c: (ints(r, r.randint(1, 7)),)),
    PTemplate(
        "count_vowels", ("count_vowels", "vowel_count", "tally_vowels", "num_vowels"), (("text", TEXT),),
        "Return how many characters of `$text` are among $vowels (lowercase only).",
        '''\
            return sum(1 for ch in $text if ch in $vowels)
        ''',
        (PBug(WRONG_CONDITION, "if ch in $vowels", "if ch not in $vowels"),
         PBug(OFF_BY_ONE, "for ch in $text if", "for ch in $text[1:] if")),
        lambda r, c: (word(r, "aeiouybcdxA", 0, 8),),
        lambda r: {"vowels": r.choice(["aeiou", "aeiouy"])}),
    PTemplate(
        "is_palindrome", ("is_palindrome", "reads_same_backwards", "mirror_word", "symmetric_text", "palindrome_check"),
        (("text", TEXT),),
        "Return True if `$text` reads the same forwards and backwards, ignoring case.",
        '''\
            low = $text.lower()
            for i in range(len(low) // 2):
                if low[i] != low[-i - 1]:
                    return False
            return True
        ''',
        (PBug(OFF_BY_ONE, "low[-i - 1]", "low[-i]"), PBug(WRONG_CONDITION, "if low[i] != low", "if low[i] == low")),
        _palindromish),
    PTemplate(
        "fizz_word", ("fizz_word", "beat_label", "say_number", "chant_for"), (("n", ("n", "number", "i")),),
        "Return $both if `$n` is divisible by $a and by $b, $w1 if only by $a, $w2 if only by $b, "
        "else `$n` as a string.",
        '''\
            if $n % $a == 0 and $n % $b == 0:
                return $both
            if $n % $a == 0:
                return $w1
            if $n % $b == 0:
                return $w2
            return str($n)
        ''',
        (PBug(WRONG_CONDITION, "if $n % $a == 0 and $n % $b == 0:", "if $n % $a == 0 or $n % $b == 0:"),
         PBug(WRONG_VARIABLE, "        return $w2\n", "        return $w1\n")),
        lambda r, c: (r.randint(1, 60),),
        lambda r: (lambda ab, ws: {"a": ab[0], "b": ab[1], "w1": ws[0], "w2": ws[1], "both": ws[0] + ws[1]})(
            r.choice([(2, 3), (3, 5), (2, 5), (3, 4), (4, 5), (2, 7), (3, 7)]),
            r.choice([("Fizz", "Buzz"), ("Ping", "Pong"), ("Tick", "Tock"), ("Foo", "Bar")]))),
    PTemplate(
        "grade_letter", ("grade_letter", "letter_for", "band_of", "score_band"),
        (("score", ("score", "points", "mark")),),
        "Return 'A' if `$score` >= $ca, 'B' if it is >= $cb, 'C' if it is >= $cc, else 'F'.",
        '''\
            if $score >= $ca:
                return "A"
            if $score >= $cb:
                return "B"
            if $score >= $cc:
                return "C"
            return "F"
        ''',
        (PBug(WRONG_CONDITION, "if $score >= $ca:", "if $score <= $ca:"),
         PBug(WRONG_VARIABLE, "return \"C\"", "return \"B\"")),
        lambda r, c: (r.choice([r.randint(0, 100), c["ca"], c["cb"], c["cc"]]),),
        lambda r: (lambda ca: (lambda cb: {"ca": ca, "cb": cb, "cc": cb - r.randint(8, 15)})(ca - r.randint(8, 15)))(
            r.randint(80, 95))),
    PTemplate(
        "dedupe", ("dedupe", "unique_in_order", "drop_repeats", "first_occurrences", "distinct_items"),
        (("items", ITEMS),),
        "Return the items of `$items` without repeats, each kept where it first appears.",
        '''\
            seen = set()
            out = []
            for x in $items:
                if x not in seen:
                    seen.add(x)
                    out.append(x)
            return out
        ''',
        (PBug(WRONG_CONDITION, "if x not in seen:", "if x in seen:"),
         PBug(WRONG_OPERATOR, "out.append(x)", "out.insert(0, x)")),
        lambda r, c: (ints(r, r.randint(0, 8), 0, 5),)),
    PTemplate(
        "grow_balance", ("grow_balance", "compound", "apply_interest", "accrue"),
        (("amount", ("amount", "principal", "balance")), ("years", ("years", "periods", "terms"))),
        "Add $rate percent interest, rounded down to a whole number, to `$amount` once per year for `$years` years; "
        "return the result.",
        '''\
            for _ in range($years):
                $amount += $amount * $rate // 100
            return $amount
        ''',
        (PBug(OFF_BY_ONE, "range($years)", "range($years + 1)"),
         PBug(WRONG_OPERATOR, "$amount * $rate // 100", "$amount * $rate % 100")),
        lambda r, c: (r.randint(0, 5000), r.randint(0, 6)),
        lambda r: {"rate": r.randint(1, 25)}),
    PTemplate(
        "run_lengths", ("run_lengths", "count_runs", "squeeze_runs", "runs_of", "rle_pairs"),
        (("text", ("text", "s", "chars", "symbols", "letters")),),
        "Return a list of [char, count] pairs, one per run of equal consecutive characters of `$text`.",
        '''\
            runs = []
            for ch in $text:
                if runs and runs[-1][0] == ch:
                    runs[-1][1] += 1
                else:
                    runs.append([ch, 1])
            return runs
        ''',
        (PBug(WRONG_INIT, "runs.append([ch, 1])", "runs.append([ch, 0])"),
         PBug(WRONG_CONDITION, "if runs and runs[-1][0] == ch:", "if runs and runs[-1][0] != ch:")),
        lambda r, c: (word(r, "aab", 0, 8),)),
    PTemplate(
        "interleave", ("interleave", "zip_merge", "alternate", "weave"),
        (("a", ("a", "xs", "first")), ("b", ("b", "ys", "second"))),
        "Return the items of `$a` and `$b` alternately, starting with `$a`; the rest of the longer list comes last.",
        '''\
            out = []
            for i in range(max(len($a), len($b))):
                if i < len($a):
                    out.append($a[i])
                if i < len($b):
                    out.append($b[i])
            return out
        ''',
        (PBug(SWAPPED_ARGS, "        if i < len($a):\n            out.append($a[i])\n        if i < len($b):\n"
                            "            out.append($b[i])\n",
              "        if i < len($b):\n            out.append($b[i])\n        if i < len($a):\n"
              "            out.append($a[i])\n"),
         PBug(WRONG_OPERATOR, "range(max(len($a), len($b)))", "range(min(len($a), len($b)))")),
        lambda r, c: (ints(r, r.randint(0, 4)), ints(r, r.randint(0, 4)))),
    PTemplate(
        "bucket_counts", ("bucket_counts", "histogram", "bin_counts", "tally_buckets"),
        (("vals", ("values", "samples", "levels")),),
        "Count `$vals` into $nb buckets of width $width starting at 0 (values past the last bucket go in the last "
        "one); return the list of counts.",
        '''\
            counts = [0] * $nb
            for v in $vals:
                counts[min(v // $width, $nb - 1)] += 1
            return counts
        ''',
        (PBug(OFF_BY_ONE, "min(v // $width, $nb - 1)", "min(v // $width, $nb - 2)"),
         PBug(WRONG_OPERATOR, "v // $width", "v % $width")),
        lambda r, c: (ints(r, r.randint(0, 8), 0, c["width"] * c["nb"] + 10),),
        lambda r: {"width": r.randint(2, 10), "nb": r.randint(3, 6)}),
    PTemplate(
        "title_case", ("title_case", "capitalize_words", "headline", "cap_each_word", "proper_case"), (("text", TEXT),),
        "Capitalise the first letter of every $sep-separated word of `$text` and lowercase the rest.",
        '''\
            words = []
            for w in $text.split($sep):
                words.append(w[:1].upper() + w[1:].lower())
            return $sep.join(words)
        ''',
        (PBug(OFF_BY_ONE, "w[:1].upper() + w[1:].lower()", "w[:1].upper() + w[2:].lower()"),
         PBug(WRONG_OPERATOR, "w[:1].upper() + w[1:].lower()", "w[:1].lower() + w[1:].upper()")),
        lambda r, c: (c["sep"].join(word(r, "aBcDe", 0, 5) for _ in range(r.randint(1, 4))),),
        lambda r: {"sep": r.choice([" ", "-", "_"])}),
)
