"""Evaluate one agent on one env: roll out N episodes, summarise, write JSON."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turngym.agents.base import Policy, SamplingParams
from turngym.bench.metrics import summarize
from turngym.rollout import Collector, EnvTarget, episode_specs
from turngym.types import Trajectory


@dataclass
class EvalResult:
    env_id: str
    agent: str
    summary: dict
    trajectories: list[Trajectory]
    config: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "env_id": self.env_id,
            "agent": self.agent,
            "config": self.config,
            "summary": self.summary,
            "trajectories": [t.to_dict() for t in self.trajectories],
        }

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_dict()))
        tmp.replace(path)
        return path


def evaluate(
    env_id: str,
    policy: Policy,
    *,
    agent_name: str = "",
    episodes: int = 20,
    seed: int = 0,
    env_kwargs: dict[str, Any] | None = None,
    sampling: SamplingParams | None = None,
    num_envs: int = 8,
    workers: bool = False,
    max_turns: int | None = None,
    max_state_visits: int = 0,
    progress: bool | str = True,
    distinct: bool = False,
    collector: Collector | None = None,
) -> EvalResult:
    """Play ``episodes`` episodes of ``env_id`` with ``policy``, cycling over the split's tasks.

    Args:
        env_kwargs: Constructor overrides (e.g. ``{"split": "test"}``); the policy's own
            ``env_kwargs`` (scripted hints) are added on top.
        max_turns: Override the env's registered turn limit.
        max_state_visits: End (truncate) an episode that reaches one env state this many times, as
            training does (0 = off).
        distinct: Refuse to cycle: a held-out claim counts games, and a deterministic game replayed
            under another reset seed is the same game again (its CI would shrink for nothing).
        collector: The run's ``Collector``: its envs stay open for the next evaluation (and its
            training). Default: envs opened here and closed on return.

    Returns:
        An ``EvalResult`` with the summary (success and its 95% CI, per task type) and trajectories.

    Raises:
        ValueError: ``distinct`` and the split has fewer tasks than ``episodes``.
    """
    if hasattr(policy, "invalidate_caches"):  # e.g. a packed bf16 copy made before the last weight update
        policy.invalidate_caches()
    kwargs = {**(env_kwargs or {}), **getattr(policy, "env_kwargs", {})}
    limit = kwargs.pop("max_turns", None) if max_turns is None else max_turns
    kwargs.pop("max_turns", None)
    env = EnvTarget(env_id, kwargs, max_turns=limit, max_state_visits=max_state_visits)
    task_ids = list(env.info.task_ids)
    if distinct and episodes > len(task_ids):
        raise ValueError(f"{env_id} {kwargs.get('split', '')!r} has {len(task_ids)} tasks, fewer than the {episodes} "
                         f"distinct held-out games asked for; generate more (e.g. env_kwargs num_games) or ask for fewer")
    specs = episode_specs(task_ids, episodes, seed=seed)
    t0 = time.perf_counter()
    play = dict(num_envs=num_envs, policy=policy, metadata={"env_id": env_id, "agent": agent_name}, progress=progress)
    if collector is not None:
        trajs = collector.play(env, specs, sampling, **play)
    else:
        with Collector(policy, workers=workers) as own:
            trajs = own.play(env, specs, sampling, pooled=False, **play)
    summary = summarize(trajs)
    summary["wall_s"] = time.perf_counter() - t0
    config = {"episodes": episodes, "seed": seed, "env_kwargs": env_kwargs or {}, "max_turns": max_turns,
              "max_state_visits": max_state_visits}
    return EvalResult(env_id, agent_name, summary, trajs, config)
