"""Fuzz ``env.step`` of every env family in every tool format with adversarial replies
(``fuzz_replies.ReplyGen``): no step raises, and no step runs past its deadline.

The default run plays ``FAST_PER_FAMILY`` replies per family (about 1,000 in all); the ``slow``
test plays ``SLOW_PER_FAMILY`` (over 20,000 in all). Both print a per-family summary (run with
``-s`` to see it): replies, exceptions, resets, and the longest step.

Deadlines are hang guards, not speed checks: a step may take at most its env's own limit (the
engine deadline of TextWorld and ALFWorld; ``MAX_CALLS_PER_ACTION`` times the per-call limit
elsewhere) plus ``SLACK_S`` for a shared machine.
"""

from __future__ import annotations

import json
import time
import traceback
import zlib
from collections import Counter
from pathlib import Path

import pytest
from fuzz_replies import (
    FAMILIES,
    FORMATS,
    ReplyGen,
    _is_printing,
    _printing,
    swe_guard,
    swe_make_safe,
)

import turngym
from turngym.envs.engine import EngineBacked
from turngym.tools.formats import MAX_CALLS_PER_ACTION
from turngym.types import Message

FAST_PER_FAMILY = 92
SLOW_PER_FAMILY = 2000
SLACK_S = 15.0


# The SWE family runs on the local backend on purpose (no engine needed); its warning is known.
pytestmark = pytest.mark.filterwarnings("ignore::turngym.tools.sandbox.local_backend.UnsafeSandboxWarning")


@pytest.fixture(scope="session")
def tw_cache(request, tmp_path_factory) -> Path:
    # The same folder tests/test_textworld.py generates its games into, so they are made once.
    cache = getattr(request.config, "cache", None)
    return cache.mkdir("turngym_textworld") if cache is not None else tmp_path_factory.mktemp("textworld")


def _make(family: str, fmt: str, tw_cache: Path):
    env_id, kw, _ = FAMILIES[family]
    kw = dict(kw)
    if family == "textworld":
        pytest.importorskip("textworld")
        kw["cache_dir"] = str(tw_cache)
    if family == "alfworld":
        pytest.importorskip("alfworld")
    if not env_id.startswith("tests/"):
        kw["split"] = "test"
    try:
        return turngym.make(env_id, tool_format=fmt, max_turns=10**6, **kw)
    except FileNotFoundError as e:  # turngym.data.DataNotFound
        pytest.skip(f"{family}: task data not available ({e})")


def step_deadline(env, family: str) -> float:
    base = env.unwrapped
    if isinstance(base, EngineBacked):
        return base.engine_deadline_s
    return MAX_CALLS_PER_ACTION * FAMILIES[family][2]


def test_swe_guard_only_lets_printing_commands_through():
    assert _is_printing(_printing("rm -rf / ; $(id) `x` 'q' \"\\"))
    assert not _is_printing("printf %s 'a' ; id") and not _is_printing("id") and not _is_printing("printf %s a b")
    assert swe_make_safe("bash", {"command": "id"}) == {"command": "printf %s id"}


# ----- the fuzz -------------------------------------------------------------------------------
def fuzz_family(family: str, n: int, tw_cache: Path, seed: int = 0) -> dict:
    """Play ``n`` replies (split over the formats) against one family; return what happened."""
    stats = {"replies": 0, "exceptions": [], "resets": 0, "max_step_s": 0.0, "deadline_s": 0.0,
             "over_deadline": [], "truncated": 0, "kinds": Counter()}
    for k, fmt in enumerate(FORMATS):
        env = _make(family, fmt, tw_cache)
        base = env.unwrapped
        deadline = step_deadline(env, family)
        stats["deadline_s"] = deadline
        gen = ReplyGen(base.tools, fmt, seed=zlib.crc32(f"{seed}:{family}:{fmt}".encode()),
                       make_safe=swe_make_safe if family == "swe" else None)
        tasks = list(base.task_ids)
        env.reset(seed=k, options={"task_id": tasks[0]})
        for i in range(n // len(FORMATS)):
            reply = gen()
            if family == "swe":
                reply = swe_guard(base, reply)
            t0 = time.perf_counter()
            try:
                obs, _, terminated, truncated, info = env.step(reply)
            except Exception as e:  # what the test is looking for: collect them all, then fail
                tb = traceback.extract_tb(e.__traceback__)[-3:]
                where = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in reversed(tb))
                stats["exceptions"].append((fmt, f"{type(e).__name__}: {str(e)[:150]}", where, repr(reply)[:160]))
                terminated = truncated = True
            else:
                assert all(isinstance(m, Message) and isinstance(m.content, str) for m in obs), obs
                json.dumps(info)
                stats["truncated"] += bool(truncated)
            dt = time.perf_counter() - t0
            stats["max_step_s"] = max(stats["max_step_s"], dt)
            if dt > deadline + SLACK_S:
                stats["over_deadline"].append((fmt, round(dt, 2), repr(reply)[:160]))
            stats["replies"] += 1
            if terminated or truncated:
                stats["resets"] += 1
                env.reset(seed=i, options={"task_id": tasks[i % len(tasks)]})
        env.close()
    return stats


def _check(family: str, stats: dict) -> None:
    kinds = Counter(e[1].split(":")[0] for e in stats["exceptions"])
    print(f"\n[fuzz] {family}: {stats['replies']} replies, {len(stats['exceptions'])} exceptions {dict(kinds)}, "
          f"{stats['resets']} resets, {stats['truncated']} truncated, max step {stats['max_step_s']:.3f}s "
          f"(deadline {stats['deadline_s']:g}s)")
    for e in {e[1]: e for e in stats["exceptions"]}.values():  # one line per distinct message
        print(f"[fuzz]   {e}")
    assert not stats["exceptions"], f"{family}: {len(stats['exceptions'])} steps raised; first: {stats['exceptions'][0]}"
    assert not stats["over_deadline"], f"{family}: steps over their deadline: {stats['over_deadline'][:3]}"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_fuzz_no_step_raises_or_hangs(family, tw_cache):
    stats = fuzz_family(family, FAST_PER_FAMILY, tw_cache)
    assert stats["replies"] >= FAST_PER_FAMILY - len(FORMATS)
    _check(family, stats)


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_fuzz_20k_no_step_raises_or_hangs(family, tw_cache):
    stats = fuzz_family(family, SLOW_PER_FAMILY, tw_cache, seed=1)
    assert stats["replies"] == SLOW_PER_FAMILY
    _check(family, stats)
