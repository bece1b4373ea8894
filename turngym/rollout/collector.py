"""The ``Collector``: everything that plays episodes for a run, in one place.

A training run plays its training split every iteration, screens it greedily now and then,
searches branches, replays demonstrations and evaluates a held-out split between stages. All of
that goes through one ``Collector``, which owns:

- the env pools: envs stay open across iterations and evaluations (a TextWorld env's first reset
  starts its engine, about 1 s of CPU; later resets take about 20 ms), see ``pool.EnvPools``;
- the generation engine: the trained HF policy itself, or a vLLM engine synced with its weights
  before each collection (``engine.VLLMRollouts``);
- collection for a trainer: this rank's share of an iteration's episodes and their metrics, or
  the background stream of async collection (``AsyncCollector``);
- the greedy screen, branch search and demonstrations.

Trainers keep learning only: they ask the Collector for episodes and never build an env.

    with Collector(policy) as collector:
        env = EnvTarget("turngym/TextWorld-easy-v0", {"split": "train", "tool_format": "xml"})
        trajs, metrics = collector.collect(env, specs, sampling, num_envs=16)
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

from turngym.agents.base import SamplingParams
from turngym.rollout.async_rollout import AsyncCollector
from turngym.rollout.branching import Tree, branch_search, tree_rollout
from turngym.envs.info import EnvInfo, env_info
from turngym.rollout.episode import EpisodeSpec, episode_specs, make_env_factory
from turngym.rollout.pool import EnvPools
from turngym.rollout.schedule import TaskSchedule, demo_task_ids
from turngym.rollout.sync import rollout
from turngym.types import Trajectory


@dataclass(frozen=True)
class EnvTarget:
    """What to play: a registered env with its constructor kwargs (the split among them), and the
    turn limits a run puts on it.

    Attributes:
        env_id: The registered id.
        kwargs: Constructor kwargs (``split``, ``tool_format``, ...).
        max_turns: Override the env's turn limit.
        max_state_visits: End an episode that reaches one env state this many times (0 = off).
    """

    env_id: str
    kwargs: dict = field(default_factory=dict, hash=False)
    max_turns: int | None = None
    max_state_visits: int = 0

    def factory(self) -> functools.partial:
        """A picklable env factory (equal targets give equal factories: they share a pool)."""
        kwargs = dict(self.kwargs)
        if self.max_turns is not None:
            kwargs["max_turns"] = self.max_turns
        if self.max_state_visits:
            from turngym.envs.wrappers import make_revisit_limited

            return functools.partial(make_revisit_limited, self.env_id, self.max_state_visits, **kwargs)
        return make_env_factory(self.env_id, **kwargs)

    @property
    def info(self) -> EnvInfo:
        return env_info(self.env_id, **self.kwargs)


def rollout_metrics(trajs: list[Trajectory], dt: float) -> dict[str, float]:
    """Success, return, length, invalid-action rate and speed of a batch of episodes."""
    turns = sum(len(t.turns) for t in trajs)
    tokens = sum(x.num_tokens for t in trajs for x in t.turns)
    invalid = sum(1 for t in trajs for x in t.turns if not x.action_valid)
    return {
        "rollout/success": sum(t.success for t in trajs) / len(trajs),
        "rollout/return": sum(t.total_reward for t in trajs) / len(trajs),
        "rollout/turns": turns / len(trajs),
        "rollout/invalid_rate": invalid / max(turns, 1),
        "rollout/env_steps": turns,
        "rollout/episodes": len(trajs),
        "rollout/tokens_per_s": tokens / dt if dt > 0 else 0.0,
        "rollout/seconds": dt,
    }


# Episodes in flight at most when an HF policy generates on a CPU. A CPU's generation is compute-bound
# from about 32 rows a forward (docs/benchmarks.md: 32 or 128 TextWorld games in flight evaluate
# equally fast); each episode in flight holds its KV cache (TextWorld-easy: 30-50 MB by its 10th
# turn), and the quickstart's search played 64 at once, most of its 4.7 GB peak.
CPU_MAX_ENVS = 32


class _SingleProcess:
    """The data-parallel context of one process (what ``trainers.distributed.DistContext`` is then)."""

    enabled, rank, world_size = False, 0, 1

    def shard(self, specs: list, group_size: int = 1) -> list:
        return list(specs)

    def rank_seed(self, seed: int | None) -> int | None:
        return seed

    def all_reduce_metrics(self, metrics: dict, weight: float = 1.0, sum_keys: Any = ()) -> dict:
        return metrics


class Collector:
    """Plays a run's episodes: env pools, the generation engine, collection, screens, search, demos.

    Args:
        policy: The trained policy (an ``HFPolicy``: ``model``, ``chat``, ``act``, ``invalidate_caches``),
            any ``Policy`` for playing only, or ``None`` for a collector that plays only the policies
            given to ``play`` (envs kept open across several policies' evaluations).
        engine: ``hf`` (the policy generates) or ``vllm`` (a vLLM engine built from the policy's
            weights on first use and synced before each collection; ``engine.VLLMRollouts``).
        vllm: Engine options for ``vllm``.
        workers: Where envs run: ``local`` | ``thread`` | ``subprocess`` | ``ray`` (``rollout``).
        step_timeout_s: Limit for one reset/step.
        ctx: A data-parallel context (``trainers.distributed.DistContext``): each rank plays its
            share of ``collect``'s episodes and metrics are combined over ranks. Default: one process.
        max_envs: Episodes in flight at most, whatever a call's ``num_envs`` (None: no cap; ``auto``:
            ``CPU_MAX_ENVS`` when the HF policy generates on a CPU, else no cap). Each episode in
            flight holds an open env and its KV cache (tens of MB on TextWorld); past the batch a
            CPU's generation needs to run at full speed they cost memory and buy nothing.

    Raises:
        ValueError: an unknown engine.
    """

    def __init__(self, policy: Any, *, engine: str = "hf", vllm: dict | None = None, workers: bool | str = "local",
                 step_timeout_s: float = 60.0, ctx: Any = None, max_envs: int | str | None = "auto") -> None:
        if engine not in ("hf", "vllm"):
            raise ValueError(f"engine must be hf or vllm (resolve auto first), got {engine!r}")
        if max_envs == "auto":
            on_cpu = getattr(getattr(policy, "device", None), "type", None) == "cpu"
            max_envs = CPU_MAX_ENVS if engine == "hf" and on_cpu else None
        if max_envs is not None and (not isinstance(max_envs, int) or max_envs < 1):
            raise ValueError(f"max_envs must be >= 1, None or auto, got {max_envs!r}")
        self.max_envs = max_envs
        self.policy, self.engine_name, self.vllm = policy, engine, dict(vllm or {})
        self.workers, self.step_timeout_s = workers, step_timeout_s
        self.ctx = ctx if ctx is not None else _SingleProcess()
        self.pools = EnvPools()
        self.engine: Any = None  # the VLLMRollouts, once built
        self._synced = False  # whether the last generator() call pushed weights
        self._stream: AsyncCollector | None = None
        self._demos: dict[tuple, list[Trajectory]] = {}  # demonstrations() by its arguments

    # ----- the generation engine -----------------------------------------------------------------
    def generator(self, version: Any = None) -> Any:
        """Who plays now: the policy, or the vLLM engine with the policy's current weights pushed
        into it (unless ``version`` is the one it already holds; ``None`` always pushes)."""
        if self.engine_name != "vllm":
            return self.policy
        if self.engine is None:
            from turngym.rollout.engine import VLLMRollouts

            self.engine = VLLMRollouts(self.policy, self.vllm)
        self._synced = self.engine.sync(self.policy.model, version=version)
        return self.engine.policy

    def _in_flight(self, num_envs: int) -> int:
        return min(num_envs, self.max_envs) if self.max_envs else num_envs

    # ----- playing --------------------------------------------------------------------------------
    def play(self, env: EnvTarget, specs: list[EpisodeSpec], sampling: SamplingParams | None = None, *,
             num_envs: int = 8, policy: Any = None, metadata: dict | None = None, progress: bool | str = False,
             pooled: bool = True) -> list[Trajectory]:
        """Play ``specs`` on ``env`` (``rollout``), with envs from the pool (``pooled``) or opened
        and closed here. ``policy``: who plays (default: ``generator()``)."""
        return rollout(policy if policy is not None else self.generator(), env.factory(), specs, sampling=sampling,
                       num_envs=self._in_flight(num_envs), workers=self.workers, step_timeout_s=self.step_timeout_s, progress=progress,
                       metadata=metadata, pools=self.pools if pooled else None)

    def collect(self, env: EnvTarget, specs: list[EpisodeSpec], sampling: SamplingParams, *, num_envs: int,
                group_size: int = 1, version: Any = None,
                progress: bool | str = False) -> tuple[list[Trajectory], dict[str, float]]:
        """A trainer's iteration: this rank's share of ``specs`` (whole groups), played with the
        current weights.

        Returns:
            This rank's trajectories, and rollout metrics over every rank's episodes.
        """
        ctx = self.ctx
        policy = self.generator(version)
        synced = self.engine is not None and self._synced
        specs = ctx.shard(specs, group_size)
        if hasattr(policy, "invalidate_caches"):  # the weights changed since the last collection
            policy.invalidate_caches()
        sampling = dataclasses.replace(sampling, seed=ctx.rank_seed(sampling.seed))  # ranks must not sample alike
        t0 = time.perf_counter()
        trajs = self.play(env, specs, sampling, num_envs=num_envs, policy=policy, progress=progress)
        metrics = rollout_metrics(trajs, time.perf_counter() - t0)
        metrics = ctx.all_reduce_metrics(metrics, weight=len(trajs), sum_keys=("rollout/env_steps", "rollout/episodes", "rollout/tokens_per_s"))
        if self.engine is not None:
            metrics["rollout/sync_seconds"] = self.engine.sync_seconds[-1] if synced else 0.0
        return trajs, metrics

    def screen(self, env: EnvTarget, schedule: TaskSchedule, sampling: SamplingParams, *, num_envs: int,
               version: Any = None) -> tuple[dict[str, float], int]:
        """Play every training task once greedily (held-out evaluation is greedy) and record which
        ones fail in ``schedule``. Returns the screen's metrics and its env steps.

        Raises:
            ValueError: under a multi-process context (a screen plays every task in one process).
        """
        if self.ctx.enabled:
            raise ValueError("task_sampling=greedy_failed screens in one process; not under torchrun")
        t0 = time.perf_counter()  # the specs are greedy: sampling gives the length cap
        trajs, metrics = self.collect(env, schedule.screen_specs(), sampling, num_envs=num_envs, version=version)
        schedule.record_screen(trajs)
        return ({"screen/greedy_success": sum(t.success for t in trajs) / max(1, len(trajs)),
                 "screen/seconds": time.perf_counter() - t0}, int(metrics["rollout/env_steps"]))

    # ----- async collection -----------------------------------------------------------------------
    def stream(self, env: EnvTarget, schedule: TaskSchedule, n: int, iteration: int, sampling: SamplingParams, *,
               num_envs: int, max_staleness: int) -> None:
        """Start playing ``schedule``'s draws from ``iteration`` on, on a background thread, ``n`` an
        iteration (the same tasks, in the same order, as synchronous collection)."""
        if self.ctx.enabled:
            raise ValueError("async collection runs in one process; use async_staleness=-1 with torchrun")
        specs: Iterable[EpisodeSpec] = (s for it in itertools.count(iteration) for s in schedule.specs(n, it))
        sampling = dataclasses.replace(sampling, seed=None)  # one stream of samples across iterations
        self._stream = AsyncCollector(self.policy, env.factory(), specs, batch_size=n, max_staleness=max_staleness,
                                      sampling=sampling, num_envs=self._in_flight(num_envs), workers=self.workers,
                                      step_timeout_s=self.step_timeout_s, version=iteration).start()

    @property
    def streaming(self) -> bool:
        return self._stream is not None

    def take(self, n: int, iteration: int) -> tuple[list[Trajectory], dict[str, float]]:
        """``n`` episodes from the stream, at most ``max_staleness`` versions old, and their metrics
        (``rollout/seconds``: the time the trainer waited)."""
        t0 = time.perf_counter()
        trajs = self._stream.get(n)
        metrics = rollout_metrics(trajs, time.perf_counter() - t0)
        lag = [iteration - t.metadata.get("policy_version", iteration) for t in trajs]
        metrics.update({"async/staleness_mean": sum(lag) / len(lag), "async/staleness_max": float(max(lag)),
                        "async/dropped_stale": float(self._stream.stats.get("dropped_stale", 0))})
        return trajs, metrics

    def weights_lock(self):
        """Hold while changing the weights: background generation pauses (a no-op when synchronous)."""
        return self._stream.weights_lock() if self._stream is not None else contextlib.nullcontext()

    def set_version(self, version: int) -> None:
        """The policy is now ``version`` (the stream tags what it plays with it)."""
        if self._stream is not None:
            self._stream.set_version(version)

    def stop_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    # ----- search and demonstrations ----------------------------------------------------------------
    def branch_search(self, env: EnvTarget, roots: list[tuple[EpisodeSpec, Trajectory]], *, points: int, width: int,
                      depth: int, max_new_tokens: int, num_envs: int, by: str = "state_key", pick: str = "latest",
                      version: Any = None, progress: bool | str = False) -> list[Trajectory]:
        """Branches of the failed ``roots`` (``branching.branch_search``), played by ``generator(version)``
        (the policy, or the vLLM engine holding its weights: its own runner-up replies either way)."""
        return branch_search(self.generator(version), env.factory(), roots, stops=list(env.info.stop_strings), points=points,
                             width=width, depth=depth, max_new_tokens=max_new_tokens, num_envs=self._in_flight(num_envs),
                             workers=self.workers, pools=self.pools, by=by, pick=pick, progress=progress)

    def tree_rollout(self, env: EnvTarget, specs: list[EpisodeSpec], *, roots: list[Trajectory] | None = None,
                     points: int, width: int, depth: int, max_new_tokens: int, num_envs: int,
                     by: str = "observation", pick: str = "latest", from_wins: bool = False,
                     rank: Any = None, pool: int = 0, keep_no_ops: bool = False) -> Tree:
        """Greedy roots on ``specs`` (or the given ``roots``), then branch search from the failed ones
        (``from_wins``: from every root; ``branching.tree_rollout``; ``rank``/``pool``: which runner-ups
        are played; ``keep_no_ops``: the refused ones are kept as one-turn leaves), played by the policy itself."""
        return tree_rollout(self.policy, env.factory(), specs, stops=list(env.info.stop_strings), points=points,
                            width=width, depth=depth, max_new_tokens=max_new_tokens, num_envs=self._in_flight(num_envs),
                            workers=self.workers, pools=self.pools, by=by, pick=pick, roots=roots,
                            from_wins=from_wins, rank=rank, pool=pool, keep_no_ops=keep_no_ops)

    def demonstrations(self, env: EnvTarget, episodes: int, seed: int = 0, demo_seed: int = -1,
                       num_envs: int = 8, pool: int = 0) -> list[Trajectory]:
        """The env's oracle on ``episodes`` training tasks (``demo_task_ids``), recorded as the
        policy's own tokens while it plays (``agents.scripted.Demonstrator``); successes only.
        The oracle and the chat layout are fixed, so a run's later calls with the same arguments
        (branch BC's ``expert_replay`` replays the SFT stage's demonstrations) get copies of the
        first call's episodes instead of starting envs to play them again.

        Raises:
            RuntimeError: the oracle solved none of them.
        """
        key = (env.env_id, repr(sorted(env.kwargs.items())), episodes, seed, demo_seed, pool)
        if key not in self._demos:
            self._demos[key] = self._play_demonstrations(env, episodes, seed, demo_seed, num_envs, pool)
        return copy.deepcopy(self._demos[key])

    def _play_demonstrations(self, env: EnvTarget, episodes: int, seed: int, demo_seed: int,
                             num_envs: int, pool: int) -> list[Trajectory]:
        from turngym.agents.scripted import Demonstrator, OracleAgent

        hinted = EnvTarget(env.env_id, {**env.kwargs, "scripted_hints": True})  # the oracle plays without run limits
        tasks = demo_task_ids(list(hinted.info.task_ids), episodes, demo_seed, pool)
        agent = Demonstrator(OracleAgent(), self.policy.chat) if hasattr(self.policy, "chat") else OracleAgent()
        trajs = self.play(hinted, episode_specs(tasks, episodes, seed), num_envs=num_envs, policy=agent, pooled=False)
        experts = [t for t in trajs if t.success]
        if not experts:
            raise RuntimeError(f"the oracle of {env.env_id} solved no episode; nothing to imitate")
        return experts

    # ----- lifetime -----------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the stream, close every env and shut the vLLM engine down."""
        self.stop_stream()
        self.pools.close()
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
