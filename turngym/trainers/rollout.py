"""Rollout: run a policy on many episodes and return Trajectories.

Up to ``num_envs`` episodes run at once; each loop asks the policy for one utterance per live
episode in a single batched ``act`` call, then steps each env. Envs live in this process or in
subprocess workers (``workers=True``) with a per-step timeout; an env that crashes or hangs is
restarted and its episode is kept, marked truncated, with the error in its metadata.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from turngym.agents.base import Conversation, Policy, SamplingParams
from turngym.trainers.workers import EnvCrashed, LocalEnv, SubprocessEnv
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
    workers: bool = False,
    step_timeout_s: float = 60.0,
    progress: bool = True,
    metadata: dict[str, Any] | None = None,
) -> list[Trajectory]:
    """Play every episode in ``specs`` with ``policy``.

    Args:
        policy: Anything with ``act(conversations, sampling) -> list[Utterance]``.
        make_env: Zero-argument env factory (see ``make_env_factory``); picklable if ``workers``.
        specs: Episodes to play, in order; results come back in the same order.
        sampling: Passed to ``policy.act``.
        num_envs: Episodes in flight at once (the policy's batch size).
        workers: Run each env in a subprocess with a per-step timeout.
        step_timeout_s: Limit for one reset/step in a worker.
        progress: Show a tqdm bar.
        metadata: Merged into every trajectory's metadata (e.g. env id, policy version).

    Returns:
        One Trajectory per spec.
    """
    if not specs:
        return []
    n = max(1, min(num_envs, len(specs)))
    handles = [SubprocessEnv(make_env, step_timeout_s) if workers else LocalEnv(make_env) for _ in range(n)]
    try:
        env_desc = handles[0].describe()
        results: list[Trajectory | None] = [None] * len(specs)
        queue = list(enumerate(specs))[::-1]
        live: dict[int, tuple[int, _Live]] = {}
        bar = tqdm(total=len(specs), desc="episodes", disable=not progress, leave=False)

        def start(slot: int) -> None:
            while queue:
                idx, spec = queue.pop()
                ep = _start_episode(handles[slot], spec, env_desc, metadata)
                if ep.traj.truncated:  # reset itself crashed: record it and move on
                    results[idx] = ep.traj
                    bar.update(1)
                    continue
                live[slot] = (idx, ep)
                return

        for slot in range(n):
            start(slot)
        while live:
            slots = sorted(live)
            utts = policy.act([live[s][1].conv for s in slots], sampling)
            if len(utts) != len(slots):
                raise RuntimeError(f"policy returned {len(utts)} utterances for {len(slots)} conversations")
            for slot, utt in zip(slots, utts):
                idx, ep = live[slot]
                if _advance(handles[slot], ep, utt):
                    ep.traj.metadata["wall_s"] = time.perf_counter() - ep.t0
                    results[idx] = ep.traj
                    del live[slot]
                    bar.update(1)
                    start(slot)
        bar.close()
        return results  # type: ignore[return-value]
    finally:
        for h in handles:
            try:
                h.close()
            except Exception:
                pass  # closing is best effort; the results are already collected


def _start_episode(handle, spec: EpisodeSpec, env_desc: dict, metadata: dict | None) -> _Live:
    meta = {"seed": spec.seed, **(metadata or {})}
    t0 = time.perf_counter()
    options = {"task_id": spec.task_id} if spec.task_id is not None else None
    try:
        obs, info = handle.reset(seed=spec.seed, options=options)
    except EnvCrashed as e:
        traj = Trajectory(str(spec.task_id), truncated=True, metadata={**meta, "error": str(e)})
        return _Live(spec, Conversation([]), traj, t0)
    meta["task_type"] = info.get("task_type", "default")
    meta["initial_state_key"] = info.get("state_key")  # GiGPO anchors the first action here
    traj = Trajectory(str(info.get("task_id", spec.task_id)), metadata=meta, initial_observation=list(obs))
    conv = Conversation(list(obs), env_desc["tools"], env_desc["tool_format"], info=info)
    return _Live(spec, conv, traj, t0)


def _advance(handle, ep: _Live, utt) -> bool:
    """Step one episode with the policy's utterance; True when the episode is over."""
    turn = Turn(
        action_text=utt.text,
        tool_calls=list(utt.tool_calls),
        prompt_ids=list(utt.prompt_ids),
        action_ids=list(utt.action_ids),
        action_logprobs=list(utt.logprobs),
    )
    try:
        obs, reward, terminated, truncated, info = handle.step(utt.text)
    except EnvCrashed as e:
        turn.info = {"action_valid": False, "error": str(e)}
        ep.traj.turns.append(turn)
        ep.traj.truncated = True
        ep.traj.metadata["error"] = str(e)
        return True
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


def _assistant_message(utt, turn: Turn, tool_format: str) -> Message:
    if tool_format == "openai" and turn.tool_calls:
        return Message("assistant", "", tool_calls=list(turn.tool_calls))
    return Message("assistant", utt.text)
