"""Ray rollout pool (the ``[ray]`` extra): whole rollout workers (a policy plus its envs) as actors.

Episode specs are split into contiguous shards, one per worker, and the trajectories come back in
spec order. ``set_weights`` pushes a trainer's new weights to every worker. Ray is imported lazily.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from turngym.agents.base import SamplingParams
from turngym.rollout.async_rollout import async_rollout
from turngym.rollout.episode import make_env_factory
from turngym.rollout.handles import EnvFactory
from turngym.rollout.ray_env import ensure_ray, remote_class
from turngym.rollout.sync import rollout
from turngym.types import Trajectory

PolicyFactory = Callable[[], Any]


# ----- rollout workers ----------------------------------------------------------------------------
class _RolloutWorker:
    """The body of a rollout-worker actor: one policy and its envs, playing shards of episodes."""

    def __init__(self, agent: str | PolicyFactory, make_env: EnvFactory, num_envs: int, rollout_kwargs: dict) -> None:
        from turngym.agents import make_agent

        self.policy = make_agent(agent) if isinstance(agent, str) else agent()
        self.make_env, self.num_envs, self.rollout_kwargs = make_env, num_envs, rollout_kwargs
        self.version = 0

    def run(self, specs: list, sampling: SamplingParams | None, metadata: dict | None) -> list[dict]:
        meta = {"policy_version": self.version, **(metadata or {})}
        kwargs = dict(self.rollout_kwargs)
        play = async_rollout if kwargs.pop("mode", "sync") == "async" else rollout
        trajs = play(self.policy, self.make_env, specs, sampling=sampling, num_envs=self.num_envs,
                     progress=False, metadata=meta, **kwargs)
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
        cls = remote_class(_RolloutWorker).options(num_cpus=num_cpus_per_worker, num_gpus=num_gpus_per_worker)
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
