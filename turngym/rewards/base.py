"""Reward transforms: trajectories in, one reward per turn out.

A transform sees a whole batch of trajectories (group-aware and learned transforms need that) and
returns, for each trajectory, one float per turn. Transforms compose by summing (``Sum``);
transforms that reshape others (gating, progress attribution) wrap them.

Specs (what ``OnlineConfig.reward`` holds) are built by ``make_reward``:

    "outcome"                                     a registered name, default parameters
    {"name": "outcome", "scale": 2.0}             a name with parameters
    {"name": "shaped", "weight": 0.5}             ``weight`` scales any transform
    ["outcome", {"name": "format", ...}]          a list: the per-turn sum
    {"name": "gated", "tau": 1.0, "step": ["shaped"]}   wrappers take nested specs

Logging: a transform may keep ``stats`` (a dict of ``reward/...`` metrics about its last call);
``reward_stats(transform)`` gathers them through ``Sum``/``Scale`` and wrappers, for a trainer or a
script to log next to its own metrics.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol, Sequence

from turngym.types import Trajectory

PerTurn = list[list[float]]
Spec = Any  # str | Mapping | Sequence of those | a RewardTransform


class RewardTransform(Protocol):
    """``transform(trajectories) -> per-turn rewards`` (same shape as the turns)."""

    def __call__(self, trajectories: Sequence[Trajectory]) -> PerTurn: ...


class EnvReward:
    """The env's own per-step rewards, as recorded in each turn."""

    def __call__(self, trajectories: Sequence[Trajectory]) -> PerTurn:
        return [[float(t.reward) for t in traj.turns] for traj in trajectories]


class OutcomeReward:
    """The episode outcome (success / score), paid at the last turn; 0 elsewhere."""

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale

    def __call__(self, trajectories: Sequence[Trajectory]) -> PerTurn:
        out = []
        for traj in trajectories:
            r = [0.0] * len(traj.turns)
            if r:
                r[-1] = self.scale * float(traj.outcome)
            out.append(r)
        return out


class Sum:
    """Per-turn sum of several transforms."""

    def __init__(self, *parts: RewardTransform) -> None:
        self.parts = parts

    def __call__(self, trajectories: Sequence[Trajectory]) -> PerTurn:
        outs = [p(trajectories) for p in self.parts]
        return [[sum(o[i][k] for o in outs) for k in range(len(traj.turns))] for i, traj in enumerate(trajectories)]

    def children(self) -> list[RewardTransform]:
        return list(self.parts)


class Scale:
    """``weight`` times another transform (what a spec's ``"weight"`` key builds)."""

    def __init__(self, inner: RewardTransform, weight: float) -> None:
        self.inner, self.weight = inner, float(weight)

    def __call__(self, trajectories: Sequence[Trajectory]) -> PerTurn:
        return [[self.weight * x for x in row] for row in self.inner(trajectories)]

    def children(self) -> list[RewardTransform]:
        return [self.inner]


_REWARDS: dict[str, Callable[..., RewardTransform]] = {"env": EnvReward, "outcome": OutcomeReward}


def register_reward(name: str, factory: Callable[..., RewardTransform]) -> None:
    """Make ``make_reward(name)`` build ``factory()`` and ``make_reward({"name": name, **kw})``
    build ``factory(**kw)``."""
    _REWARDS[name] = factory


def available_rewards() -> list[str]:
    return sorted(_REWARDS)


def make_reward(spec: Spec) -> RewardTransform:
    """Build a transform from a spec (see the module docstring for the grammar).

    Args:
        spec: A registered name, a ``{"name": ..., **params}`` mapping (``weight`` scales it), a
            list of those (summed), or an already-built transform (returned as it is).

    Returns:
        The transform.

    Raises:
        ValueError: an unknown name, a mapping without ``name``, an empty list, or parameters
            the named transform does not take.
    """
    if isinstance(spec, (str, Mapping)):
        return _make_one(spec)
    if isinstance(spec, Sequence):
        parts = [_make_one(s) for s in spec]
        if not parts:
            raise ValueError("an empty reward list: name at least one transform, e.g. ['outcome']")
        return parts[0] if len(parts) == 1 else Sum(*parts)
    if callable(spec):
        return spec
    raise ValueError(f"a reward spec is a name, a mapping or a list, got {type(spec).__name__}")


def _make_one(spec: Spec) -> RewardTransform:
    if isinstance(spec, str):
        name, params = spec, {}
    elif isinstance(spec, Mapping):
        if "name" not in spec:
            raise ValueError(f"reward spec {dict(spec)!r} has no 'name'; choose from {available_rewards()}")
        params = {k: v for k, v in spec.items() if k != "name"}
        name = spec["name"]
    elif callable(spec):
        return spec
    else:
        raise ValueError(f"a reward spec is a name or a mapping, got {type(spec).__name__}")
    if name not in _REWARDS:
        raise ValueError(f"unknown reward {name!r}; choose from {available_rewards()}")
    weight = params.pop("weight", None)
    try:
        transform = _REWARDS[name](**params)
    except TypeError as e:  # a misspelt parameter should name the transform, not a constructor
        raise ValueError(f"reward {name!r}: bad parameters {sorted(params)}: {e}") from e
    return transform if weight is None else Scale(transform, weight)


def walk(transform: Any) -> list[Any]:
    """``transform`` and every transform inside it (through ``Sum``, ``Scale`` and wrappers)."""
    out, stack = [], [transform]
    while stack:
        t = stack.pop()
        out.append(t)
        children = getattr(t, "children", None)
        if callable(children):
            stack.extend(children())
    return out


def reward_stats(transform: Any) -> dict[str, float]:
    """The ``stats`` of ``transform`` and of every transform inside it (from its last call)."""
    out: dict[str, float] = {}
    for t in walk(transform):
        out.update(getattr(t, "stats", None) or {})
    return out


def bind_policy(transform: Any, model: Any) -> int:
    """Give every transform that reads the policy's features (``wants_policy``, e.g. SPA with
    ``encoder=policy``) the frozen ``model``; returns how many there were."""
    readers = [t for t in walk(transform) if getattr(t, "wants_policy", False)]
    for t in readers:
        t.bind_policy(model)
    return len(readers)


def wants_policy(transform: Any) -> bool:
    return any(getattr(t, "wants_policy", False) for t in walk(transform))


def _stateful(transform: Any, path: str = "0") -> list[tuple[str, Any]]:
    """``(path, transform)`` for every transform with a ``state_dict``, in a fixed tree order."""
    found = [(path, transform)] if callable(getattr(transform, "state_dict", None)) else []
    children = getattr(transform, "children", None)
    for i, child in enumerate(children() if callable(children) else []):
        found += _stateful(child, f"{path}/{i}")
    return found


def reward_state_dict(transform: Any) -> dict[str, Any]:
    """The state of every learned transform inside ``transform`` (e.g. SPA's estimator), keyed by
    its position in the tree, for a trainer's checkpoint. Empty when nothing is learned."""
    return {path: t.state_dict() for path, t in _stateful(transform)}


def load_reward_state_dict(transform: Any, state: dict[str, Any]) -> None:
    """Restore what ``reward_state_dict`` saved into a transform built from the same spec.

    Raises:
        ValueError: the saved state does not match the transform's learned parts.
    """
    parts = dict(_stateful(transform))
    if set(parts) != set(state):
        raise ValueError(f"reward state has parts {sorted(state)} but the transform has {sorted(parts)}")
    for path, t in parts.items():
        t.load_state_dict(state[path])
