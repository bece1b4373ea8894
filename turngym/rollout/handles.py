"""Env handles: one env, in this process, on a thread, in a subprocess worker, or in a Ray actor.

Every handle follows the same protocol, so rollout code never asks where an env lives:

- blocking ``reset(**kw)``, ``step(action)``, ``describe()``, ``restart()``, ``close()``;
- non-blocking ``send(cmd, payload)`` (``cmd`` is ``"reset"`` with a kwargs dict, or ``"step"``
  with the action) and ``recv()``, which waits for the last send's result, at most the handle's
  ``timeout_s``; ``poll()`` says, without waiting, whether that result is ready.
  ``reset``/``step`` are ``send`` followed by ``recv``.

A call that raises, crashes the worker or runs past the timeout restarts the handle, and ``recv``
raises ``EnvCrashed`` so the rollout can mark that episode truncated instead of losing it.
One call may be in flight per handle; ``send`` twice without ``recv`` is an error.

``make_handle(kind, make_env, timeout_s)`` builds one: ``"local"`` (``LocalEnv``, the call runs
inside ``send``), ``"thread"`` (``LocalEnv`` running each call on a thread, so envs whose steps wait
on I/O step at once), ``"subprocess"`` (``SubprocessEnv``) or ``"ray"``
(``turngym.rollout.ray_env.RayEnv``, the ``[ray]`` extra).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
import traceback
from typing import Any, Callable, Protocol

import gymnasium as gym

EnvFactory = Callable[[], gym.Env]


class EnvCrashed(RuntimeError):
    """The env raised, crashed or timed out; the handle has been restarted."""


class EnvHandle(Protocol):
    """What rollout code needs from an env wherever it runs (see the module docstring)."""

    timeout_s: float | None

    def send(self, cmd: str, payload: Any = None) -> None: ...
    def recv(self) -> Any: ...
    def poll(self) -> bool: ...
    def reset(self, **kw: Any) -> tuple: ...
    def step(self, action: Any) -> tuple: ...
    def describe(self) -> dict[str, Any]: ...
    def restart(self) -> None: ...
    def close(self) -> None: ...


def describe_env(env: gym.Env) -> dict[str, Any]:
    """What a policy needs to know about an env once: its tool specs and tool format (and its
    turn limit, for a progress bar's ETA)."""
    base = env.unwrapped
    tools = getattr(base, "tools", None)
    fmt = getattr(base, "format", None)
    spec = getattr(env, "spec", None)
    return {
        "tools": list(tools.specs) if tools is not None else [],
        "tool_format": fmt.name if fmt is not None else "text",
        "max_turns": getattr(spec, "max_episode_steps", None),
    }


_KINDS: dict[str, Callable[[EnvFactory, float | None], "EnvHandle"]] = {}


def register_handle_kind(kind: str, factory: Callable[[EnvFactory, float | None], "EnvHandle"]) -> None:
    """Make ``make_handle(kind, ...)`` call ``factory(make_env, timeout_s)`` (``turngym.rollout.ray_env``
    registers ``"ray"`` this way, so this module never imports Ray code)."""
    _KINDS[kind] = factory


def make_handle(kind: str, make_env: EnvFactory, timeout_s: float | None = 60.0) -> EnvHandle:
    """Build an env handle.

    Args:
        kind: ``"local"`` | ``"thread"`` | ``"subprocess"`` | ``"ray"`` | a registered kind.
        make_env: Zero-argument env factory (picklable for ``"subprocess"`` with spawn and ``"ray"``).
        timeout_s: Per-call limit. ``"local"`` cannot enforce it (the call runs inline).

    Returns:
        A handle following the protocol in the module docstring.

    Raises:
        ValueError: unknown ``kind``.
        ImportError: ``"ray"`` without Ray.
    """
    if kind not in _KINDS:
        raise ValueError(f"unknown env handle kind {kind!r}; expected one of {sorted(_KINDS)}")
    return _KINDS[kind](make_env, timeout_s)


def handle_kind(workers: bool | str) -> str:
    """Map rollout's ``workers`` argument (bool, kept for old callers, or a kind) to a handle kind."""
    if workers is True:
        return "subprocess"
    if workers is False or workers is None:
        return "local"
    if workers not in _KINDS:
        raise ValueError(f"workers must be a bool or one of {sorted(_KINDS)}, got {workers!r}")
    return workers


def timed(call: Callable[..., tuple], *args: Any, **kw: Any) -> tuple:
    """``env.reset`` or ``env.step`` with the call's wall time added to its info as ``elapsed_s``,
    measured where the env runs. The env's own info holds no clock (equal seeds and actions must
    give equal infos: Gymnasium's ``check_env`` compares them), so the rollout times it here."""
    t0 = time.perf_counter()
    *head, info = call(*args, **kw)
    return (*head, {**info, "elapsed_s": time.perf_counter() - t0})


def _bind(env: gym.Env, cmd: str, payload: Any) -> Callable[[], Any]:
    if cmd == "reset":
        return lambda: timed(env.reset, **(payload or {}))
    if cmd == "step":
        return lambda: timed(env.step, payload)
    if cmd == "describe":
        return lambda: describe_env(env)
    raise ValueError(f"unknown env command {cmd!r}")


class _Call:
    """One call's result slot; ``done`` is set once ``value`` or ``error`` is filled."""

    def __init__(self, cmd: str) -> None:
        self.cmd, self.value, self.error = cmd, None, None
        self.done = threading.Event()

    def run(self, fn: Callable[[], Any], catch: type[BaseException]) -> None:
        try:
            self.value = fn()
        except catch as e:
            self.error = e
        finally:
            self.done.set()


class BlockingCalls:
    """``reset``/``step``/``describe`` as ``send`` + ``recv`` (every handle kind shares these)."""

    def reset(self, **kw: Any) -> tuple:
        self.send("reset", kw)
        return self.recv()

    def step(self, action: Any) -> tuple:
        self.send("step", action)
        return self.recv()

    def describe(self) -> dict[str, Any]:
        self.send("describe")
        return self.recv()


class LocalEnv(BlockingCalls):
    """The env in this process. Exceptions from it become ``EnvCrashed`` and the env is rebuilt.

    Args:
        make_env: Zero-argument env factory.
        timeout_s: Per-call limit, enforced only when ``threaded`` (an inline call cannot be stopped).
        threaded: Run each call on a daemon thread, so ``send`` returns at once and several envs can
            step together; worth it when steps wait on I/O (sleep, subprocesses, docker, HTTP),
            which releases the GIL. A thread past ``timeout_s`` cannot be killed: it is abandoned
            with its env, and a fresh env takes its place. Otherwise ``send`` runs the call inline
            and ``recv`` returns (or raises) its stored result.
    """

    def __init__(self, make_env: EnvFactory, timeout_s: float | None = None, threaded: bool = False) -> None:
        self._make = make_env
        self.timeout_s = timeout_s
        self.threaded = threaded
        self.restarts = 0
        self._pending: _Call | None = None
        self.env = make_env()

    def send(self, cmd: str, payload: Any = None) -> None:
        if self._pending is not None:
            raise RuntimeError(f"send({cmd!r}) while a {self._pending.cmd!r} call is still pending")
        call = self._pending = _Call(cmd)
        fn = _bind(self.env, cmd, payload)
        if self.threaded:  # a thread has no caller to pass exceptions to: keep every one as the result
            threading.Thread(target=call.run, args=(fn, BaseException), daemon=True, name="turngym-env").start()
        else:
            call.run(fn, Exception)

    def recv(self) -> Any:
        call, self._pending = self._pending, None
        if call is None:
            raise RuntimeError("recv() without a pending send()")
        if not call.done.wait(self.timeout_s if self.threaded else None):
            self._rebuild(close_old=False)  # the stuck thread still holds the old env
            raise EnvCrashed(f"env did not answer {call.cmd!r} within {self.timeout_s:g}s; rebuilt it")
        if call.error is not None:
            self.restart()
            raise EnvCrashed(f"{type(call.error).__name__}: {call.error}") from call.error
        return call.value

    def poll(self) -> bool:
        return self._pending is not None and self._pending.done.is_set()

    def restart(self) -> None:
        self._rebuild(close_old=True)

    def _rebuild(self, close_old: bool) -> None:
        if close_old:
            try:
                self.env.close()
            except Exception:
                pass  # the env is being replaced because it is broken; its close may be broken too
        self._pending = None
        self.restarts += 1
        self.env = self._make()

    def close(self) -> None:
        self.env.close()


def exit_with_parent(parent_pid: int, interval_s: float = 0.5) -> None:
    """End this process (and its process group, if it leads one) soon after ``parent_pid`` is gone.

    A parent killed by SIGKILL runs no cleanup, so its workers must notice by themselves: a daemon
    thread checks ``os.getppid()`` (the parent's death re-parents us). Polling, unlike Linux's
    parent-death signal, does not fire when merely the parent's *thread* that started us exits.
    """
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval_s)
        if os.getpgid(0) == os.getpid():  # a group leader: the env's own children go with it
            os.killpg(0, signal.SIGKILL)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _worker_main(conn, make_env: EnvFactory, parent_pid: int) -> None:
    os.setpgid(0, 0)  # own process group: killing it also ends what the env started (interpreters, shells)
    exit_with_parent(parent_pid)
    env = make_env()
    while True:
        try:
            cmd, payload = conn.recv()
        except EOFError:
            break
        try:
            if cmd == "close":
                env.close()
                conn.send(("ok", None))
                break
            conn.send(("ok", _bind(env, cmd, payload)()))
        except Exception as e:
            conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=5)}"))
    conn.close()


class SubprocessEnv(BlockingCalls):
    """The env in a child process; every call waits at most ``timeout_s``.

    Args:
        make_env: A picklable zero-argument factory (e.g. ``functools.partial(turngym.make, id)``).
        timeout_s: Per-call limit; a worker past it is killed and restarted.
        start_method: ``fork`` is fast on Linux; ``spawn`` is safer with threads in the parent.
    """

    _LINK_ERRORS = (EOFError, BrokenPipeError, ConnectionResetError, OSError)

    def __init__(self, make_env: EnvFactory, timeout_s: float = 60.0, start_method: str = "fork") -> None:
        self._make = make_env
        self.timeout_s = timeout_s
        self._ctx = mp.get_context(start_method)
        self.restarts = 0
        self._pending: str | None = None
        self._send_error: BaseException | None = None
        self._closed = False
        self._start()

    def _start(self) -> None:
        self._conn, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_worker_main, args=(child, self._make, os.getpid()), daemon=True)
        self._proc.start()
        child.close()

    def send(self, cmd: str, payload: Any = None) -> None:
        if self._pending is not None:
            raise RuntimeError(f"send({cmd!r}) while a {self._pending!r} call is still pending")
        self._pending, self._send_error = cmd, None
        try:
            self._conn.send((cmd, payload))
        except self._LINK_ERRORS as e:  # the worker is gone; recv reports it with the exit code
            self._send_error = e

    def recv(self, timeout_s: float | None = None) -> Any:
        cmd = self._pending
        if cmd is None:
            raise RuntimeError("recv() without a pending send()")
        try:  # the call counts as pending until it is answered, so close() knows not to talk over it
            return self._answer(cmd, self.timeout_s if timeout_s is None else timeout_s)
        finally:
            self._pending = None

    def _answer(self, cmd: str, timeout_s: float) -> Any:
        try:
            if self._send_error is not None:
                raise self._send_error
            if not self._conn.poll(timeout_s):
                self.restart()
                raise EnvCrashed(f"env worker did not answer {cmd!r} within {timeout_s:g}s; restarted it")
            status, result = self._conn.recv()
        except self._LINK_ERRORS as e:
            self._proc.join(timeout=1)  # reap it, so the exit code (e.g. -9 for SIGKILL) is known
            code = self._proc.exitcode
            self.restart()
            raise EnvCrashed(f"env worker died during {cmd!r} (exit code {code}): {type(e).__name__}") from e
        if status == "error":
            self.restart()
            raise EnvCrashed(f"env raised during {cmd!r}: {result}")
        return result

    def poll(self) -> bool:
        if self._pending is None:
            return False
        try:  # a dead worker closes its end of the pipe, which also reads as ready (recv raises)
            return self._send_error is not None or self._conn.poll(0)
        except self._LINK_ERRORS:
            return True

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def restart(self) -> None:
        self._kill()
        self._pending = None
        if self._closed:  # a call that was in flight when the handle closed: do not respawn
            return
        self.restarts += 1
        self._start()

    def _kill(self) -> None:
        if self._proc.is_alive():
            try:  # the worker's whole group: a hung env's own children must not outlive it
                os.killpg(self._proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self._proc.kill()
        self._proc.join(timeout=5)
        self._conn.close()

    def close(self) -> None:
        """Stop the worker (politely when idle; a worker with a call in flight is killed)."""
        busy, self._closed = self._pending is not None, True
        if self._proc.is_alive() and not busy:
            try:
                self.send("close")
                self.recv(timeout_s=5)
            except EnvCrashed:
                pass  # it was closing anyway; _kill below makes sure
        self._kill()


register_handle_kind("local", LocalEnv)
register_handle_kind("thread", lambda make_env, timeout_s: LocalEnv(make_env, timeout_s, threaded=True))
register_handle_kind("subprocess", lambda make_env, timeout_s: SubprocessEnv(make_env, 60.0 if timeout_s is None else timeout_s))
