"""Sync rollout: run a policy on many episodes and return Trajectories.

Up to ``num_envs`` episodes run at once. Each loop asks the policy for one utterance per live
episode in a single batched ``act`` call, sends every env its step, then collects the results:
envs in workers step in parallel, with a barrier before the next ``act``. For rollout without the
barrier, see ``turngym.rollout.async_rollout``.

Envs live in this process, on threads, in subprocess workers or in Ray actors (``workers``, see
``turngym.rollout.handles``) with a per-step timeout; an env that crashes or hangs is restarted
and its episode is kept, marked truncated, with the error in its metadata.
"""

from __future__ import annotations

import ctypes
import dataclasses
import time
from typing import Any

from turngym.agents.base import Policy, SamplingParams
from turngym.clock import CLOCK, Progress
from turngym.clock import bar as clock_bar
from turngym.rollout.episode import (
    EpisodeSpec, Live, ReplayDiverged, act_checked, apply_step, begin_episode, branch_over, close_handles,
    end_episode, make_turn, open_handles, recv_result, replay_utterance, reset_kwargs,
)
from turngym.rollout.pool import EnvPools
from turngym.types import Trajectory


def rollout(
    policy: Policy,
    make_env,
    specs: list[EpisodeSpec],
    *,
    sampling: SamplingParams | None = None,
    num_envs: int = 8,
    workers: bool | str = False,
    step_timeout_s: float = 60.0,
    progress: bool | str | Progress = True,
    metadata: dict[str, Any] | None = None,
    pools: EnvPools | None = None,
) -> list[Trajectory]:
    """Play every episode in ``specs`` with ``policy``.

    Args:
        policy: Anything with ``act(conversations, sampling) -> list[Utterance]``.
        make_env: Zero-argument env factory (see ``make_env_factory``); picklable if ``workers``.
        specs: Episodes to play, in order; results come back in the same order.
        sampling: Passed to ``policy.act``.
        num_envs: Episodes in flight at once (the policy's largest batch).
        workers: Where envs run: ``False``/``"local"`` (this process), ``"thread"`` (this process,
            each step on a thread), ``True``/``"subprocess"`` (worker processes), ``"ray"``.
        step_timeout_s: Limit for one reset/step (not enforced for ``"local"``).
        progress: Show progress (``clock.bar``: episodes, turns per second and an ETA; a bar in a
            terminal, a line every few seconds in a log; silent under ``clock.quiet``); a string names it; a ``Progress`` of the caller's (counting
            several rollouts) is moved instead.
        metadata: Merged into every trajectory's metadata (e.g. env id, policy version).
        pools: Keep the env handles open for the next rollout of the same env (see ``EnvPools``);
            None opens them here and closes them on return.

    Returns:
        One Trajectory per spec.

    Raises:
        ValueError: unknown ``workers``.
    """
    if not specs:
        return []
    try:
        return _rollout(policy, make_env, specs, sampling, num_envs, workers, step_timeout_s, progress, metadata, pools)
    finally:
        trim_heap()  # the episodes' KV caches are gone now


def _rollout(policy, make_env, specs, sampling, num_envs, workers, step_timeout_s, progress, metadata, pools):
    n = min(num_envs, len(specs))
    if pools is not None:
        key, handles = pools.handles(workers, make_env, n, step_timeout_s)
        try:
            return _sync_loop(policy, handles, specs, sampling, progress, metadata)
        except BaseException:
            pools.discard(key)  # a handle may still have a call in flight
            raise
    handles = open_handles(workers, make_env, n, step_timeout_s)
    try:
        return _sync_loop(policy, handles, specs, sampling, progress, metadata)
    finally:
        close_handles(handles)


def trim_heap() -> None:
    """Hand the heap's free pages back to the OS (glibc's ``malloc_trim``; elsewhere a no-op).

    A rollout's KV caches (tens of MB an episode, 32 to 64 episodes at once, more during a branch
    search) are freed when it ends, but glibc keeps freed memory in its heap behind blocks still in
    use: a quickstart process stayed at the search's 4.5 GB through the fit and evaluation after it.
    """
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _sync_loop(policy, handles, specs, sampling, progress, metadata) -> list[Trajectory]:
    env_desc = handles[0].describe()
    results: list[Trajectory | None] = [None] * len(specs)
    queue = list(enumerate(specs))[::-1]
    live: dict[int, tuple[int, Live]] = {}
    own = not isinstance(progress, Progress)  # else a caller's bar that counts several rollouts
    bar = clock_bar(len(specs), progress if isinstance(progress, str) else "episodes", "ep", disable=not progress,
                    cap=env_desc.get("max_turns")) if own else progress

    def finish(idx: int, traj: Trajectory) -> None:
        results[idx] = traj
        bar.update(1, turns=len(traj.turns))

    _fill(handles, list(range(len(handles))), queue, live, env_desc, metadata, finish, bar)
    greedy = dataclasses.replace(sampling or SamplingParams(), temperature=0.0)
    while live:
        slots = sorted(live)
        utts = [None] * len(slots)
        diverged = []
        for i, s in enumerate(slots):  # branches replay their recorded prefix first
            ep = live[s][1]
            if len(ep.traj.turns) < ep.spec.prefix_len:
                try:
                    utts[i] = replay_utterance(policy, ep.conv, ep.spec, len(ep.traj.turns))
                except ReplayDiverged as e:
                    ep.traj.truncated, ep.traj.metadata["error"] = True, str(e)
                    diverged.append(i)
        freed = [slots[i] for i in diverged]  # a diverged branch ends here; its slot takes the next spec
        for i in diverged[::-1]:
            finish(live[slots[i]][0], end_episode(live.pop(slots[i])[1], policy))
            del slots[i], utts[i]
        # greedy episodes (EpisodeSpec.greedy) and sampled ones answer in one act call each
        for params, want in ((sampling, False), (greedy, True)):
            part = [i for i, s in enumerate(slots) if utts[i] is None and live[s][1].spec.greedy == want]
            if part:
                for i, u in zip(part, act_checked(policy, [live[slots[i]][1].conv for i in part], params)):
                    utts[i] = u
        with CLOCK.kind("env_step"):
            for s, utt in zip(slots, utts):  # every env steps at once; the barrier is the recv loop below
                handles[s].send("step", utt.text)
            answers = [recv_result(handles[s]) for s in slots]
        for s, utt, result in zip(slots, utts, answers):
            idx, ep = live[s]
            turn = make_turn(utt)
            if apply_step(ep, utt, turn, result) or branch_over(ep):
                finish(idx, end_episode(ep, policy))
                del live[s]
                freed.append(s)
        bar.add_turns(len(slots), [len(ep.traj.turns) for _, ep in live.values()])
        _fill(handles, freed, queue, live, env_desc, metadata, finish, bar)
    if own:
        bar.close()
    return results  # type: ignore[return-value]


def _fill(handles, slots, queue, live, env_desc, metadata, finish, bar) -> None:
    """Start the next queued episodes on the free ``slots`` (resets run in parallel; the first
    reset of a new env starts its engine, so ``bar`` counts them)."""
    while slots and queue:
        batch = [(s, *queue.pop()) for s in slots[: len(queue)]]
        slots = slots[len(batch):]
        t0 = time.perf_counter()
        with CLOCK.kind("env_startup"):  # a kept env resets in ms; a new one starts its engine here
            for s, _, spec in batch:
                handles[s].send("reset", reset_kwargs(spec))
            results = []
            for k, (s, _, _) in enumerate(batch):
                results.append(recv_result(handles[s]))
                if len(batch) > 1:
                    bar.set_postfix_str(f"reset {k + 1}/{len(batch)}" if k + 1 < len(batch) else "")
        for (s, idx, spec), result in zip(batch, results):
            ep = begin_episode(spec, result, env_desc, metadata, t0)
            if ep.traj.truncated:  # reset itself crashed: record it and give the slot the next spec
                finish(idx, ep.traj)
                slots.append(s)
            else:
                live[s] = (idx, ep)
