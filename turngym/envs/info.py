"""``EnvInfo``: what the rest of the house needs to know about an env, probed once per env id and
constructor kwargs (the split among them) and cached for the process.

A trainer needs the split's task ids, a policy the tools, their format and its stop strings, a
report the task groups. Each used to build a throwaway env of its own to read them (a TextWorld
env loads its game list, a SWE env its task files); ``env_info`` builds one per (id, kwargs) and
every later caller reads the cached facts.

    info = env_info("turngym/TextWorld-easy-v0", split="train", tool_format="xml")
    info.task_ids, info.tools, info.stop_strings
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

from turngym.tools.formats import format_stops
from turngym.types import ToolSpec

# kwargs that change how episodes run, not what the env is (its tasks and tools): left out of the probe
RUNTIME_KWARGS = ("max_turns",)


@dataclass(frozen=True)
class EnvInfo:
    """The facts of one env as made with one set of kwargs.

    Attributes:
        env_id: The registered id.
        kwargs: The constructor kwargs it was probed with (without ``RUNTIME_KWARGS``).
        task_ids: The split's tasks, in the env's order.
        tools: The tool specs a policy is shown.
        tool_format: The format calls are written in (``hermes``, ``xml``, ...; ``text`` without tools).
        stop_strings: What sampling stops at in that format (``tools.formats.format_stops``).
    """

    env_id: str
    kwargs: dict[str, Any] = field(compare=False)
    task_ids: tuple[str, ...]
    tools: tuple[ToolSpec, ...]
    tool_format: str
    stop_strings: tuple[str, ...]


_CACHE: dict[str, EnvInfo] = {}
_GROUPS: dict[str, dict[str, str]] = {}
_LOCK = threading.Lock()


def _key(env_id: str, kwargs: dict[str, Any]) -> str:
    return env_id + json.dumps(kwargs, sort_keys=True, default=repr)


def _probe_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in kwargs.items() if k not in RUNTIME_KWARGS}


def env_info(env_id: str, **kwargs: Any) -> EnvInfo:
    """The cached ``EnvInfo`` of ``turngym.make(env_id, **kwargs)`` (built on the first call).

    Raises:
        Whatever making the env raises (an unknown id, missing task data, a missing package).
    """
    kwargs = _probe_kwargs(kwargs)
    key = _key(env_id, kwargs)
    with _LOCK:
        if key not in _CACHE:
            _CACHE[key] = _probe(env_id, kwargs)
        return _CACHE[key]


def _probe(env_id: str, kwargs: dict[str, Any]) -> EnvInfo:
    from turngym.envs.registry import make

    env = make(env_id, **kwargs)
    try:
        base = env.unwrapped
        tools = tuple(base.tools.specs) if getattr(base, "tools", None) is not None else ()
        fmt = base.format.name if getattr(base, "format", None) is not None else "text"
        return EnvInfo(env_id, dict(kwargs), tuple(str(t) for t in getattr(base, "task_ids", [])), tools, fmt,
                       tuple(format_stops(fmt, list(tools))))
    finally:
        env.close()


def task_groups(env_id: str, **kwargs: Any) -> dict[str, str]:
    """Report group of every task of a split: the env's ``task_group`` (e.g. TextWorld's level) when
    it has one, else its ``task_type``. Cached like ``env_info`` (some envs load a task to type it)."""
    kwargs = _probe_kwargs(kwargs)
    key = _key(env_id, kwargs)
    with _LOCK:
        if key not in _GROUPS:
            from turngym.envs.registry import make

            env = make(env_id, **kwargs)
            try:
                base = env.unwrapped
                group = getattr(base, "task_group", base.task_type)
                _GROUPS[key] = {tid: str(group(tid)) for tid in base.task_ids}
            finally:
                env.close()
        return dict(_GROUPS[key])


def check_reset(env_id: str, task_id: str, seed: int, **kwargs: Any) -> None:
    """Reset one task once and close the env: whether the env can run here at all (its data, its
    sandbox backend, its optional packages). Not cached: a backend can come and go.

    Raises:
        Whatever making or resetting the env raises.
    """
    from turngym.envs.registry import make

    env = make(env_id, **_probe_kwargs(kwargs))
    try:
        env.reset(seed=seed, options={"task_id": task_id})
    finally:
        env.close()


@dataclass(frozen=True)
class Opening:
    """How a task opens: ``digest`` hashes its reset observation under seed 0 and the oracle's first
    move; ``oracle`` says whether there is one."""

    digest: str
    oracle: bool


def task_openings(env_id: str, task_ids: list[str], budget_s: float = float("inf"), **kwargs: Any) -> dict[str, Opening]:
    """Reset each task once (seed 0, ``scripted_hints=True``) and hash its opening, in order until
    ``budget_s`` seconds are spent; the first task always. Not cached: it is asked once per check.

    Raises:
        Whatever making or resetting the env raises.
    """
    import hashlib
    import time

    from turngym.envs.registry import make

    env = make(env_id, **{**_probe_kwargs(kwargs), "scripted_hints": True})
    out: dict[str, Opening] = {}
    deadline = time.perf_counter() + budget_s
    try:
        for tid in task_ids:
            if out and time.perf_counter() > deadline:
                break
            obs, info = env.reset(seed=0, options={"task_id": tid})
            oracle = info.get("oracle_action")
            text = repr([(m.role, m.content) for m in obs]) + repr(oracle)
            out[tid] = Opening(hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest(), oracle is not None)
    finally:
        env.close()
    return out


def task_content_keys(env_id: str, task_ids: list[str], **kwargs: Any) -> dict[str, set[str]] | None:
    """Each task's ``content_keys`` (what a held-out task may share with no training task: an SQL
    task's tables, a SWE task's bug template and package), or None when the env defines none. No
    reset: the env computes them from the task. Not cached: it is asked once per check.

    Raises:
        Whatever making the env raises.
    """
    from turngym.envs.registry import make

    env = make(env_id, **_probe_kwargs(kwargs))
    try:
        keys = getattr(env.unwrapped, "content_keys", None)
        return None if keys is None else {t: set(keys(t)) for t in task_ids}
    finally:
        env.close()


def clear_env_info() -> None:
    """Forget every cached probe (an env whose tasks changed on disk, e.g. newly generated games)."""
    with _LOCK:
        _CACHE.clear()
        _GROUPS.clear()
