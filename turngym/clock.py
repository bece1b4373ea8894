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

``bar(...)`` makes the progress bars of long stages: a tqdm bar with an ETA that is silent under
``quiet()`` (``turngym train --quiet``) and when stderr is not a terminal (CI logs).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
import time
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


# ----- progress bars ---------------------------------------------------------------------------
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
    """Whether progress bars show: never under ``quiet()``; else as ``$TURNGYM_PROGRESS`` says
    (``always`` | ``never``), by default only when stderr is a terminal (a CI log is not)."""
    if _QUIET[0]:
        return False
    mode = os.environ.get("TURNGYM_PROGRESS", "auto")
    return mode == "always" or (mode != "never" and sys.stderr.isatty())


def note(message: str) -> None:
    """A one-line notice on stderr (a slow first-time step), unless ``quiet()``."""
    if not _QUIET[0]:
        print(f"turngym: {message}", file=sys.stderr, flush=True)


def bar(total: int | None, desc: str, unit: str = "it", *, disable: bool = False, leave: bool = False) -> Any:
    """A tqdm progress bar with an ETA, silent when ``disable`` or ``not bars_on()``."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, leave=leave, disable=disable or not bars_on(), dynamic_ncols=True)
