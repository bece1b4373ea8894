"""turngym envs in SkyRL's ``skyrl_gym`` registry (``pip install "turngym[skyrl]"``).

Importing this module registers every turngym id (``turngym.list_envs()``) with ``skyrl_gym``
under the same id, as a ``BaseTextEnv``. SkyRL's generator then runs it like its own envs:

- ``skyrl_gym.make(env_class, env_config=cfg, extras=row)``: ``cfg`` (the trainer's
  ``skyrl_gym.<env id>`` section) holds env constructor overrides (``split``, ``tool_format``,
  ...); the dataset row's ``task_id`` (top level or in ``extra_info``) and ``seed`` pick the task.
- ``init(prompt)`` resets the env and returns its opening messages (``task_rows`` writes the same
  messages as each row's prompt).
- ``step(model_output)`` is one ``env.step`` on the raw text, parsed by the env's own tool format:
  a malformed reply is the env's error observation, never an exception.

The turn limit is the smaller of the env's registered one and SkyRL's ``generator.max_turns``
(which SkyRL passes as ``extras["max_turns"]``).
"""

from __future__ import annotations

import json
from typing import Any

from turngym.envs.registry import list_envs, make
from turngym.integrations.session import registered_spec, require
from turngym.types import Message, action_valid

skyrl_gym = require("skyrl_gym", "skyrl", "turngym.integrations.skyrl")

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput  # noqa: E402

ENTRY_POINT = "turngym.integrations.skyrl:TurngymTextEnv"


class TurngymTextEnv(BaseTextEnv):
    """A turngym env behind SkyRL's text-in / text-out ``BaseTextEnv`` contract.

    Args:
        env_config: Env constructor overrides (a dict or an OmegaConf ``DictConfig``).
        extras: The dataset row: ``task_id`` (or ``extra_info.task_id``), ``seed``, ``max_turns``.
        env_id: The turngym id (set by the registration).
    """

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None, *, env_id: str) -> None:
        super().__init__()
        extras = dict(extras or {})
        info = dict(extras.get("extra_info") or {})
        self.task_id = extras.get("task_id", info.get("task_id"))
        self.seed = extras.get("seed", info.get("seed"))
        limits = [n for n in (registered_spec(env_id).max_episode_steps, extras.get("max_turns")) if n]
        self.max_turns = int(min(limits)) if limits else None
        self.turngym_env = make(env_id, max_turns=self.max_turns, **dict(env_config or {}))
        self.env_id = env_id
        self.done = False
        self.episode_return = 0.0
        self.invalid_actions = 0

    def init(self, prompt: list[dict[str, str]] | None = None) -> tuple[list[dict[str, str]], dict[str, Any]]:
        """Reset the env on the row's task; returns its opening messages and the task's metadata.

        The row's own prompt is not used: the env writes the opening (``task_rows`` stores the same).
        """
        options = {"task_id": str(self.task_id)} if self.task_id is not None else None
        obs, info = self.turngym_env.reset(seed=self.seed, options=options)
        self.turns, self.done, self.episode_return, self.invalid_actions = 0, False, 0.0, 0
        self.task_id = info["task_id"]
        return as_chat(obs), {"task_id": info["task_id"], "task_type": info.get("task_type", "default")}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """One ``env.step`` on the model's raw reply; after the end, an empty ``done`` step."""
        if self.done:
            return BaseTextEnvStepOutput(observations=[], reward=0.0, done=True,
                                         metadata={"error": "the episode is over"}, postprocessed_action=None)
        obs, reward, terminated, truncated, info = self.turngym_env.step(action)
        self.turns += 1
        self.done = bool(terminated or truncated)
        self.episode_return += float(reward)
        self.invalid_actions += not action_valid(info)
        meta = {k: info[k] for k in ("action_valid", "state_key", "outcome", "truncated_reason") if k in info}
        meta.update(task_id=self.task_id, terminated=bool(terminated), truncated=bool(truncated))
        return BaseTextEnvStepOutput(observations=as_chat(obs), reward=float(reward), done=self.done,
                                     metadata=json.loads(json.dumps(meta, default=str)), postprocessed_action=None)

    def get_metrics(self) -> dict[str, Any]:
        return {"outcome": float(self.turngym_env.unwrapped.outcome()), "return": self.episode_return,
                "turns": self.turns, "invalid_actions": self.invalid_actions}

    def close(self) -> None:
        self.turngym_env.close()


def as_chat(messages: list[Message]) -> list[dict[str, str]]:
    """turngym messages as SkyRL's chat messages (role and content)."""
    return [{"role": m.role, "content": m.content} for m in messages]


def register_envs(env_ids: list[str] | None = None) -> list[str]:
    """Register turngym ids with ``skyrl_gym`` (all of ``turngym.list_envs()`` by default).

    Ids already in SkyRL's registry are left alone, so calling this again (or after registering your
    own turngym envs) is safe.

    Returns:
        The ids newly registered.
    """
    new = []
    for env_id in env_ids if env_ids is not None else list(list_envs()):
        if env_id not in skyrl_gym.registry:
            skyrl_gym.register(id=env_id, entry_point=ENTRY_POINT, kwargs={"env_id": env_id})
            new.append(env_id)
    return new


def task_rows(env_id: str, **env_kwargs: Any) -> list[dict[str, Any]]:
    """SkyRL dataset rows, one per task of the env's split: ``prompt`` (the task's opening
    messages), ``env_class`` (the id), ``task_id`` and ``data_source``.

    Args:
        env_id: A registered id.
        **env_kwargs: Constructor overrides; use the same as in the trainer's ``skyrl_gym`` config.
    """
    env = make(env_id, **env_kwargs)
    rows = []
    for task_id in env.unwrapped.task_ids:
        obs, _ = env.reset(options={"task_id": task_id})
        rows.append({"prompt": as_chat(obs), "env_class": env_id, "task_id": str(task_id), "data_source": env_id})
    env.close()
    return rows


register_envs()
