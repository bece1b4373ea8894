"""Ray backend (the ``[ray]`` extra): env handles and rollout workers as Ray actors.

Two pieces, for the two ways to spread rollout over a cluster:

- ``RayEnv``: one env inside a Ray actor, with the same handle protocol as
  ``turngym.trainers.workers.SubprocessEnv`` (blocking ``reset/step``, non-blocking ``send/recv/poll``).
  The policy stays in the driver; envs run wherever Ray places them. An actor that dies, hangs past
  its timeout or whose env raises is killed and recreated, and the call raises ``EnvCrashed``.
- ``RayRolloutPool`` / ``ray_rollout``: whole rollout workers (a policy plus its envs) as actors.
  Episode specs are split into contiguous shards, one per worker, and the trajectories come back
  in spec order. ``set_weights`` pushes a trainer's new weights to every worker.

Ray is imported lazily: importing this module never needs it; using it without Ray installed raises
an ImportError that says how to install it.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

from turngym.agents.base import SamplingParams
from turngym.trainers.workers import BlockingCalls, EnvCrashed, EnvFactory, describe_env
from turngym.types import Trajectory

PolicyFactory = Callable[[], Any]


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
        return self.env.reset(**kw)

    def step(self, action: Any) -> tuple:
        return self.env.step(action)

    def describe(self) -> dict[str, Any]:
        return describe_env(self.env)

    def close(self) -> None:
        self.env.close()


@functools.lru_cache(maxsize=None)
def _remote(cls: type):
    # ray.remote(...) is done once per class, on first use, so that importing this module needs no Ray
    return require_ray().remote(cls)


class RayEnv(BlockingCalls):
    """An env in a Ray actor, behind the env-handle protocol of ``turngym.trainers.workers``.

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
        self._actor = _remote(_EnvActor).options(**self._options).remote(self._make)
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


# ----- rollout workers ----------------------------------------------------------------------------
class _RolloutWorker:
    """The body of a rollout-worker actor: one policy and its envs, playing shards of episodes."""

    def __init__(self, agent: str | PolicyFactory, make_env: EnvFactory, num_envs: int, rollout_kwargs: dict) -> None:
        from turngym.agents import make_agent

        self.policy = make_agent(agent) if isinstance(agent, str) else agent()
        self.make_env, self.num_envs, self.rollout_kwargs = make_env, num_envs, rollout_kwargs
        self.version = 0

    def run(self, specs: list, sampling: SamplingParams | None, metadata: dict | None) -> list[dict]:
        from turngym.trainers.rollout import rollout

        meta = {"policy_version": self.version, **(metadata or {})}
        trajs = rollout(self.policy, self.make_env, specs, sampling=sampling, num_envs=self.num_envs,
                        progress=False, metadata=meta, **self.rollout_kwargs)
        return [t.to_dict() for t in trajs]  # plain data: no class identity across Ray versions

    def set_weights(self, state_dict: dict, version: int) -> int:
        model = getattr(self.policy, "model", None)
        if model is None:
            raise TypeError(f"{type(self.policy).__name__} has no .model: its weights cannot be set")
        model.load_state_dict(state_dict)
        if hasattr(self.policy, "invalidate_caches"):
            self.policy.invalidate_caches()  # KV caches were computed with the old weights
        self.version = int(version)
        return self.version

    def get_version(self) -> int:
        return self.version


def _env_factory(env: str | EnvFactory, env_kwargs: dict | None) -> EnvFactory:
    if isinstance(env, str):
        from turngym.trainers.rollout import make_env_factory

        return make_env_factory(env, **(env_kwargs or {}))
    if env_kwargs:
        raise ValueError("env_kwargs only apply to an env id; bake them into your factory instead")
    return env


def shard_contiguous(items: Sequence, n: int) -> list[list]:
    """Split ``items`` into at most ``n`` contiguous, non-empty runs whose sizes differ by at most one.

    Concatenating the runs gives back ``items`` in order (so results can be reassembled by rank).
    """
    k, extra = divmod(len(items), n)
    out, i = [], 0
    for r in range(n):
        size = k + (r < extra)
        if size:
            out.append(list(items[i : i + size]))
        i += size
    return out


class RayRolloutPool:
    """Rollout workers as Ray actors: build once, ``run`` many shards of episodes, push new weights.

    Args:
        agent: An agent spec for ``turngym.agents.make_agent`` (``"oracle"``, ``"hf:PATH"``...), or a
            picklable zero-argument factory that returns a policy (built inside each worker).
        env: An env id (``"turngym/Maze-v0"``, or ``"my_pkg:my/Env-v0"`` to import ``my_pkg`` in the
            worker first), or a picklable zero-argument env factory.
        env_kwargs: Keyword arguments for ``turngym.make`` when ``env`` is an id.
        num_workers: Rollout-worker actors.
        num_envs: Episodes in flight per worker (its policy's batch size).
        num_cpus_per_worker: CPUs Ray reserves per worker (Ray also sets its torch thread count to it).
        num_gpus_per_worker: GPUs per worker (for HF/vLLM policies on a GPU cluster).
        rollout_kwargs: More ``rollout`` arguments for each worker, e.g. ``{"workers": "subprocess",
            "step_timeout_s": 30}`` for env subprocesses with timeouts, or ``{"mode": "async"}``.
        ray_init: ``ray.init`` kwargs used if Ray is not initialised yet (e.g. ``{"address": "auto"}``).

    Raises:
        ImportError: Ray is not installed.
    """

    def __init__(self, agent: str | PolicyFactory, env: str | EnvFactory, *, env_kwargs: dict | None = None,
                 num_workers: int = 2, num_envs: int = 8, num_cpus_per_worker: float = 1.0,
                 num_gpus_per_worker: float = 0.0, rollout_kwargs: dict | None = None,
                 ray_init: dict | None = None) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self._ray = ensure_ray(**(ray_init or {}))
        make_env = _env_factory(env, env_kwargs)
        cls = _remote(_RolloutWorker).options(num_cpus=num_cpus_per_worker, num_gpus=num_gpus_per_worker)
        self.workers = [cls.remote(agent, make_env, num_envs, dict(rollout_kwargs or {})) for _ in range(num_workers)]
        self.version = 0

    def run(self, specs: Sequence, sampling: SamplingParams | None = None,
            metadata: dict | None = None) -> list[Trajectory]:
        """Play every spec once, split in contiguous shards over the workers.

        Args:
            specs: ``EpisodeSpec``s; results come back in the same order.
            sampling: Passed to each worker's ``policy.act``.
            metadata: Merged into every trajectory's metadata (each also gets ``policy_version``).

        Returns:
            One Trajectory per spec, in spec order.
        """
        shards = shard_contiguous(list(specs), len(self.workers))
        refs = [w.run.remote(s, sampling, metadata) for w, s in zip(self.workers, shards)]
        return [Trajectory.from_dict(d) for part in self._ray.get(refs) for d in part]

    def set_weights(self, state_dict: dict, version: int | None = None) -> int:
        """Load ``state_dict`` into every worker's ``policy.model`` and drop their KV caches.

        The tensors are copied to CPU and put in Ray's object store once, shared by all workers.

        Args:
            state_dict: The trainer model's ``state_dict()``.
            version: Recorded as ``policy_version`` in later trajectories (default: previous + 1).

        Returns:
            The new version.

        Raises:
            TypeError: (from the workers) the policy has no ``.model``.
        """
        self.version = self.version + 1 if version is None else int(version)
        cpu = {k: v.detach().cpu() for k, v in state_dict.items()}
        ref = self._ray.put(cpu)
        self._ray.get([w.set_weights.remote(ref, self.version) for w in self.workers])
        return self.version

    def close(self) -> None:
        """End the worker actors."""
        for w in self.workers:
            try:
                self._ray.kill(w, no_restart=True)
            except Exception:
                pass  # already gone
        self.workers = []

    def __enter__(self) -> RayRolloutPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def ray_rollout(agent: str | PolicyFactory, env_id: str | EnvFactory, specs: Sequence, *,
                env_kwargs: dict | None = None, num_workers: int = 2, sampling: SamplingParams | None = None,
                num_envs: int = 8, **pool_kwargs: Any) -> list[Trajectory]:
    """Play ``specs`` once on a fresh ``RayRolloutPool`` and tear it down.

    For repeated collection (a trainer), keep a ``RayRolloutPool`` instead: workers, policies and
    envs are then built once.

    Args:
        agent: Agent spec or picklable policy factory (see ``RayRolloutPool``).
        env_id: Env id or picklable env factory.
        specs: Episodes to play.
        env_kwargs: For ``turngym.make``.
        num_workers: Rollout-worker actors.
        sampling: Passed to ``policy.act``.
        num_envs: Episodes in flight per worker.
        **pool_kwargs: More ``RayRolloutPool`` options (``num_cpus_per_worker``, ``ray_init``...).

    Returns:
        One Trajectory per spec, in spec order.
    """
    with RayRolloutPool(agent, env_id, env_kwargs=env_kwargs, num_workers=num_workers, num_envs=num_envs,
                        **pool_kwargs) as pool:
        return pool.run(specs, sampling)
