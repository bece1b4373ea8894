"""One episode, step by step: what the sync and async rollout loops share.

An episode is a ``Live`` record (its spec, the conversation the policy sees, the trajectory being
recorded). ``begin_episode`` opens it from the env's reset, ``make_turn`` + ``apply_step`` record
one policy utterance and the env's answer (tool calls come from the env's own parse: it is the
record), ``end_episode`` closes it. A crashed env (``EnvCrashed``) ends the episode as truncated
with the error in its metadata, so no episode is lost.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any

from turngym.agents.base import Conversation, Policy, SamplingParams
from turngym.clock import CLOCK
from turngym.rollout.handles import EnvCrashed, EnvHandle, handle_kind, make_handle
from turngym.types import RECORD_KEY, Message, TokenRecord, ToolCall, Trajectory, Turn, Utterance


@dataclass(frozen=True)
class EpisodeSpec:
    """Which episode to play: a task and the reset seed (same pair => same episode start).

    ``greedy`` plays it at temperature 0 whatever the rollout's sampling (a group's greedy anchor,
    see ``OnlineConfig.greedy_in_group``); the trajectory's metadata records it.

    A branch of an earlier episode, ``parent`` (same task and seed), replays the parent's first
    ``replay_turns`` turns exactly as they were recorded (text and token ids, read from its
    ``TokenRecord``), then plays ``reply`` (an alternative reply for the next turn) if one is given,
    then lets the policy play; ``free_turns`` > 0 stops it after that many policy turns (truncated).
    With ``keep_cache``, an episode that fails keeps its conversation's KV cache on the trajectory
    (``Trajectory.cache``, where the policy can give one), for branch search to score its turns from.
    The branch's record shares the parent's prefix. The sync rollout plays branches; the env must
    reset deterministically (the contract), and a replay that sees a different observation than the
    recording ends the episode with ``metadata["error"]``.
    """

    task_id: str | None
    seed: int
    greedy: bool = False
    parent: Trajectory | None = field(default=None, compare=False)
    replay_turns: int = 0
    reply: Utterance | None = field(default=None, compare=False)
    free_turns: int = 0
    keep_cache: bool = False

    @property
    def prefix_len(self) -> int:
        """How many turns are replayed before the policy plays (the parent's, then ``reply``)."""
        return self.replay_turns + (self.reply is not None)


class ReplayDiverged(RuntimeError):
    """A branch's replayed prefix met a different conversation than the one recorded."""


def replay_utterance(policy: Policy, conv: Conversation, spec: EpisodeSpec, k: int) -> Utterance:
    """Turn ``k`` of a branch's prefix as ``conv``'s next utterance: the parent's recorded turn (or,
    at ``spec.replay_turns``, the branch's own ``reply``). The conversation's record grows by the
    recorded ids, as if the policy had sampled them again (nothing is re-tokenized).

    Raises:
        ValueError: the policy keeps no token record (scripted and HTTP agents cannot replay).
        ReplayDiverged: the prompt the policy would see differs from the recorded one.
    """
    chat = getattr(policy, "chat", None)
    if chat is None or not hasattr(chat, "record"):
        raise ValueError(f"{type(policy).__name__} keeps no token record; branches need an HF or vLLM policy")
    parent = spec.parent
    prompt = chat.prompt_ids(conv)
    want = parent.prompt_ids(k) if parent is not None and k < len(parent.turns) else []
    if want and prompt != want:
        raise ReplayDiverged("the replayed prefix reached a different prompt than the recorded episode")
    if k < spec.replay_turns:
        text, ids, lps = parent.turns[k].action_text, parent.action_ids(k), parent.action_logprobs(k)
    else:
        text, ids, lps = spec.reply.text, list(spec.reply.action_ids), list(spec.reply.logprobs)
        if spec.reply.cache is not None and hasattr(policy, "resume"):
            policy.resume(conv, spec.reply.cache)  # the replayed prompt's keys and values, computed once already
    span = chat.record(conv, ids, lps)
    return Utterance(text, ids, lps, span=span, record=chat.state(conv).record)


def branch_of(traj: Trajectory, spec: EpisodeSpec, turns: int, **kw: Any) -> EpisodeSpec:
    """A spec that replays the first ``turns`` turns of ``traj`` (played from ``spec``), then plays on."""
    return EpisodeSpec(spec.task_id, spec.seed, parent=traj, replay_turns=turns, **kw)


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
class Live:
    spec: EpisodeSpec
    conv: Conversation
    traj: Trajectory
    t0: float


def open_handles(workers: bool | str, make_env, n: int, timeout_s: float) -> list[EnvHandle]:
    """``n`` env handles of the kind ``workers`` names (closed again if one fails to open)."""
    kind = handle_kind(workers)
    handles: list[EnvHandle] = []
    try:
        with CLOCK.kind("env_startup"):
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


def act_checked(policy: Policy, convs: list[Conversation], sampling: SamplingParams | None) -> list:
    """``policy.act`` with the one-utterance-per-conversation contract checked."""
    with CLOCK.kind("generation"):
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


def begin_episode(spec: EpisodeSpec, result, env_desc: dict, metadata: dict | None, t0: float) -> Live:
    """An episode from its reset's result ``(obs, info)``; truncated if the reset crashed."""
    meta = {"seed": spec.seed, **({"greedy": True} if spec.greedy else {}), **(metadata or {})}
    if spec.prefix_len:
        meta["branch_at"] = spec.prefix_len  # the turns before it replay an earlier episode
    if isinstance(result, EnvCrashed):
        traj = Trajectory(str(spec.task_id), truncated=True, metadata={**meta, "error": str(result)})
        return Live(spec, Conversation([]), traj, t0)
    obs, info = result
    meta["task_type"] = info.get("task_type", "default")
    meta["initial_state_key"] = info.get("state_key")  # where the episode starts (state-novelty shaping)
    traj = Trajectory(str(info.get("task_id", spec.task_id)), metadata=meta, initial_observation=list(obs))
    conv = Conversation(list(obs), env_desc["tools"], env_desc["tool_format"], info=info)
    return Live(spec, conv, traj, t0)


def make_turn(utt) -> Turn:
    """A turn holding the policy's utterance and its span in the episode's record (the env's answer
    is added by ``apply_step``)."""
    return Turn(action_text=utt.text, span=getattr(utt, "span", None))


def apply_step(ep: Live, utt, turn: Turn, result) -> bool:
    """Record one step's ``result`` (the env's 5-tuple or ``EnvCrashed``); True when the episode is over.

    ``turn.info["anchor_state_key"]`` is the state the action was taken from (the env's state key
    after the previous step or the reset): GiGPO groups steps by it.
    """
    anchor = ep.conv.info.get("state_key")
    if isinstance(result, EnvCrashed):
        turn.info = {"action_valid": False, "error": str(result), "anchor_state_key": anchor}
        ep.traj.turns.append(turn)
        ep.traj.truncated = True
        ep.traj.metadata["error"] = str(result)
        return True
    obs, reward, terminated, truncated, info = result
    turn.observation, turn.reward, turn.info = list(obs), float(reward), {**info, "anchor_state_key": anchor}
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


def branch_over(ep: Live) -> bool:
    """After a step: whether a branch ends here. A replay that reached a different env state than
    its recording ends with ``metadata["error"]``; a branch whose new reply (a recorded turn marked
    ``reply``) the env refused or that changed nothing ends truncated (it would only replay its root);
    so does one whose ``free_turns`` are played."""
    k, spec = len(ep.traj.turns), ep.spec
    if 0 < k <= spec.replay_turns:
        want = spec.parent.turns[k - 1].info.get("state_key")
        if want is not None and ep.traj.turns[-1].info.get("state_key") != want:
            ep.traj.truncated = True
            ep.traj.metadata["error"] = "the replayed prefix reached a different env state than the recording"
            return True
    if spec.reply is not None and k == spec.replay_turns + 1 and not moved(ep.traj, k - 1):
        ep.traj.truncated = True
        ep.traj.metadata["stopped"] = "branch_no_op"
        return True
    if spec.free_turns and k - spec.prefix_len >= spec.free_turns:
        ep.traj.truncated = True
        ep.traj.metadata["stopped"] = "free_turns"
        return True
    return False


def moved(traj: Trajectory, j: int) -> bool:
    """Whether turn ``j`` was accepted and changed the env state (``True`` without state keys)."""
    turn = traj.turns[j]
    if not turn.action_valid:
        return False
    before = traj.metadata.get("initial_state_key") if j == 0 else traj.turns[j - 1].info.get("state_key")
    return before is None or turn.info.get("state_key") != before


def end_episode(ep: Live, policy: Policy | None = None) -> Trajectory:
    """The finished trajectory, holding the episode's token record (when the policy keeps one) and,
    for a failed ``keep_cache`` episode, the conversation's KV cache (``policy.final_cache``)."""
    ep.traj.metadata["wall_s"] = time.perf_counter() - ep.t0
    record = ep.conv.state.get(RECORD_KEY)
    if isinstance(record, TokenRecord):
        ep.traj.record = record
    if ep.spec.keep_cache and not ep.traj.success and hasattr(policy, "final_cache"):
        ep.traj.cache = policy.final_cache(ep.conv)
    return ep.traj


def _assistant_message(utt, turn: Turn, tool_format: str) -> Message:
    if tool_format == "openai" and turn.tool_calls:
        return Message("assistant", "", tool_calls=list(turn.tool_calls))
    return Message("assistant", utt.text)
