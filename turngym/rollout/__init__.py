"""Play episodes: env handles (local, thread, subprocess, Ray), the sync and async rollout loops,
env facts (``EnvInfo``), task schedules, tree rollouts, and the ``Collector`` that a run plays
everything through (env pools, the generation engine, screens, search, demonstrations).

    from turngym.rollout import episode_specs, make_env_factory, rollout
    trajs = rollout(policy, make_env_factory("turngym/Maze-v0"), episode_specs(task_ids, 20))

Trainers and bench play episodes only through a ``Collector``; benchmarks and scripts may also
call ``rollout`` directly.
"""

from turngym.rollout import ray_env  # noqa: F401  (registers the "ray" env-handle kind; imports no Ray)
from turngym.rollout.async_rollout import AsyncCollector, async_rollout
from turngym.rollout.collector import Collector, EnvTarget, rollout_metrics
from turngym.envs.info import EnvInfo, env_info
from turngym.rollout.episode import EpisodeSpec, episode_specs, make_env_factory
from turngym.rollout.handles import EnvCrashed, EnvHandle, LocalEnv, SubprocessEnv, describe_env, make_handle
from turngym.rollout.pool import EnvPools
from turngym.rollout.schedule import TaskSchedule, task_schedule
from turngym.rollout.sync import rollout

__all__ = [
    "rollout", "async_rollout", "Collector", "EnvTarget", "rollout_metrics", "TaskSchedule", "task_schedule",
    "EnvInfo", "env_info", "EnvPools", "AsyncCollector", "EpisodeSpec", "episode_specs", "make_env_factory",
    "EnvCrashed", "EnvHandle", "LocalEnv", "SubprocessEnv", "describe_env", "make_handle",
]
