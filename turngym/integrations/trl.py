"""turngym envs for TRL's ``GRPOTrainer(environment_factory=...)`` (``pip install "turngym[trl]"``).

TRL 1.16's contract (``trl/trainer/grpo_trainer.py``), which this module follows:

- ``environment_factory`` is a no-argument callable returning an env object; TRL builds one per
  rollout and reuses it across batches.
- Every public function defined on the object's *class*, other than ``reset`` and
  ``get_reward``, is a tool. TRL renders it from its name, type hints and Google-style docstring
  (``transformers.utils.get_json_schema``) and calls it as ``method(**arguments)`` with the
  arguments the model wrote. Its return value, as text, is the tool message the model sees next.
- ``reset(**row)`` gets the dataset row (``prompt``, ``task_id``, ... but not ``environment``);
  the text it returns is appended to the row's last user message.
- ``get_reward()`` is called once per finished rollout; its value is logged under
  ``rewards/<class name>`` and enters the GRPO advantage with weight 1.
- A dict of factories and an ``environment`` column mix envs in one run.

Here each tool method is one ``env.step`` (see ``turngym.integrations.session``): the env's turn
limit, validation, error observations and grading are unchanged, and a malformed call is the env's
error observation, never an exception.
"""

from __future__ import annotations

import inspect
import re
from typing import Any, Callable, Literal

from turngym.envs.info import env_info
from turngym.envs.registry import make
from turngym.integrations.session import ToolCallSession, join, require
from turngym.types import ToolSpec

require("trl", "trl", "turngym.integrations.trl")

RESERVED = ("reset", "get_reward")
JSON_TYPES: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list, "object": dict}


class TurngymTRLEnv:
    """One rollout's env for TRL. Tool methods are added per env id by ``environment_factory``.

    Public attributes (not callables, so TRL does not mistake them for tools):
        session: The ``ToolCallSession`` (``session.turn`` tool calls so far, ``session.episode_return``,
            ``session.outcome``, ``session.task_id``).
        reward_kind: ``"return"`` (sum of the env's step rewards) or ``"outcome"`` (1.0 = solved).
    """

    def __init__(self, session: ToolCallSession, reward: str = "return") -> None:
        self.session = session
        self.reward_kind = reward

    def reset(self, **row: Any) -> str:
        """Start an episode on ``row["task_id"]`` (and ``row["seed"]``) and return its opening text.

        Raises:
            KeyError: the row's task id is not in the env's split.
        """
        return join(self.session.reset(row.get("task_id"), row.get("seed")))

    def get_reward(self) -> float:
        """The finished episode's reward, from the env."""
        if self.reward_kind == "outcome":
            return self.session.outcome
        return self.session.episode_return

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        return self.session.call(name, arguments).text


class _Factory:
    """The callable TRL gets: builds a session per rollout, and the env's class once."""

    def __init__(self, env_id: str, reward: str, max_turns: int | None, env_kwargs: dict[str, Any]) -> None:
        self.env_id, self.reward, self.max_turns, self.env_kwargs = env_id, reward, max_turns, env_kwargs
        self.env_class: type | None = None

    def __call__(self) -> TurngymTRLEnv:
        session = ToolCallSession(self.env_id, max_turns=self.max_turns, **self.env_kwargs)
        if self.env_class is None:
            self.env_class = env_class(self.env_id, session.specs)
        return self.env_class(session, self.reward)


def environment_factory(env_id: str, *, reward: str = "return", max_turns: int | None = None,
                        **env_kwargs: Any) -> Callable[[], TurngymTRLEnv]:
    """What ``GRPOTrainer(environment_factory=...)`` expects, for one turngym env.

    Args:
        env_id: A registered id, e.g. ``"turngym/Maze-v0"``.
        reward: ``"return"`` (the sum of the env's step rewards, its grading as is) or ``"outcome"``
            (the env's episode result, 1.0 = solved).
        max_turns: Override the env's registered turn limit (one tool call is one turn).
        **env_kwargs: Env constructor overrides (``split``, ``step_penalty``, ...).

    Returns:
        A no-argument callable; each call builds a fresh env whose class carries the env's tools
        as methods, plus ``reset`` and ``get_reward``.

    Raises:
        ValueError: ``reward`` is unknown, or ``tool_format`` is given.
    """
    if reward not in ("return", "outcome"):
        raise ValueError(f"reward must be 'return' or 'outcome', got {reward!r}")
    if "tool_format" in env_kwargs:
        raise ValueError("TRL parses the model's tool calls itself, so the env's tool_format is fixed; drop tool_format")
    return _Factory(env_id, reward, max_turns, dict(env_kwargs))


def task_dataset(env_id: str, *, environment: str | None = None, **env_kwargs: Any):
    """A ``datasets.Dataset`` with one row per task of the env's split, in the env's task order.

    Each row has an empty user ``prompt`` (``reset`` supplies the task's opening text) and its
    ``task_id``; with ``environment`` set, an ``environment`` column routes rows to a dict of
    factories. Concatenate several (``datasets.concatenate_datasets``) for a mix of envs.

    Args:
        env_id: A registered id.
        environment: The name of this env in a dict ``environment_factory``.
        **env_kwargs: Constructor overrides; pass the same ``split`` as to ``environment_factory``.
    """
    datasets = require("datasets", "trl", "task_dataset")
    task_ids = [str(t) for t in env_info(env_id, **env_kwargs).task_ids]  # probed once per id and kwargs
    rows: dict[str, list] = {"prompt": [[{"role": "user", "content": ""}] for _ in task_ids], "task_id": task_ids}
    if environment is not None:
        rows["environment"] = [environment] * len(task_ids)
    return datasets.Dataset.from_dict(rows)


def with_response_parser(tokenizer):
    """Give ``tokenizer`` the parser TRL needs to read tool calls from the model's output.

    TRL sets it for the chat templates it knows. A template that renders Hermes ``<tool_call>``
    blocks but is not one of them (turngym's bundled ChatML template, used by the embedded model)
    gets the parser TRL uses for Qwen2.5's template, which writes tool calls the same way.

    Returns:
        The same tokenizer.

    Raises:
        ValueError: the template neither is known to TRL nor renders ``<tool_call>`` blocks.
    """
    from trl.chat_template_utils import add_response_schema, qwen2_5_chat_template

    if getattr(tokenizer, "response_template", None) is not None or getattr(tokenizer, "response_schema", None) is not None:
        return tokenizer
    try:
        return add_response_schema(tokenizer)
    except ValueError:
        if "<tool_call>" not in (tokenizer.chat_template or ""):
            raise
    own = tokenizer.chat_template
    tokenizer.chat_template = qwen2_5_chat_template  # TRL picks the parser by the template's text
    try:
        add_response_schema(tokenizer)
    finally:
        tokenizer.chat_template = own
    return tokenizer


# ----- the env's tools as typed, documented methods ---------------------------------------------------
def env_class(env_id: str, specs: list[ToolSpec]) -> type:
    """A ``TurngymTRLEnv`` subclass with one method per tool spec.

    Raises:
        ValueError: a tool is named ``reset`` or ``get_reward``, or starts with ``_`` (TRL would
            not see it as a tool).
    """
    methods = {}
    for spec in specs:
        if spec.name in RESERVED or spec.name.startswith("_"):
            raise ValueError(f"{env_id} has a tool named {spec.name!r}, which TRL cannot expose as a tool method")
        methods[spec.name] = tool_method(spec)
    name = re.sub(r"\W", "_", env_id.rsplit("/", 1)[-1].rsplit(":", 1)[-1])
    return type(name, (TurngymTRLEnv,), {"__doc__": f"turngym env {env_id} for TRL.", **methods})


def tool_method(spec: ToolSpec) -> Callable[..., str]:
    """A method whose signature, type hints and docstring describe ``spec`` to TRL.

    It accepts any keyword arguments: whatever the model wrote goes to the env, which validates it
    against the spec and answers a bad call with an error observation.
    """
    def method(self: TurngymTRLEnv, **arguments: Any) -> str:
        return self._call(spec.name, arguments)

    props = spec.parameters.get("properties") or {}
    required = set(spec.parameters.get("required") or [])
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    hints: dict[str, Any] = {}
    for arg, schema in props.items():
        hints[arg] = type_hint(schema)
        default = inspect.Parameter.empty if arg in required else schema.get("default")
        params.append(inspect.Parameter(arg, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hints[arg]))
    method.__name__ = method.__qualname__ = spec.name
    method.__signature__ = inspect.Signature(params, return_annotation=str)
    method.__annotations__ = {**hints, "return": str}
    method.__doc__ = docstring(spec)
    return method


def type_hint(schema: dict[str, Any]) -> Any:
    """A Python type hint that ``get_json_schema`` turns back into (nearly) ``schema``."""
    enum = schema.get("enum")
    if enum and all(isinstance(v, (str, int, float, bool)) for v in enum):
        return Literal[tuple(enum)]
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    if kind == "array" and isinstance(schema.get("items"), dict) and schema["items"].get("type") in JSON_TYPES:
        return list[type_hint(schema["items"])]
    return JSON_TYPES.get(kind, Any)


def docstring(spec: ToolSpec) -> str:
    """A Google-style docstring: the tool's description, then one line per argument."""
    lines = [" ".join(spec.description.split()) or spec.name]
    props = spec.parameters.get("properties") or {}
    if props:
        lines += ["", "Args:"]
        lines += [f"    {arg}: {' '.join(str(s.get('description') or arg).split())}" for arg, s in props.items()]
    return "\n".join(lines)
