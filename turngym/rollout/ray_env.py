"""Ray env handles (the ``[ray]`` extra): one env inside a Ray actor.

``RayEnv`` has the same handle protocol as ``turngym.rollout.handles.SubprocessEnv`` (blocking
``reset/step``, non-blocking ``send/recv/poll``). The policy stays in the driver; envs run wherever
Ray places them. An actor that dies, hangs past its timeout or whose env raises is killed and
recreated, and the call raises ``EnvCrashed``. Importing this module registers the ``"ray"`` handle
kind (``rollout(..., workers="ray")``).

Ray is imported lazily: importing this module never needs it; using it without Ray installed raises
an ImportError that says how to install it.
"""

from __future__ import annotations

import functools
from typing import Any

from turngym.rollout.handles import BlockingCalls, EnvCrashed, EnvFactory, describe_env, register_handle_kind, timed


def require_ray():
    """Import Ray, or fail with the install command.

    Raises:
        ImportError: Ray is not installed.
    """
    try:
        import ray
    except ImportError as e:
        raise ImportError('the Ray backend needs Ray: pip install "turngym[ray]"') from e
    return ray


def ensure_ray(**init_kwargs: Any):
    """``ray.init(**init_kwargs)`` unless Ray is already initialised (then the kwargs are ignored).

    Returns:
        The ``ray`` module.
    """
    ray = require_ray()
    if not ray.is_initialized():
        ray.init(**init_kwargs)
    return ray


# ----- env actors ---------------------------------------------------------------------------------
class _EnvActor:
    """The body of an env actor: the env and its four calls."""

    def __init__(self, make_env: EnvFactory) -> None:
        self.env = make_env()

    def ping(self) -> bool:
        return True

    def reset(self, kw: dict) -> tuple:
        return timed(self.env.reset, **kw)

    def step(self, action: Any) -> tuple:
        return timed(self.env.step, action)

    def describe(self) -> dict[str, Any]:
        return describe_env(self.env)

    def close(self) -> None:
        self.env.close()


@functools.lru_cache(maxsize=None)
def remote_class(cls: type):
    # ray.remote(...) is done once per class, on first use, so that importing this module needs no Ray
    return require_ray().remote(cls)


class RayEnv(BlockingCalls):
    """An env in a Ray actor, behind the env-handle protocol of ``turngym.rollout.handles``.

    Every answer is awaited at most ``timeout_s``; an actor past it, dead, or whose env raised is
    killed and recreated and the call raises ``EnvCrashed``. The time an actor takes to start (and
    to build its env) is bounded by ``startup_timeout_s`` instead, so a slow cluster start is not
    mistaken for a hung step.

    Args:
        make_env: A picklable zero-argument env factory (``rollout.make_env_factory``).
        timeout_s: Per-call limit once the actor is up.
        num_cpus: CPUs Ray reserves for the actor. Env actors mostly wait for the policy, so the
            default is a small fraction; raise it for envs that compute hard.
        startup_timeout_s: Limit for starting the actor and building its env.
        actor_options: Extra ``.options(...)`` for the actor (resources, scheduling strategy...).

    Raises:
        ImportError: Ray is not installed.
    """

    def __init__(self, make_env: EnvFactory, timeout_s: float = 60.0, *, num_cpus: float = 0.1,
                 startup_timeout_s: float = 120.0, actor_options: dict | None = None) -> None:
        self._ray = ensure_ray()
        self._make = make_env
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self._options = {"num_cpus": num_cpus, **(actor_options or {})}
        self.restarts = 0
        self._pending: tuple[str, Any] | None = None
        self._start()

    def _start(self) -> None:
        self._actor = remote_class(_EnvActor).options(**self._options).remote(self._make)
        self._ready_ref = self._actor.ping.remote()  # resolves once the constructor has run

    def send(self, cmd: str, payload: Any = None) -> None:
        """Start ``cmd`` ("reset" with a kwargs dict, "step" with the action, or "describe").

        Raises:
            ValueError: unknown command.
            RuntimeError: the previous call has not been received yet.
        """
        calls = {"reset": lambda: self._actor.reset.remote(dict(payload or {})),
                 "step": lambda: self._actor.step.remote(payload),
                 "describe": lambda: self._actor.describe.remote()}
        if cmd not in calls:
            raise ValueError(f"unknown env command {cmd!r}; use reset, step or describe")
        if self._pending is not None:
            raise RuntimeError(f"send({cmd!r}) while a {self._pending[0]!r} call is still pending")
        self._pending = (cmd, calls[cmd]())

    def poll(self) -> bool:
        """True when the last ``send``'s result (or failure) is ready to ``recv`` without waiting."""
        if self._pending is None:
            return False
        ready, _ = self._ray.wait([self._pending[1]], timeout=0)
        return bool(ready)

    def recv(self, timeout_s: float | None = None) -> Any:
        """The result of the last ``send``, awaited at most ``timeout_s`` (default: the handle's).

        Raises:
            EnvCrashed: the actor died, timed out or the env raised; the handle has been restarted.
            RuntimeError: nothing was sent.
        """
        if self._pending is None:
            raise RuntimeError("recv() without a pending send()")
        (cmd, ref), self._pending = self._pending, None
        exc = self._ray.exceptions
        what, limit = cmd, self.timeout_s if timeout_s is None else timeout_s
        try:
            if self._ready_ref is not None:  # the first call after a (re)start also waits for the actor to come up
                self._ray.get(self._ready_ref, timeout=self.startup_timeout_s)
                self._ready_ref = None
            return self._ray.get(ref, timeout=limit)
        except exc.GetTimeoutError as e:
            if self._ready_ref is not None:
                what, limit = "start", self.startup_timeout_s
            self.restart()
            raise EnvCrashed(f"env actor did not answer {what!r} within {limit:g}s; restarted it") from e
        except exc.RayTaskError as e:  # the env (or its constructor) raised; the actor may be fine, but its env is suspect
            self.restart()
            raise EnvCrashed(f"env raised during {cmd!r}: {e.cause!r}") from e
        except exc.RayError as e:  # actor died (RayActorError, ActorDiedError), object lost...
            self.restart()
            raise EnvCrashed(f"env actor died during {cmd!r}: {type(e).__name__}") from e

    @property
    def actor(self):
        """The current Ray actor handle (replaced on every restart)."""
        return self._actor

    def restart(self) -> None:
        """Kill the actor and start a fresh one (with a fresh env)."""
        self._kill()
        self.restarts += 1
        self._pending = None
        self._start()

    def _kill(self) -> None:
        try:
            self._ray.kill(self._actor, no_restart=True)
        except Exception:
            pass  # already dead: nothing to kill

    def close(self) -> None:
        """Close the env (best effort, 5 s) and end the actor."""
        try:
            self._ray.get(self._actor.close.remote(), timeout=5)
        except Exception:
            pass  # it is being torn down anyway; the kill below makes sure
        self._kill()


register_handle_kind("ray", RayEnv)
