"""Game engines behind a deadline: no engine call can hang an env step.

Some engines run native code that no Python alarm can interrupt: Jericho (TextWorld's Z-machine
interpreter) is a C library called in-process, and some inputs send it into an endless loop that
writes hundreds of MB/s to stdout. ``EngineProcess`` runs such an engine in a child process and
waits for every call at most its deadline. A child that misses it is killed (SIGKILL) and a fresh
one starts on the next call, so the engine's state is lost: the env ends the episode as truncated.

The child is a fresh interpreter (``python -m turngym.envs.engine``), not a fork: forking a parent
that has threads (tool pools, torch, Ray) can deadlock the child, and ``multiprocessing`` refuses
to start children from daemonic workers (the rollout's subprocess env workers are daemonic). Its
stdout and stderr go to ``/dev/null``, so a flooding engine cannot flood the parent's terminal; its
errors come back as data. It stays in the parent's process group (a group kill reaches it) and it
exits by itself when the parent dies, even in the middle of a hung call. Calls and results cross
as JSON, not pickles: the engine parses the agent's text in C, and an engine the agent managed to
subvert must not be able to run code in the parent by what it sends back.

``EngineBacked`` is the ``TextEnv`` side: one budget per step for all of a step's engine calls,
and the bookkeeping that turns a missed deadline into a truncated episode.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import weakref
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from turngym.envs.forkserver import spawn_engine_child

# Setup calls (start the child, import the engine, load and reset a game) take no agent input.
# Their deadline only guards against a wedged engine, and must allow a slow, shared machine.
SETUP_DEADLINE_S = 120.0
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the folder that holds turngym/
_MAX_MESSAGE_BYTES = 64 << 20  # a reply past this is treated as a broken engine


class EngineFault(RuntimeError):
    """The engine process is gone (killed after a missed deadline, or died); its state is lost."""


class EngineTimeout(EngineFault):
    """An engine call missed its deadline; the engine was killed and restarts on the next call."""


class EngineCrashed(EngineFault):
    """The engine process died during a call."""


class EngineError(RuntimeError):
    """The engine raised; the engine process is alive and its state is as the engine left it."""


class EngineProcess:
    """An engine object living in a child process; every call has a deadline.

    Args:
        target: ``"module:Class"`` of the engine; importable in a fresh interpreter.
        kwargs: Its constructor arguments (picklable).
        setup_deadline_s: Deadline for starting the child and building the engine.
        preload: Modules the engine imports (e.g. ``("textworld",)``): the child is then forked from
            a server that imported them once (``forkserver.py``), where the platform allows, instead
            of being a fresh interpreter that imports them itself.

    Calls go through ``call(method, *args, deadline_s=...)``; arguments and results must be JSON
    values (tuples come back as lists).
    """

    def __init__(self, target: str, kwargs: dict[str, Any] | None = None, *,
                 setup_deadline_s: float = SETUP_DEADLINE_S, preload: tuple[str, ...] = ()) -> None:
        self.target, self.kwargs = target, dict(kwargs or {})
        self.setup_deadline_s, self.preload = setup_deadline_s, tuple(preload)
        self.restarts = 0  # children killed or lost by faults so far (the next call starts a new one)
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._finalizer: weakref.finalize | None = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def call(self, method: str, *args: Any, deadline_s: float) -> Any:
        """Run ``engine.method(*args)`` in the child and return its result.

        Raises:
            EngineTimeout: no answer within ``deadline_s``; the child was killed.
            EngineCrashed: the child died; it was reaped.
            EngineError: the engine raised (the child lives on).
        """
        if method.startswith("_"):
            raise ValueError(f"engine method {method!r} is private")
        if self._proc is None or self._proc.poll() is not None:
            self._start()
        return self._request(("call", method, args), deadline_s, method)

    def close(self) -> None:
        """Stop the child (it gets no chance to clean up; engines hold no state worth saving)."""
        if self._finalizer is not None:
            self._finalizer()
        self._proc = self._conn = self._finalizer = None

    def _start(self) -> None:
        if self._proc is not None:  # it exited between calls
            self._discard()
        forked = spawn_engine_child(f"{__name__}:_serve", self.preload, self.setup_deadline_s) if self.preload else None
        if forked is not None:
            proc, conn = forked
        else:
            ours, theirs = socket.socketpair()
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_PACKAGE_ROOT, os.environ.get("PYTHONPATH")]))}
            with theirs:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "turngym.envs.engine", str(theirs.fileno())], pass_fds=[theirs.fileno()],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                )
            conn = Connection(ours.detach())
        self._proc, self._conn = proc, conn
        self._finalizer = weakref.finalize(self, _stop, proc, self._conn)
        try:
            self._request(("init", self.target, self.kwargs), self.setup_deadline_s, "start")
        except EngineError:  # the engine could not be built: a child without one is of no use
            self.close()
            raise

    def _discard(self) -> None:
        self.close()
        self.restarts += 1

    def _request(self, message: tuple, deadline_s: float, what: str) -> Any:
        try:
            self._conn.send_bytes(json.dumps(message).encode())
            answered = self._conn.poll(max(0.0, deadline_s))
            reply = json.loads(self._conn.recv_bytes(_MAX_MESSAGE_BYTES)) if answered else None
        except (EOFError, OSError, ValueError) as e:  # ValueError: the reply is not JSON
            try:
                code = self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None  # alive but unreachable: _discard kills it
            self._discard()
            raise EngineCrashed(f"the engine process died during {what!r} (exit code {code})") from e
        if reply is None:
            self._discard()
            raise EngineTimeout(f"the engine did not answer {what!r} within its {deadline_s:g}s deadline and was killed")
        status, payload = reply
        if status == "error":
            raise EngineError(payload)
        return payload


def _stop(proc: subprocess.Popen, conn: Connection) -> None:
    if proc.poll() is None:
        proc.kill()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass  # an unkillable (D-state) child: the kernel reaps it when it can
    conn.close()


class InlineEngine:
    """The same interface, in-process and without deadlines (``engine_deadline_s=None``)."""

    def __init__(self, target: str, kwargs: dict[str, Any] | None = None) -> None:
        self.target, self.kwargs, self.restarts = target, dict(kwargs or {}), 0
        self._engine: Any = None

    def call(self, method: str, *args: Any, deadline_s: float | None = None) -> Any:
        if self._engine is None:
            self._engine = _build(self.target, self.kwargs)
        return getattr(self._engine, method)(*args)

    def close(self) -> None:
        if self._engine is not None and hasattr(self._engine, "close"):
            self._engine.close()
        self._engine = None


def _build(target: str, kwargs: dict[str, Any]) -> Any:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)(**kwargs)


class EngineBacked:
    """Mixin for a ``TextEnv`` whose engine runs behind ``EngineProcess``.

    The subclass sets ``engine_target`` (an engine class with ``load(path)``, ``reset()`` and its
    own step methods) and calls ``_setup_engine`` in its constructor, then talks to the engine
    through ``_engine_reset`` (at reset) and ``_engine_step`` (while the agent acts). All of one
    step's calls share one budget of ``engine_deadline_s``. A missed deadline ends the episode: ``_engine_step`` raises (the tool
    result tells the agent), later calls in the episode are refused, and ``_cut_reason`` is what
    the subclass passes as ``StepOutcome.truncated_reason``.
    """

    engine_target: str
    engine_setup_deadline_s: float = SETUP_DEADLINE_S
    engine_preload: tuple[str, ...] = ()  # modules the engine imports: its children fork from a warm server

    def _setup_engine(self, kwargs: dict[str, Any], deadline_s: float | None) -> None:
        if deadline_s is not None and not deadline_s > 0:
            raise ValueError(f"engine_deadline_s must be positive or None, got {deadline_s!r}")
        self.engine_deadline_s = deadline_s
        self._engine = (InlineEngine(self.engine_target, kwargs) if deadline_s is None
                        else EngineProcess(self.engine_target, kwargs, preload=self.engine_preload))
        self._engine_loaded: str | None = None
        self._cut_reason: str | None = None
        self._budget_turn, self._budget_end = -1, 0.0

    def _engine_reset(self, path: str) -> Any:
        """Load ``path`` (unless it is loaded) and reset it; returns the engine's ``reset()``.
        A fault is retried once on a fresh engine (which loads the game again), then raised."""
        self._cut_reason, self._budget_turn = None, -1
        for attempt in (0, 1):
            try:
                if self._engine_loaded != path:
                    self._engine.call("load", path, deadline_s=self.engine_setup_deadline_s)
                    self._engine_loaded = path
                return self._engine.call("reset", deadline_s=self.engine_setup_deadline_s)
            except EngineFault:
                self._engine_loaded = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _engine_step(self, method: str, *args: Any) -> Any:
        """A call made while the agent acts, within what is left of this step's budget.

        Raises:
            EngineFault: the engine missed the deadline (or died), now or earlier in the episode.
            EngineError: the engine raised.
        """
        if self._cut_reason is not None:
            raise EngineFault(f"{self._cut_reason}; this episode is over, call reset()")
        if self.engine_deadline_s is None:
            return self._engine.call(method, *args)
        now = time.monotonic()
        if self._budget_turn != self._turn:  # the first engine call of this step starts its budget
            self._budget_turn, self._budget_end = self._turn, now + self.engine_deadline_s
        if now >= self._budget_end:  # many quick calls spent it: refuse the rest, the engine is fine
            raise EngineError(f"this step used up its {self.engine_deadline_s:g}s engine budget; "
                              "its remaining commands were not run")
        try:
            return self._engine.call(method, *args, deadline_s=self._budget_end - now)
        except EngineFault as e:
            self._engine_loaded = None
            self._cut_reason = f"engine fault: {e}"
            raise

    def _close_engine(self) -> None:
        self._engine.close()
        self._engine_loaded = None


# ----- the child side -------------------------------------------------------------------------
def _exit_when_orphaned(parent: int) -> None:
    # Runs beside a hung engine call: Jericho's C code releases the GIL, Python engines yield it.
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def _serve(conn: Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it closes us
    threading.Thread(target=_exit_when_orphaned, args=(os.getppid(),), daemon=True).start()
    engine = None
    while True:
        try:
            kind, *msg = json.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        try:
            if kind == "init":
                engine, result = _build(*msg), None
            else:
                method, args = msg
                result = getattr(engine, method)(*args)
            reply = json.dumps(["ok", result])
        except Exception as e:  # the engine's failure is the caller's data
            tb = "".join(traceback.format_exception(e, limit=-3))
            reply = json.dumps(["error", f"{type(e).__name__}: {e}\n{tb[-2000:]}"])
        conn.send_bytes(reply.encode())


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1])))
