"""Rollout: run a policy on many episodes and return Trajectories.

Up to ``num_envs`` episodes run at once. In the default ``mode="sync"`` each loop asks the policy
for one utterance per live episode in a single batched ``act`` call, sends every env its step, then
collects the results: envs in workers step in parallel, with a barrier before the next ``act``.
``mode="async"`` drops the barrier (see ``turngym.trainers.async_rollout``).

Envs live in this process, on threads, in subprocess workers or in Ray actors (``workers``, see
``turngym.trainers.workers``) with a per-step timeout; an env that crashes or hangs is restarted
and its episode is kept, marked truncated, with the error in its metadata.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from turngym.agents.base import Conversation, Policy, SamplingParams
from turngym.trainers.workers import EnvCrashed, EnvHandle, handle_kind, make_handle
from turngym.types import Message, ToolCall, Trajectory, Turn


@dataclass(frozen=True)
class EpisodeSpec:
    """Which episode to play: a task and the reset seed (same pair => same episode start)."""

    task_id: str | None
    seed: int


def make_env_factory(env_id: str, **kwargs: Any) -> functools.partial:
    """A picklable factory for ``turngym.make(env_id, **kwargs)`` (for subprocess workers)."""
    from turngym.envs.registry import make

    return functools.partial(make, env_id, **kwargs)


def episode_specs(task_ids: list[str], episodes: int, seed: int = 0, group_size: int = 1) -> list[EpisodeSpec]:
    """``episodes`` specs cycling over ``task_ids``; each is repeated ``group_size`` times in a row
    with the same seed, so group methods (GRPO, GiGPO) get identical resets."""
    if not task_ids:
        raise ValueError("no tasks to play")
    specs = []
    for i in range(episodes):
        s = EpisodeSpec(task_ids[i % len(task_ids)], seed + i)
        specs += [s] * group_size
    return specs


@dataclass
class _Live:
    spec: EpisodeSpec
    conv: Conversation
    traj: Trajectory
    t0: float


def rollout(
    policy: Policy,
    make_env,
    specs: list[EpisodeSpec],
    *,
    sampling: SamplingParams | None = None,
    num_envs: int = 8,
    workers: bool | str = False,
    step_timeout_s: float = 60.0,
    progress: bool = True,
    metadata: dict[str, Any] | None = None,
    mode: str = "sync",
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
        progress: Show a tqdm bar.
        metadata: Merged into every trajectory's metadata (e.g. env id, policy version).
        mode: ``"sync"`` (batched act, then all steps, then the next act) or ``"async"`` (the policy
            acts on whichever episodes are ready while other steps run; same results for
            deterministic policies, see ``turngym.trainers.async_rollout``).

    Returns:
        One Trajectory per spec.

    Raises:
        ValueError: unknown ``mode`` or ``workers``.
    """
    if mode == "async":
        from turngym.trainers.async_rollout import async_rollout

        return async_rollout(policy, make_env, specs, sampling=sampling, num_envs=num_envs, workers=workers,
                             step_timeout_s=step_timeout_s, progress=progress, metadata=metadata)
    if mode != "sync":
        raise ValueError(f"mode must be 'sync' or 'async', got {mode!r}")
    if not specs:
        return []
    handles = open_handles(workers, make_env, min(num_envs, len(specs)), step_timeout_s)
    try:
        return _sync_loop(policy, handles, specs, sampling, progress, metadata)
    finally:
        close_handles(handles)


def open_handles(workers: bool | str, make_env, n: int, timeout_s: float) -> list[EnvHandle]:
    """``n`` env handles of the kind ``workers`` names (closed again if one fails to open)."""
    kind = handle_kind(workers)
    handles: list[EnvHandle] = []
    try:
        for _ in range(max(1, n)):
            handles.append(make_handle(kind, make_env, timeout_s))
    except BaseException:
        close_handles(handles)
        raise
    return handles


def close_handles(handles: list[EnvHandle]) -> None:
    for h in handles:
        try:
            h.close()
        except Exception:
            pass  # closing is best effort; the results are already collected


def _sync_loop(policy, handles, specs, sampling, progress, metadata) -> list[Trajectory]:
    env_desc = handles[0].describe()
    results: list[Trajectory | None] = [None] * len(specs)
    queue = list(enumerate(specs))[::-1]
    live: dict[int, tuple[int, _Live]] = {}
    bar = tqdm(total=len(specs), desc="episodes", disable=not progress, leave=False)

    def finish(idx: int, traj: Trajectory) -> None:
        results[idx] = traj
        bar.update(1)

    _fill(handles, list(range(len(handles))), queue, live, env_desc, metadata, finish)
    while live:
        slots = sorted(live)
        utts = act_checked(policy, [live[s][1].conv for s in slots], sampling)
        for s, utt in zip(slots, utts):  # every env steps at once; the barrier is the recv loop below
            handles[s].send("step", utt.text)
        freed = []
        for s, utt in zip(slots, utts):
            idx, ep = live[s]
            turn = make_turn(utt)
            if apply_step(ep, utt, turn, recv_result(handles[s])):
                finish(idx, end_episode(ep))
                del live[s]
                freed.append(s)
        _fill(handles, freed, queue, live, env_desc, metadata, finish)
    bar.close()
    return results  # type: ignore[return-value]


def _fill(handles, slots, queue, live, env_desc, metadata, finish) -> None:
    """Start the next queued episodes on the free ``slots`` (resets run in parallel)."""
    while slots and queue:
        batch = [(s, *queue.pop()) for s in slots[: len(queue)]]
        slots = slots[len(batch):]
        t0 = time.perf_counter()
        for s, _, spec in batch:
            handles[s].send("reset", reset_kwargs(spec))
        for s, idx, spec in batch:
            ep = begin_episode(spec, recv_result(handles[s]), env_desc, metadata, t0)
            if ep.traj.truncated:  # reset itself crashed: record it and give the slot the next spec
                finish(idx, ep.traj)
                slots.append(s)
            else:
                live[s] = (idx, ep)


# ----- one episode, shared by the sync and async loops --------------------------------------------
def act_checked(policy: Policy, convs: list[Conversation], sampling: SamplingParams | None) -> list:
    """``policy.act`` with the one-utterance-per-conversation contract checked."""
    utts = policy.act(convs, sampling)
    if len(utts) != len(convs):
        raise RuntimeError(f"policy returned {len(utts)} utterances for {len(convs)} conversations")
    return utts


def recv_result(handle: EnvHandle) -> Any:
    """The handle's answer, or the ``EnvCrashed`` it raised (the handle has restarted)."""
    try:
        return handle.recv()
    except EnvCrashed as e:
        return e


def reset_kwargs(spec: EpisodeSpec) -> dict[str, Any]:
    return {"seed": spec.seed, "options": {"task_id": spec.task_id} if spec.task_id is not None else None}


def begin_episode(spec: EpisodeSpec, result, env_desc: dict, metadata: dict | None, t0: float) -> _Live:
    """An episode from its reset's result ``(obs, info)``; truncated if the reset crashed."""
    meta = {"seed": spec.seed, **(metadata or {})}
    if isinstance(result, EnvCrashed):
        traj = Trajectory(str(spec.task_id), truncated=True, metadata={**meta, "error": str(result)})
        return _Live(spec, Conversation([]), traj, t0)
    obs, info = result
    meta["task_type"] = info.get("task_type", "default")
    meta["initial_state_key"] = info.get("state_key")  # GiGPO anchors the first action here
    traj = Trajectory(str(info.get("task_id", spec.task_id)), metadata=meta, initial_observation=list(obs))
    conv = Conversation(list(obs), env_desc["tools"], env_desc["tool_format"], info=info)
    return _Live(spec, conv, traj, t0)


def make_turn(utt) -> Turn:
    """A turn holding the policy's utterance (the env's answer is added by ``apply_step``)."""
    return Turn(
        action_text=utt.text,
        tool_calls=list(utt.tool_calls),
        prompt_ids=list(utt.prompt_ids),
        action_ids=list(utt.action_ids),
        action_logprobs=list(utt.logprobs),
    )


def apply_step(ep: _Live, utt, turn: Turn, result) -> bool:
    """Record one step's ``result`` (the env's 5-tuple or ``EnvCrashed``); True when the episode is over."""
    if isinstance(result, EnvCrashed):
        turn.info = {"action_valid": False, "error": str(result)}
        ep.traj.turns.append(turn)
        ep.traj.truncated = True
        ep.traj.metadata["error"] = str(result)
        return True
    obs, reward, terminated, truncated, info = result
    turn.observation, turn.reward, turn.info = list(obs), float(reward), info
    if info.get("tool_calls") is not None:
        turn.tool_calls = [ToolCall.from_dict(c) for c in info["tool_calls"]]
    ep.traj.turns.append(turn)
    ep.traj.outcome = float(info.get("outcome", ep.traj.outcome))
    ep.conv.messages.append(_assistant_message(utt, turn, ep.conv.tool_format))
    ep.conv.messages.extend(obs)
    ep.conv.info = info
    if terminated or truncated:
        ep.traj.terminated, ep.traj.truncated = bool(terminated), bool(truncated and not terminated)
        return True
    return False


def end_episode(ep: _Live) -> Trajectory:
    ep.traj.metadata["wall_s"] = time.perf_counter() - ep.t0
    return ep.traj


def _assistant_message(utt, turn: Turn, tool_format: str) -> Message:
    if tool_format == "openai" and turn.tool_calls:
        return Message("assistant", "", tool_calls=list(turn.tool_calls))
    return Message("assistant", utt.text)
