"""Async rollout: env steps overlap with generation, and trajectories stream to a trainer.

Two entry points:

- ``async_rollout(policy, make_env, specs, ...)`` has ``rollout``'s signature and return value:
  every spec once, results in spec order. A scripted
  deterministic policy gets the same trajectories as in sync mode; an LLM policy sees different
  batch compositions, so its samples may differ.
- ``AsyncCollector`` keeps playing episodes on a background thread and hands finished trajectories to
  a trainer, each tagged with the policy version that produced it, with bounded staleness.

How the overlap works: every env reset or step runs on its own thread, which calls the env handle's
``send`` then ``recv`` (see ``turngym.rollout.handles``). The loop waits until at least one episode
is ready (its env answered), asks the policy for that batch, hands the steps out and waits again.
There is no barrier: while one episode's tool sleeps, runs a sandbox or waits on a subprocess
worker, the policy generates for the others. With ``workers=False`` the envs run in this process on
those threads, which helps when steps release the GIL (sleeps, subprocesses, docker, HTTP); a
CPU-bound Python env wants ``workers=True`` (subprocesses). ``"local"`` handles cannot enforce
``step_timeout_s``; ``"thread"`` handles can.

When it pays (measured in ``benchmarks/async_rollout.py``): against sync rollout with parallel env
steps, async only wins when episodes fall out of step (unequal tool latencies or episode lengths)
and generating for a smaller batch is cheaper than for a full one (compute-bound generation), or
when the backend batches requests continuously. An HF policy whose batch costs about the same at
any size, with equal tool latencies, is as fast in sync mode with ``workers="thread"``/``True``.
The larger win is ``AsyncCollector``: the trainer's update runs while episodes keep being played.

Intended use from a trainer (generation and the optimizer share the model object)::

    collector = AsyncCollector(policy, make_env_factory(env_id), itertools.cycle(specs),
                               batch_size=16, max_staleness=1, num_envs=8, workers=True)
    with collector:                                   # starts the producer thread; close() on exit
        for it in range(iterations):
            trajs = collector.get()                   # 16 trajectories at most 1 version stale
            loss = compute_loss(trajs)                # forward/backward only read the weights
            loss.backward()
            with collector.weights_lock():            # generation pauses while the weights change
                optimizer.step()
                optimizer.zero_grad()
                collector.set_version(it + 1)         # also drops the policy's stale KV caches

Hold ``weights_lock`` around anything that changes what generation sees (``optimizer.step``, moving
or re-casting the model, ``train()``/``eval()`` switches with active dropout), never around ``get``
or ``close``. Each trajectory records ``metadata["policy_version"]`` (the oldest version that acted
in it), ``metadata["policy_versions"]`` and ``turn.info["policy_version"]`` per turn.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

from turngym.agents.base import Policy, SamplingParams
from turngym.clock import bar as clock_bar
from turngym.rollout.episode import (
    EpisodeSpec, act_checked, apply_step, begin_episode, close_handles, end_episode, make_turn, open_handles,
    reset_kwargs,
)
from turngym.rollout.handles import EnvCrashed, EnvHandle
from turngym.types import Trajectory, Turn

GATHER_S = 0.02  # after the first env answer, wait this long for each further one before generating


@dataclass
class _InFlight:
    """An env call on its way: a reset (``turn`` is None) or a step with the policy's utterance."""

    idx: int
    spec: EpisodeSpec
    version: int | None
    t0: float = 0.0
    utt: Any = None
    turn: Turn | None = None


class _Engine:
    """Episodes on a set of env handles; env calls run on threads, the policy acts on ready episodes.

    Only the thread that owns the engine calls ``start``/``collect``/``act``; step threads only
    touch their handle and the completion queue. With ``version`` given, turns are tagged with it.
    """

    def __init__(self, policy: Policy, handles: list[EnvHandle], sampling, metadata, max_batch: int | None) -> None:
        self.policy, self.handles, self.sampling, self.metadata = policy, handles, sampling, metadata
        self.max_batch = max_batch
        self.env_desc = handles[0].describe()
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._flight: dict[int, _InFlight] = {}
        self.live: dict[int, tuple[int, Any]] = {}  # slot -> (spec index, episode)
        self.ready: list[int] = []  # slots waiting for the policy, in the order their env answered

    @property
    def busy(self) -> bool:
        return bool(self._flight or self.ready)

    def start(self, slot: int, idx: int, spec: EpisodeSpec, version: int | None = None) -> None:
        if spec.prefix_len or spec.free_turns:
            raise ValueError("branches (EpisodeSpec.parent / free_turns) are played by the sync rollout only")
        self._dispatch(slot, _InFlight(idx, spec, version, t0=time.perf_counter()), "reset", reset_kwargs(spec))

    def wake(self) -> None:
        """Make a blocked ``collect`` return (to re-check stop flags or admission)."""
        self._done.put((None, None))

    def _dispatch(self, slot: int, call: _InFlight, cmd: str, payload: Any) -> None:
        self._flight[slot] = call
        threading.Thread(target=self._run, args=(slot, cmd, payload), daemon=True, name="turngym-step").start()

    def _run(self, slot: int, cmd: str, payload: Any) -> None:
        handle = self.handles[slot]
        try:
            handle.send(cmd, payload)
            out = handle.recv()
        except BaseException as e:  # EnvCrashed is an outcome; anything else is a bug collect re-raises
            out = e
        self._done.put((slot, out))

    def collect(self) -> list[tuple[int, int, Trajectory]]:
        """Apply every finished env call, first waiting for one if no episode is ready.

        Returns:
            ``(slot, spec index, trajectory)`` for each episode that ended; its slot is free.
        """
        items = []
        with contextlib.suppress(queue.Empty):
            if not self.ready and self._flight:
                items.append(self._done.get())
                # Steps sent together with equal latency come back within a few ms of each other:
                # take the burst, rather than generate for its first episode alone.
                while len(items) < len(self._flight):
                    items.append(self._done.get(timeout=GATHER_S))
            while True:
                items.append(self._done.get_nowait())
        ended = []
        for slot, out in items:
            if slot is None:
                continue
            if isinstance(out, BaseException) and not isinstance(out, EnvCrashed):
                raise out
            ended += self._apply(slot, self._flight.pop(slot), out)
        return ended

    def _apply(self, slot: int, call: _InFlight, out: Any) -> list[tuple[int, int, Trajectory]]:
        if call.turn is None:  # a reset came back
            ep = begin_episode(call.spec, out, self.env_desc, self.metadata, call.t0)
            if call.version is not None:  # the oldest version so far: none has acted yet
                ep.traj.metadata.update(policy_version=call.version, policy_versions=[])
            if ep.traj.truncated:
                return [(slot, call.idx, ep.traj)]
            self.live[slot] = (call.idx, ep)
            self.ready.append(slot)
            return []
        idx, ep = self.live[slot]
        over = apply_step(ep, call.utt, call.turn, out)
        if call.version is not None:
            call.turn.info["policy_version"] = call.version
        if not over:
            self.ready.append(slot)
            return []
        del self.live[slot]
        traj = end_episode(ep)
        if call.version is not None:
            versions = [t.info["policy_version"] for t in traj.turns]
            traj.metadata["policy_versions"] = versions
            traj.metadata["policy_version"] = min(versions)
        return [(slot, idx, traj)]

    def act(self, version: int | None = None) -> int:
        """One batched ``act`` over the ready episodes (the longest-waiting ``max_batch`` of them,
        in spec order), then dispatch their steps; returns how many acted."""
        k = self.max_batch or len(self.ready)
        slots = sorted(self.ready[:k], key=lambda s: self.live[s][0])
        if not slots:
            return 0
        del self.ready[:k]
        utts = act_checked(self.policy, [self.live[s][1].conv for s in slots], self.sampling)
        for s, utt in zip(slots, utts):
            idx, ep = self.live[s]
            self._dispatch(s, _InFlight(idx, ep.spec, version, utt=utt, turn=make_turn(utt)), "step", utt.text)
        return len(slots)


def async_rollout(
    policy: Policy,
    make_env,
    specs: list[EpisodeSpec],
    *,
    sampling: SamplingParams | None = None,
    num_envs: int = 8,
    workers: bool | str = False,
    step_timeout_s: float = 60.0,
    progress: bool | str = True,
    metadata: dict[str, Any] | None = None,
    max_batch: int | None = None,
) -> list[Trajectory]:
    """Play every episode in ``specs``, generating for ready episodes while other envs step.

    Args and Returns: as ``turngym.rollout.sync.rollout``, plus:
        max_batch: Act on at most this many ready episodes at once (None: all of them). With a
            batch-at-a-time backend (HF) and envs of equal latency, all episodes stay in lock-step
            and nothing overlaps; ``num_envs // 2`` splits them into two groups, so one group's
            generation overlaps the other's env steps (pipelining).

    A crashed or hung env truncates its episode (error in metadata) and the run goes on.
    """
    _check_max_batch(max_batch)
    if not specs:
        return []
    handles = open_handles(workers, make_env, min(num_envs, len(specs)), step_timeout_s)
    try:
        return _async_loop(_Engine(policy, handles, sampling, metadata, max_batch), specs, progress)
    finally:
        close_handles(handles)


def _check_max_batch(max_batch: int | None) -> None:
    if max_batch is not None and max_batch < 1:
        raise ValueError(f"max_batch must be >= 1 or None, got {max_batch}")


def _async_loop(eng: _Engine, specs: list[EpisodeSpec], progress: bool | str) -> list[Trajectory]:
    results: list[Trajectory | None] = [None] * len(specs)
    todo = list(enumerate(specs))[::-1]
    free = list(range(len(eng.handles)))[::-1]
    bar = clock_bar(len(specs), progress if isinstance(progress, str) else "episodes", "ep", disable=not progress,
                    cap=eng.env_desc.get("max_turns"))
    while todo or eng.busy:
        while free and todo:
            eng.start(free.pop(), *todo.pop())
        for slot, idx, traj in eng.collect():
            results[idx] = traj
            free.append(slot)
            bar.update(1, turns=len(traj.turns))
        if free and todo:  # send those resets first, so they run while the policy generates
            continue
        bar.add_turns(eng.act(), [len(ep.traj.turns) for _, ep in eng.live.values()])
    bar.close()
    return results  # type: ignore[return-value]


class AsyncCollector:
    """Plays episodes on a background thread and streams finished trajectories, with bounded staleness.

    Staleness control follows AReaL (Fu et al., 2025): with the trainer at version ``v`` (counted from
    ``version``), the producer starts no episode past ``(v + max_staleness + 1) * batch_size``
    accepted ones, and ``get`` drops any trajectory with ``v - policy_version > max_staleness``
    (counted in ``stats["dropped_stale"]``; a drop frees room for a replacement).

    Args:
        policy: The policy to play (its ``act`` runs on the producer thread, under ``weights_lock``).
        make_env: Zero-argument env factory, as for ``rollout``.
        specs: Episodes to play, consumed lazily (``itertools.cycle(specs)`` never ends; a finite
            iterable ends the stream, after which ``get`` returns what is left).
        batch_size: Trajectories per trainer step (the default ``n`` of ``get``).
        max_staleness: Versions a trajectory may lag behind the trainer (0: on-policy).
        sampling: Passed to ``policy.act``.
        num_envs: Episodes in flight at once.
        workers: Where envs run, as for ``rollout`` (``False``/``"local"``, ``"thread"``,
            ``True``/``"subprocess"``, ``"ray"``).
        step_timeout_s: Limit for one reset/step (not enforced for ``"local"``).
        metadata: Merged into every trajectory's metadata.
        version: The policy version at start.
        max_batch: Act on at most this many ready episodes at once (see ``async_rollout``).
        lock: A lock to use as the weights lock (default: a new ``threading.Lock``).

    Raises:
        ValueError: ``batch_size``, ``num_envs`` or ``max_batch`` below 1, or ``max_staleness`` below 0.
    """

    def __init__(
        self,
        policy: Policy,
        make_env,
        specs: Iterable[EpisodeSpec],
        *,
        batch_size: int = 8,
        max_staleness: int = 1,
        sampling: SamplingParams | None = None,
        num_envs: int = 8,
        workers: bool | str = False,
        step_timeout_s: float = 60.0,
        metadata: dict[str, Any] | None = None,
        version: int = 0,
        max_batch: int | None = None,
        lock: Any = None,
    ) -> None:
        if batch_size < 1 or num_envs < 1:
            raise ValueError(f"batch_size and num_envs must be >= 1, got {batch_size} and {num_envs}")
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        _check_max_batch(max_batch)
        self.policy, self.make_env, self.sampling, self.metadata = policy, make_env, sampling, metadata
        self.batch_size, self.max_staleness, self.num_envs = batch_size, max_staleness, num_envs
        self.workers, self.step_timeout_s, self.max_batch = workers, step_timeout_s, max_batch
        self._specs: Iterator[EpisodeSpec] = iter(specs)
        self._lock = lock if lock is not None else threading.Lock()
        self._cond = threading.Condition()  # guards everything below; never held while acting
        self._v0 = self._version = version
        self._out: deque[Trajectory] = deque()
        self._accepted = 0  # episodes started and not dropped as stale
        self._writers = 0  # threads waiting for or holding weights_lock (they go before generation)
        self._stop = self._finished = False
        self._error: BaseException | None = None
        self._counts = {"started": 0, "produced": 0, "consumed": 0, "dropped_stale": 0}
        self._handles: list[EnvHandle] = []
        self._engine: _Engine | None = None
        self._thread: threading.Thread | None = None

    # ----- trainer side -----------------------------------------------------------------------
    def start(self) -> AsyncCollector:
        """Open the env handles and start the producer thread; returns ``self``.

        Raises:
            RuntimeError: already started.
        """
        if self._thread is not None:
            raise RuntimeError("AsyncCollector already started")
        self._handles = open_handles(self.workers, self.make_env, self.num_envs, self.step_timeout_s)
        self._engine = _Engine(self.policy, self._handles, self.sampling, self.metadata, self.max_batch)
        self._thread = threading.Thread(target=self._produce, daemon=True, name="turngym-collector")
        self._thread.start()
        return self

    def get(self, n: int | None = None, timeout: float | None = None) -> list[Trajectory]:
        """The next ``n`` (default ``batch_size``) fresh-enough trajectories, in finishing order.

        Returns:
            ``n`` trajectories; fewer only once a finite ``specs`` is used up (or after ``close``).

        Raises:
            RuntimeError: not started.
            TimeoutError: ``timeout`` seconds passed first (nothing is consumed).
            BaseException: whatever the producer thread raised (policy or env-loop error).
        """
        if self._thread is None:
            raise RuntimeError("call start() (or use the collector in a with block) before get()")
        n = self.batch_size if n is None else n
        deadline = None if timeout is None else time.monotonic() + timeout
        out: list[Trajectory] = []
        with self._cond:
            while True:
                if self._error is not None:
                    raise self._error
                self._take(out, n)
                if len(out) >= n or self._finished:
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    self._out.extendleft(reversed(out))
                    raise TimeoutError(f"got {len(out)} of {n} trajectories within {timeout:g}s")
                self._cond.wait(left)
            self._counts["consumed"] += len(out)
        return out

    def _take(self, out: list[Trajectory], n: int) -> None:
        while self._out and len(out) < n:
            traj = self._out.popleft()
            if self._version - traj.metadata["policy_version"] > self.max_staleness:
                self._counts["dropped_stale"] += 1
                self._accepted -= 1  # room for a replacement episode
                self._wake_producer()
            else:
                out.append(traj)

    def set_version(self, version: int) -> None:
        """Declare the policy's weights updated to ``version`` (call it inside ``weights_lock``).

        Also calls ``policy.invalidate_caches()`` when the policy has it (KV caches from old weights).

        Raises:
            ValueError: ``version`` is lower than the current one.
        """
        with self._cond:
            if version < self._version:
                raise ValueError(f"policy version went back from {self._version} to {version}")
            self._version = version
            invalidate = getattr(self.policy, "invalidate_caches", None)
            if callable(invalidate):
                invalidate()
            self._wake_producer()

    @property
    def version(self) -> int:
        return self._version

    @contextlib.contextmanager
    def weights_lock(self):
        """Hold this while changing the weights; generation waits, and waiting trainers go first."""
        with self._cond:
            self._writers += 1
        try:
            with self._lock:
                yield
        finally:
            with self._cond:
                self._writers -= 1
                self._cond.notify_all()

    @property
    def stats(self) -> dict[str, int]:
        """Counts: started, produced, consumed, dropped_stale; plus queued and version."""
        with self._cond:
            return {**self._counts, "queued": len(self._out), "version": self._version}

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the producer (it finishes the ``act`` it is in), join it, close the envs. Idempotent."""
        with self._cond:
            self._stop = True
            self._wake_producer()
        if self._thread is not None:
            self._thread.join(timeout_s)
        close_handles(self._handles)
        self._handles = []

    def __enter__(self) -> AsyncCollector:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ----- producer side (the background thread) -----------------------------------------------
    def _wake_producer(self) -> None:  # caller holds self._cond
        self._cond.notify_all()
        if self._engine is not None:
            self._engine.wake()

    def _admit(self) -> bool:  # caller holds self._cond
        return self._accepted < (self._version - self._v0 + self.max_staleness + 1) * self.batch_size

    def _produce(self) -> None:
        eng, free, exhausted = self._engine, list(range(len(self._handles)))[::-1], False
        try:
            while True:
                exhausted = self._start_episodes(eng, free, exhausted)
                with self._cond:
                    if self._stop or (exhausted and not eng.busy):
                        return
                    if not eng.busy:  # nothing to do until the trainer moves on
                        self._cond.wait_for(lambda: self._stop or self._admit())
                        continue
                ended = eng.collect()
                for slot, _, traj in ended:
                    free.append(slot)
                    with self._cond:
                        self._out.append(traj)
                        self._counts["produced"] += 1
                        self._cond.notify_all()
                with self._cond:
                    refill = bool(ended and free and not exhausted and self._admit())
                if not refill:  # else start those episodes first, so their resets overlap generation
                    self._act(eng)
        except BaseException as e:
            with self._cond:
                self._error = e
        finally:
            with self._cond:
                self._finished = True
                self._cond.notify_all()

    def _start_episodes(self, eng: _Engine, free: list[int], exhausted: bool) -> bool:
        while free and not exhausted:
            with self._cond:
                if self._stop or not self._admit():
                    return exhausted
                version = self._version
            spec = next(self._specs, None)
            if spec is None:
                return True
            with self._cond:
                self._accepted += 1
                idx = self._counts["started"]
                self._counts["started"] += 1
            eng.start(free.pop(), idx, spec, version)
        return exhausted

    def _act(self, eng: _Engine) -> None:
        if not eng.ready:
            return
        with self._cond:
            self._cond.wait_for(lambda: self._stop or self._writers == 0)
            if self._stop:
                return
        with self._lock:
            eng.act(self._version)  # read under the lock: the version matches the weights used
