"""Env handles: the env in this process, or in a subprocess worker with a per-step timeout.

Both expose ``reset``, ``step``, ``describe`` and ``close`` with the env's own signatures. A worker
that crashes or hangs past its timeout is killed and replaced by a fresh one, and the call raises
``EnvCrashed`` so the rollout can mark that episode truncated instead of losing it.
"""

from __future__ import annotations

import multiprocessing as mp
import traceback
from typing import Any, Callable

import gymnasium as gym

EnvFactory = Callable[[], gym.Env]


class EnvCrashed(RuntimeError):
    """The env raised, crashed or timed out; the handle has been restarted."""


def describe_env(env: gym.Env) -> dict[str, Any]:
    """What a policy needs to know about an env once: its tool specs and tool format."""
    base = env.unwrapped
    tools = getattr(base, "tools", None)
    fmt = getattr(base, "format", None)
    return {
        "tools": list(tools.specs) if tools is not None else [],
        "tool_format": fmt.name if fmt is not None else "text",
    }


class LocalEnv:
    """The env in this process. Exceptions from it become ``EnvCrashed`` and the env is rebuilt."""

    def __init__(self, make_env: EnvFactory) -> None:
        self._make = make_env
        self.env = make_env()

    def _guard(self, fn: Callable, *args: Any, **kw: Any) -> Any:
        try:
            return fn(*args, **kw)
        except Exception as e:
            self.restart()
            raise EnvCrashed(f"{type(e).__name__}: {e}") from e

    def reset(self, **kw: Any) -> tuple:
        return self._guard(self.env.reset, **kw)

    def step(self, action: Any) -> tuple:
        return self._guard(self.env.step, action)

    def describe(self) -> dict[str, Any]:
        return describe_env(self.env)

    def restart(self) -> None:
        try:
            self.env.close()
        except Exception:
            pass  # the env is being replaced because it is broken; its close may be broken too
        self.env = self._make()

    def close(self) -> None:
        self.env.close()


def _worker_main(conn, make_env: EnvFactory) -> None:
    env = make_env()
    while True:
        try:
            cmd, payload = conn.recv()
        except EOFError:
            break
        try:
            if cmd == "reset":
                conn.send(("ok", env.reset(**payload)))
            elif cmd == "step":
                conn.send(("ok", env.step(payload)))
            elif cmd == "describe":
                conn.send(("ok", describe_env(env)))
            elif cmd == "close":
                env.close()
                conn.send(("ok", None))
                break
        except Exception as e:
            conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=5)}"))
    conn.close()


class SubprocessEnv:
    """The env in a child process; every call waits at most ``timeout_s``.

    Args:
        make_env: A picklable zero-argument factory (e.g. ``functools.partial(turngym.make, id)``).
        timeout_s: Per-call limit; a worker past it is killed and restarted.
        start_method: ``fork`` is fast on Linux; ``spawn`` is safer with threads in the parent.
    """

    def __init__(self, make_env: EnvFactory, timeout_s: float = 60.0, start_method: str = "fork") -> None:
        self._make = make_env
        self.timeout_s = timeout_s
        self._ctx = mp.get_context(start_method)
        self.restarts = 0
        self._start()

    def _start(self) -> None:
        self._conn, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_worker_main, args=(child, self._make), daemon=True)
        self._proc.start()
        child.close()

    def _call(self, cmd: str, payload: Any = None, timeout_s: float | None = None) -> Any:
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        try:
            self._conn.send((cmd, payload))
            if not self._conn.poll(timeout_s):
                self.restart()
                raise EnvCrashed(f"env worker did not answer {cmd!r} within {timeout_s:g}s; restarted it")
            status, result = self._conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError) as e:
            code = self._proc.exitcode
            self.restart()
            raise EnvCrashed(f"env worker died during {cmd!r} (exit code {code}): {type(e).__name__}") from e
        if status == "error":
            self.restart()
            raise EnvCrashed(f"env raised during {cmd!r}: {result}")
        return result

    def reset(self, **kw: Any) -> tuple:
        return self._call("reset", kw)

    def step(self, action: Any) -> tuple:
        return self._call("step", action)

    def describe(self) -> dict[str, Any]:
        return self._call("describe")

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def restart(self) -> None:
        self._kill()
        self.restarts += 1
        self._start()

    def _kill(self) -> None:
        if self._proc.is_alive():
            self._proc.kill()
        self._proc.join(timeout=5)
        self._conn.close()

    def close(self) -> None:
        if self._proc.is_alive():
            try:
                self._call("close", timeout_s=5)
            except EnvCrashed:
                pass  # it was closing anyway; _kill below makes sure
        self._kill()
