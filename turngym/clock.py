"""Where a run's time goes, and the progress bars of its long stages.

``CLOCK`` charges every second of the thread that started the run to one (stage, kind) pair:

- the stage is what the pipeline is doing (``sft``, ``eval_sft``, ``branch_bc/search``, ...),
  named by ``CLOCK.stage(name)``; stages nest (``branch_bc`` holds ``branch_bc/screen``);
- the kind is the work at hand (``generation``; ``env_step``; ``env_startup``: opening envs and
  resetting them, where a new TextWorld env starts its engine; ``update``; ``game_generation``),
  named by ``CLOCK.kind(name)`` where that work is done; an inner kind
  pauses the outer one, so the kinds of a stage add up to its wall time. Time under no kind is
  ``other`` (Python bookkeeping, batching, checkpoints, logging).

A mark costs two ``perf_counter`` calls: cheap enough to stay on in every run. Other threads (async
collection, env threads) do not count, as their time overlaps the main thread's.

    with CLOCK.stage("eval_sft"):
        ...
            with CLOCK.kind("generation"):
                policy.act(...)
    CLOCK.breakdown()  # {"total_s": ..., "by_kind": {...}, "by_stage": {stage: {kind: s}}}

``bar(...)`` shows the progress of a long stage (an evaluation, SFT, a round of search, a fit,
game generation), so a person can follow it in a terminal and in a log:

- in a terminal: a tqdm bar with the units done, the rate and an ETA;
- off a terminal (``turngym train > log 2>&1``, CI): one line on stderr every
  ``$TURNGYM_PROGRESS_EVERY`` seconds (10 by default), and one when the stage ends;
- ``$TURNGYM_PROGRESS``: ``auto`` (the above), ``bar`` or ``always`` (a bar even off a terminal),
  ``lines`` (lines even in a terminal), ``never``; ``quiet()`` (``--quiet``) turns it off.

A rollout moves in turns, not episodes: episodes start together and end together (a batch of 32
evaluation episodes ends within a minute), so a rate of episodes says nothing until the first wave
ends, then jumps. A rollout's ``Progress`` also counts turns, shows their rate, and estimates the
ETA as the turns still to play (episodes left times the mean length of the ended ones) over that
rate; before any episode has ended there is no length to go by, and the ETA reads ``?``. A ticker
thread redraws the bar (or writes the line) while the caller sits in one long call.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import os
import sys
import threading
import time
import weakref
from typing import Any, Callable, Iterator

KINDS = ("generation", "env_step", "env_startup", "update", "game_generation", "other")


class Clock:
    """Wall-clock seconds by (stage, kind), for the thread that calls ``reset``."""

    def __init__(self, timer: Callable[[], float] = time.perf_counter) -> None:
        self.timer = timer
        self.reset()

    def reset(self) -> None:
        """Start counting afresh, from now, on the calling thread."""
        self._owner = threading.get_ident()
        self._stages: list[str] = []
        self._kinds: list[str] = []
        self._mark = self.timer()
        self._start = self._mark
        self.seconds: dict[tuple[str, str], float] = {}

    def _charge(self) -> None:
        now = self.timer()
        key = (self._stages[-1] if self._stages else "", self._kinds[-1] if self._kinds else "other")
        self.seconds[key] = self.seconds.get(key, 0.0) + now - self._mark
        self._mark = now

    @contextlib.contextmanager
    def _push(self, stack_name: str, name: str) -> Iterator[None]:
        if threading.get_ident() != self._owner:  # a background thread: its time overlaps ours
            yield
            return
        stack = getattr(self, stack_name)
        self._charge()
        stack.append(name)
        try:
            yield
        finally:
            self._charge()
            stack.pop()

    def stage(self, name: str) -> contextlib.AbstractContextManager:
        """Charge the time inside to stage ``name`` (nested in the current stage: ``outer/name``)."""
        full = f"{self._stages[-1]}/{name}" if self._stages and threading.get_ident() == self._owner else name
        return self._push("_stages", full)

    def kind(self, name: str) -> contextlib.AbstractContextManager:
        """Charge the time inside to work of kind ``name`` (one of ``KINDS``), pausing the outer kind."""
        return self._push("_kinds", name)

    def timed(self, kind: str) -> Callable:
        """A decorator: every call of the function is work of ``kind``."""
        def wrap(fn: Callable) -> Callable:
            @functools.wraps(fn)
            def inner(*args: Any, **kwargs: Any) -> Any:
                with self.kind(kind):
                    return fn(*args, **kwargs)
            return inner
        return wrap

    def breakdown(self) -> dict[str, Any]:
        """The seconds so far: ``total_s``, ``by_kind`` (over every stage) and ``by_stage`` (each
        stage's own time by kind, its inner stages not included; ``""`` is time outside any stage)."""
        if threading.get_ident() == self._owner:
            self._charge()
        by_kind: dict[str, float] = {}
        by_stage: dict[str, dict[str, float]] = {}
        for (stage, kind), s in self.seconds.items():
            by_kind[kind] = by_kind.get(kind, 0.0) + s
            by_stage.setdefault(stage, {})[kind] = by_stage.get(stage, {}).get(kind, 0.0) + s
        return {"total_s": self._mark - self._start, "by_kind": by_kind, "by_stage": by_stage}


CLOCK = Clock()


def breakdown_table(b: dict[str, Any]) -> str:
    """``Clock.breakdown()`` as a text table: a row per stage (inner stages indented by their
    path), a column per kind, seconds; the last row is the total."""
    kinds = [k for k in KINDS if k in b["by_kind"]] + sorted(set(b["by_kind"]) - set(KINDS))
    head = f"{'stage':<24}{'total':>8}" + "".join(f"{k:>16}" for k in kinds)
    lines = [head]
    for stage in sorted(b["by_stage"], key=_stage_order(b["by_stage"])):
        row = b["by_stage"][stage]
        lines.append(f"{stage or '(outside stages)':<24}{sum(row.values()):>8.1f}"
                     + "".join(f"{row.get(k, 0.0):>16.1f}" for k in kinds))
    lines.append(f"{'total':<24}{sum(b['by_kind'].values()):>8.1f}" + "".join(f"{b['by_kind'][k]:>16.1f}" for k in kinds))
    return "\n".join(lines)


def _stage_order(by_stage: dict) -> Any:
    """Stages in the order they first ran (dict order), inner stages right after their outer one."""
    first = {s: i for i, s in enumerate(by_stage)}
    return lambda s: tuple(first.get("/".join(s.split("/")[: i + 1]), 0) for i in range(s.count("/") + 1))


# ----- progress ----------------------------------------------------------------------------------
_QUIET = [False]


@contextlib.contextmanager
def quiet(on: bool = True) -> Iterator[None]:
    """No progress bars inside (any thread's), e.g. for ``turngym train --quiet``."""
    before = _QUIET[0]
    _QUIET[0] = on or before
    try:
        yield
    finally:
        _QUIET[0] = before


def bars_on() -> bool:
    """Whether progress shows at all (a bar or log lines): not under ``quiet()`` nor
    ``$TURNGYM_PROGRESS=never``."""
    return progress_mode() != "off"


def note(message: str) -> None:
    """A one-line notice on stderr (a slow first-time step), unless ``quiet()``."""
    if not _QUIET[0]:
        print(f"turngym: {message}", file=sys.stderr, flush=True)


def bar(total: int | None, desc: str, unit: str = "it", *, disable: bool = False, initial: int = 0,
        cap: int | None = None) -> Progress:
    """A ``Progress`` for a stage: a bar in a terminal, a line every few seconds in a log; silent
    when ``disable`` or ``not bars_on()``. ``cap``: a rollout's turn limit per episode."""
    return Progress(total, desc, unit, disable=disable, initial=initial, cap=cap)


DEFAULT_EVERY_S = 10.0


def progress_mode() -> str:
    """How progress shows now: ``bar``, ``lines`` or ``off`` (see the module docstring)."""
    if _QUIET[0]:
        return "off"
    want = os.environ.get("TURNGYM_PROGRESS", "auto").strip().lower()
    if want in ("never", "off", "0"):
        return "off"
    if want in ("always", "bar"):
        return "bar"
    if want == "lines":
        return "lines"
    return "bar" if sys.stderr.isatty() else "lines"


def every_s() -> float:
    """Seconds between two log lines (``$TURNGYM_PROGRESS_EVERY``)."""
    try:
        return max(0.5, float(os.environ.get("TURNGYM_PROGRESS_EVERY", DEFAULT_EVERY_S)))
    except ValueError:
        return DEFAULT_EVERY_S


def clock_text(seconds: float) -> str:
    """``75`` -> ``1:15``, ``3725`` -> ``1:02:05``."""
    s = int(max(0.0, seconds) + 0.5)
    h, m, s = s // 3600, s // 60 % 60, s % 60
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """Units done out of ``total`` (episodes, steps, games), optionally turns inside them.

    The tqdm-like surface (``update``, ``set_postfix_str``, ``set_postfix``, ``close``, ``n``,
    ``total``, ``with``) lets it stand wherever a tqdm bar stood.

    Args:
        total: Units to do (None: unknown; no ETA).
        desc: What the stage is, e.g. ``eval sft``.
        unit: The unit's name, e.g. ``ep``.
        disable: Show nothing (the caller's own switch; ``progress_mode()`` is the user's).
        initial: Units done before this run (a resumed stage); not counted in the rate.
        cap: The most turns an episode can take (the env's turn limit), for the ETA.
        clock: Seconds since an epoch (tests pass their own).
        ticker: Redraw the bar or write the line from a thread while the caller is busy.
    """

    def __init__(self, total: int | None, desc: str, unit: str = "it", *, disable: bool = False, initial: int = 0,
                 cap: int | None = None, clock: Any = time.monotonic, ticker: bool = True) -> None:
        self.total, self.desc, self.unit, self.n = total, desc, unit, initial
        self.initial, self.clock = initial, clock
        self.turns = 0  # turns played so far (rollouts)
        self.ended: list[int] = []  # the lengths of the ended episodes, in turns
        self.live: list[int] = []  # the turns played by each episode in play
        self.steps = self.width = 0  # batch steps so far, and the most episodes one played
        self.cap = cap
        self.postfix = ""
        self.mode = "off" if disable else progress_mode()
        self.start = self.last_line = clock()
        self._bar: Any = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        if self.mode == "bar":
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, leave=False, dynamic_ncols=True,
                             bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} " + unit + " [{elapsed}{postfix}]")
        if self.mode != "off" and ticker:
            # the thread holds the Progress weakly: one dropped unclosed (an exception unwound its
            # stage) is collected, and the thread ends instead of writing lines for ever
            period = 1.0 if self.mode == "bar" else min(1.0, every_s())
            threading.Thread(target=_tick, args=(weakref.ref(self), self._closed, period), name="turngym-progress",
                             daemon=True).start()

    # ----- the caller's side -------------------------------------------------------------------
    def update(self, n: int = 1, turns: int | None = None) -> None:
        """``n`` units done; ``turns``: how many turns the ended episode took (rollouts)."""
        with self._lock:
            self.n += n
            if turns is not None:
                self.ended.append(turns)
        self._show()

    def add_turns(self, n: int, lengths: list[int] | None = None) -> None:
        """``n`` turns played at once; ``lengths``: the turns each episode still in play has played."""
        with self._lock:
            self.turns += n
            self.steps += 1
            self.width = max(self.width, n)
            self.live = list(lengths) if lengths is not None else [1] * n

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = s
        self._show()

    def set_postfix(self, **kw: Any) -> None:
        self.set_postfix_str(", ".join(f"{k}={v}" for k, v in kw.items()))

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        if self._bar is not None:
            self._bar.close()
        elif self.mode == "lines":
            print(f"turngym: {self.desc}: {self.summary(final=True)}", file=sys.stderr, flush=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ----- what it says --------------------------------------------------------------------------
    def eta_s(self) -> float | None:
        """Seconds still to go, or None when there is nothing to go by yet."""
        if self.total is None:
            return None
        elapsed = self.clock() - self.start
        left = self.total - self.n
        if left <= 0:
            return 0.0
        if self.turns:  # a rollout: the turns still to play
            if not self.ended or elapsed <= 0:
                return None
            return self._rollout_eta(left, elapsed)
        done = self.n - self.initial
        return left * elapsed / done if done > 0 and elapsed > 0 else None

    def _rollout_eta(self, left: int, elapsed: float) -> float:
        """Two views of the time the turns still to play take, averaged: at the turn rate so far
        (right where generation costs per turn, a CPU's batch), and as the steps of the batch still
        to come, at the seconds per step so far (right where a step costs the same whatever its
        batch, and at the end, when a few long episodes play alone)."""
        expect = [self._length(c) for c in self.live]
        mean = (sum(self.ended) + sum(expect)) / (len(self.ended) + len(expect))
        queued = max(0, left - len(self.live))
        by_turns = (sum(e - c for e, c in zip(expect, self.live)) + queued * mean) / (self.turns / elapsed)
        slots = [e - c for e, c in zip(expect, self.live)]
        slots += [0.0] * max(0, self.width - len(slots))
        heapq.heapify(slots)
        for _ in range(queued):  # each queued episode takes the slot that frees first
            heapq.heappush(slots, heapq.heappop(slots) + mean)
        by_steps = max(slots, default=0.0) * elapsed / max(self.steps, 1)
        return (by_turns + by_steps) / 2

    def _length(self, played: int) -> float:
        """The expected length of an episode in play that has played ``played`` turns: the mean of
        the ended episodes that ran longer; with none (the first to end are the short ones: a win
        in 3 turns beside failures that run to a limit of 12), three times what it has played, up
        to the turn limit."""
        longer = [n for n in self.ended if n > played]
        guess = sum(longer) / len(longer) if longer else 3.0 * played
        if self.cap:
            guess = min(guess, float(self.cap))
        return max(guess, played + 1.0)

    def summary(self, final: bool = False) -> str:
        """``40/128 ep, 3.1 turns/s, 1:40, ETA 3:20`` (the line a log gets)."""
        elapsed = self.clock() - self.start
        total = "?" if self.total is None else str(self.total)
        parts = [f"{self.n}/{total} {self.unit}"]
        if self.turns:
            parts.append(f"{self.turns} turns, {self.turns / max(elapsed, 1e-9):.1f} turns/s")
        elif self.n > self.initial and self.unit != "s":
            rate = (self.n - self.initial) / max(elapsed, 1e-9)
            parts.append(f"{rate:.1f} {self.unit}/s" if rate >= 1 else f"{1 / rate:.1f} s/{self.unit}")
        parts.append(f"{'done in ' if final else ''}{clock_text(elapsed)}")
        if not final:
            eta = self.eta_s()
            parts.append(f"ETA {'?' if eta is None else clock_text(eta)}")
        if self.postfix:
            parts.append(self.postfix)
        return ", ".join(parts)

    def _show(self, tick: bool = False) -> None:
        if self.mode == "off" or self._closed.is_set():
            return
        if self._bar is not None:
            extra = ([f"{self.turns / max(self.clock() - self.start, 1e-9):.1f} turns/s"] if self.turns else [])
            eta = self.eta_s()
            extra.append(f"ETA {'?' if eta is None else clock_text(eta)}")
            with self._lock:
                self._bar.n = self.n
                self._bar.set_postfix_str(", ".join(extra + ([self.postfix] if self.postfix else [])), refresh=True)
            return
        now = self.clock()
        if tick and now - self.last_line >= every_s():
            self.last_line = now
            print(f"turngym: {self.desc}: {self.summary()}", file=sys.stderr, flush=True)


def _tick(ref: Callable[[], Progress | None], closed: threading.Event, period: float) -> None:
    while not closed.wait(period):
        shown = ref()
        if shown is None:
            return
        shown._show(tick=True)
        del shown
