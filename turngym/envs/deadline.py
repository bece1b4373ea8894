"""``StepDeadline``: a deadline on every step of every env.

An env step can hang where no Python alarm reaches: a SQLite opcode, a socket read, a native
engine, a sandbox that stopped answering. The wrapper runs each step on a thread of its own and
waits at most the step's deadline; a late step is truncated with the reason and the env is
rebuilt, so the caller always gets an answer in time. The registry puts it around every env it
makes (``turngym.envs.registry.DeadlineEntry``), so a new env is covered without a watchdog of
its own. An env whose legitimate steps are long says so with a ``step_deadline_s`` attribute.
"""

from __future__ import annotations

import queue
import threading
import weakref
from typing import Any, Callable

import gymnasium as gym

from turngym.tools.formats import MAX_CALLS_PER_ACTION
from turngym.types import Message

DEFAULT_STEP_DEADLINE_S = 60.0  # an env whose legitimate steps take longer sets ``step_deadline_s``
_CLOSE_WAIT_S = 30.0


class _Call:
    """One call handed to the worker thread; ``done`` is set once it returned or raised."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn, self.value, self.error = fn, None, None
        self.done = threading.Event()

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


def _serve(inbox: queue.SimpleQueue) -> None:
    while (call := inbox.get()) is not None:
        try:
            call.value = call.fn()
        except BaseException as e:  # handed to the caller, who raises it
            call.error = e
        finally:
            call.fn = None
            call.done.set()


class _Worker:
    """A thread that runs an env's calls in order: an env and what it starts (sandboxes, engine
    processes, sockets) always live on the same thread."""

    def __init__(self) -> None:
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=_serve, args=(self.inbox,), name="turngym-env-step", daemon=True).start()

    def submit(self, fn: Callable[[], Any]) -> _Call:
        call = _Call(fn)
        self.inbox.put(call)
        return call

    def stop(self) -> None:
        self.inbox.put(None)


def _close_when_done(call: _Call, env: gym.Env, worker: _Worker) -> None:
    """Close an env abandoned in a late step once that step returns (then its thread ends)."""
    call.done.wait()
    try:
        worker.submit(env.close).done.wait(_CLOSE_WAIT_S)
    finally:
        worker.stop()


class StepDeadline(gym.Wrapper):
    """A deadline on every step: a late step is truncated with the reason, and the env restarted.

    Each ``reset``, ``step`` and ``close`` runs on one worker thread per env. The caller waits at
    most ``step_deadline_s`` for a step (``deadline_s``, or the env's ``step_deadline_s``
    attribute, or a default from its tools' timeouts). A step that misses it is left running
    on its thread; the caller gets ``truncated=True`` with ``info["truncated_reason"]`` at once,
    the wrapper builds a fresh env with ``factory``, and the old one is closed when its step ends
    (its thread with it). The episode is over: the next call is ``reset``. ``restarts`` counts them.

    Args:
        env: The env (the registry passes the one its entry point built).
        deadline_s: Seconds a step may take (see above).
        factory: Builds a fresh env like ``env`` (the registry passes the entry point with the
            same kwargs). Without one a late step still returns on time, and the env is unusable.
    """

    def __init__(self, env: gym.Env, deadline_s: float | None = None, factory: Callable[[], gym.Env] | None = None) -> None:
        super().__init__(env)
        self.deadline_s, self.factory = deadline_s, factory
        self.restarts = 0
        self._closed = False
        self._worker = _Worker()
        weakref.finalize(self, self._worker.stop)

    @property
    def step_deadline_s(self) -> float | None:
        """This step's deadline: ``deadline_s``, else the env's ``step_deadline_s``, else
        ``DEFAULT_STEP_DEADLINE_S`` plus room for the most calls a step can make to its slowest tool."""
        if self.deadline_s is not None:
            return self.deadline_s
        base = self.env.unwrapped
        if getattr(base, "step_deadline_s", None) is not None:
            return base.step_deadline_s
        tools = getattr(base, "tools", None) or []
        longest = max((t.timeout_s for t in tools if getattr(t, "timeout_s", None)), default=0.0)
        return DEFAULT_STEP_DEADLINE_S + MAX_CALLS_PER_ACTION * longest

    def reset(self, **kwargs: Any):
        return self._call(lambda: self.env.reset(**kwargs))

    def step(self, action: Any):
        deadline = self.step_deadline_s
        env = self.env
        call = self._worker.submit(lambda: env.step(action))
        if call.done.wait(deadline):
            return call.result()
        self._restart(call, env)
        reason = f"the step ran past its {deadline:g}s deadline; the env was restarted"
        obs = [Message("user", f"Error: {reason}. The episode ends here.")]
        info = {"action_valid": False, "state_key": "step-deadline", "tool_calls": [], "truncated_reason": reason}
        return obs, 0.0, False, True, info

    def close(self) -> None:
        # Gymnasium calls close more than once (its env checker does): after the first, the
        # worker thread is gone, and a second call would wait out _CLOSE_WAIT_S for no one
        if self._closed:
            return
        self._closed = True
        call = self._worker.submit(self.env.close)
        call.done.wait(_CLOSE_WAIT_S)
        self._worker.stop()
        if call.done.is_set():
            call.result()

    def _call(self, fn: Callable[[], Any]) -> Any:
        call = self._worker.submit(fn)
        call.done.wait()
        return call.result()

    def _restart(self, late: _Call, old: gym.Env) -> None:
        worker = self._worker
        threading.Thread(target=_close_when_done, args=(late, old, worker), daemon=True).start()
        self._worker = _Worker()
        weakref.finalize(self, self._worker.stop)
        self.restarts += 1
        if self.factory is not None:
            spec = getattr(old.unwrapped, "spec", None)
            new = self._call(self.factory)
            if spec is not None:
                new.unwrapped.spec = spec
            self.env = new
