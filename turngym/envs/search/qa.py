"""Answer metrics with the standard SQuAD / HotpotQA normalisation.

``normalize_answer`` lower-cases, removes punctuation, the articles *a*, *an*, *the*, and extra
whitespace. Exact match compares normalised strings; token F1 compares their bags of words.
As in the official HotpotQA script, a yes/no/noanswer prediction gets F1 0 unless it equals the
(normalised) gold answer.
"""

from __future__ import annotations

import re
import string
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)
_SPECIAL = ("yes", "no", "noanswer")


def normalize_answer(s: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction: str, gold: str) -> float:
    """Token-level F1 between the normalised prediction and gold answer."""
    p, g = normalize_answer(prediction), normalize_answer(gold)
    if (p in _SPECIAL or g in _SPECIAL) and p != g:
        return 0.0
    pt, gt = p.split(), g.split()
    common = sum((Counter(pt) & Counter(gt)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pt), common / len(gt)
    return 2 * precision * recall / (precision + recall)
