"""ArCHer's plug-ins: variants beside the paper, composed by name as reward transforms are.

    archer:
      plugins: [tree, {name: self_imitation, weight: 1.0}, {name: sibling_auc, gate: 0.6}]

or ``--set 'archer.plugins=[tree, clone_wins]'``. Each plug-in is a small file of this package with
its own config (the keys beside ``name``); ``turngym.trainers.archer`` imports them all, so the
registry is full once the package is imported. The core (``core.py``) calls the hooks below in
this order and names no plug-in:

- ``env_kwargs(kwargs)``: the training env's constructor kwargs (e.g. oracle labels on steps).
- ``setup(trainer)``: after the trainer's own setup.
- ``collect(trainer)``: ``(tree, metrics)`` to replace the paper's sampled episodes (the first
  plug-in that returns one wins), or None.
- ``on_turns(trainer, tree, turns, metrics)``: the iteration's turns, before the critic trains on
  them (probes that must score out of sample, the actor's memories).
- ``buffer_rows(trainer, tree, turns, rows)``: which of the turns go to the replay buffer.
- ``after_critic(trainer, tree, turns, metrics)``.
- ``actor_rows(trainer, metrics)``: ``(episodes, per-turn weights)`` for a weighted-likelihood actor,
  or None. When any plug-in gives rows, one weighted-likelihood update over all of them
  (``likelihood_update``) replaces the paper's policy gradient that iteration.
- ``state_dict()`` / ``load_state_dict(state)``: what the plug-in keeps across iterations (checkpointed).
"""

from __future__ import annotations

from dataclasses import asdict, is_dataclass
from typing import Any

import torch

from turngym.config import from_dict
from turngym.rollout.branching import Tree
from turngym.trainers.actor import actor_update
from turngym.trainers.sequences import pack_batch
from turngym.types import Trajectory


class Plugin:
    """A variant of ArCHer: override the hooks it needs (see the module docstring).

    Attributes:
        name: What ``plugins=[...]`` calls it.
        config: Its config dataclass (the keys beside ``name``), or None for a plug-in without knobs.
        needs: Plug-ins it reads from (``trainer.plugins.get(name)``), which must be listed too.
    """

    name = ""
    config: type | None = None
    needs: tuple[str, ...] = ()
    joins_only = False  # its actor rows join others' update, never make one alone (e.g. demonstrations)

    def __init__(self, cfg: Any = None) -> None:
        self.cfg = cfg

    @classmethod
    def check(cls, cfg: Any, archer: Any) -> None:
        """Raise ``ValueError`` naming the knob when this plug-in's config cannot run with ``archer``'s."""

    def env_kwargs(self, kwargs: dict) -> dict:
        return kwargs

    def setup(self, trainer: Any) -> None:
        pass

    def collect(self, trainer: Any) -> tuple[Tree, dict[str, float]] | None:
        return None

    def on_turns(self, trainer: Any, tree: Tree, turns: Any, metrics: dict) -> None:
        pass

    def buffer_rows(self, trainer: Any, tree: Tree, turns: Any, rows: list[int]) -> list[int]:
        return rows

    def after_critic(self, trainer: Any, tree: Tree, turns: Any, metrics: dict) -> None:
        pass

    def actor_rows(self, trainer: Any, metrics: dict) -> tuple[list[Trajectory], list[float]] | None:
        return None

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


_PLUGINS: dict[str, type[Plugin]] = {}


def register_plugin(cls: type[Plugin]) -> type[Plugin]:
    """Add a plug-in class to the registry (a class decorator).

    Raises:
        ValueError: another plug-in has its name.
    """
    if cls.name in _PLUGINS and _PLUGINS[cls.name] is not cls:
        raise ValueError(f"ArCHer plug-in {cls.name!r} is already registered")
    _PLUGINS[cls.name] = cls
    return cls


def plugin_names() -> list[str]:
    return list(_PLUGINS)


def _parse(spec: Any) -> tuple[type[Plugin], Any]:
    """A list entry (``name`` or ``{name: ..., knob: value}``) as its class and built config."""
    data = {"name": spec} if isinstance(spec, str) else dict(spec) if isinstance(spec, dict) else None
    if data is None or not isinstance(data.get("name"), str):
        raise ValueError(f"an ArCHer plug-in is a name or {{name: ..., knob: value}}, got {spec!r}")
    name = data.pop("name")
    if name not in _PLUGINS:
        raise ValueError(f"unknown ArCHer plug-in {name!r}; registered: {', '.join(plugin_names())}")
    cls = _PLUGINS[name]
    if cls.config is None:
        if data:
            raise ValueError(f"plug-in {name} has no knobs, got {sorted(data)}")
        return cls, None
    return cls, from_dict(cls.config, data, where=f"plugins.{name}.")


class Plugins:
    """The plug-ins of one run, in the order listed; calls each hook on every one."""

    def __init__(self, items: list[Plugin]) -> None:
        self.items = items
        self.by_name = {p.name: p for p in items}

    @staticmethod
    def check(specs: list, archer: Any) -> None:
        """Validate ``specs`` against the registry and ``archer``'s config, without building anything.

        Raises:
            ValueError: an unknown name or knob, a plug-in listed twice, one whose ``needs`` are
                missing, or a config the plug-in refuses.
        """
        parsed = [_parse(s) for s in specs]
        names = [cls.name for cls, _ in parsed]
        if len(set(names)) != len(names):
            raise ValueError(f"plugins lists a plug-in twice: {names}")
        for cls, cfg in parsed:
            missing = [n for n in cls.needs if n not in names]
            if missing:
                raise ValueError(f"plug-in {cls.name} needs {missing} in plugins too")
            cls.check(cfg, archer)

    @classmethod
    def build(cls, specs: list, archer: Any) -> Plugins:
        cls.check(specs, archer)
        return cls([klass(cfg) for klass, cfg in map(_parse, specs)])

    def get(self, name: str) -> Plugin | None:
        return self.by_name.get(name)

    def env_kwargs(self, kwargs: dict) -> dict:
        for p in self.items:
            kwargs = p.env_kwargs(kwargs)
        return kwargs

    def setup(self, trainer: Any) -> None:
        for p in self.items:
            p.setup(trainer)

    def collect(self, trainer: Any) -> tuple[Tree, dict[str, float]] | None:
        return next((out for p in self.items if (out := p.collect(trainer)) is not None), None)

    def on_turns(self, trainer: Any, tree: Tree, turns: Any, metrics: dict) -> None:
        for p in self.items:
            p.on_turns(trainer, tree, turns, metrics)

    def buffer_rows(self, trainer: Any, tree: Tree, turns: Any, rows: list[int]) -> list[int]:
        for p in self.items:
            rows = p.buffer_rows(trainer, tree, turns, rows)
        return rows

    def after_critic(self, trainer: Any, tree: Tree, turns: Any, metrics: dict) -> None:
        for p in self.items:
            p.after_critic(trainer, tree, turns, metrics)

    def update_actor(self, trainer: Any, metrics: dict) -> dict[str, float] | None:
        """The weighted-likelihood update over every plug-in's ``actor_rows``, or None when none gives any."""
        given = [(p, out) for p in self.items if (out := p.actor_rows(trainer, metrics)) is not None]
        if all(p.joins_only for p, _ in given):
            return None
        given = [out for _, out in given]
        episodes = [t for rows, _ in given for t in rows]
        weights = [w for _, ws in given for w in ws]
        return likelihood_update(trainer, episodes, weights)

    def state_dict(self) -> dict:
        return {p.name: p.state_dict() for p in self.items}

    def load_state_dict(self, state: dict) -> None:
        for p in self.items:
            p.load_state_dict(state.get(p.name, {}))

    def describe(self) -> list[dict]:
        return [{"name": p.name, **(asdict(p.cfg) if is_dataclass(p.cfg) else {})} for p in self.items]


def likelihood_update(trainer: Any, episodes: list[Trajectory], weights: list[float]) -> dict[str, float]:
    """``-w log pi`` on the given episodes' turns (``weights``: one per turn, flat in order), with the
    actor step's knobs (``actor_epochs`` passes of ``actor_states`` episodes a step): the update
    branch BC and self-imitation make."""
    if not episodes:
        return {"actor/rows": 0.0}
    cfg = trainer.cfg
    batch = pack_batch(episodes, trainer.policy.pad_id)
    token_w = torch.tensor(weights, dtype=torch.float32)[batch.token_turn]
    step = trainer.actor_step(cfg.actor_states)
    step.actor_epochs = cfg.actor_epochs
    out = actor_update(trainer.model, trainer.actor_opt, batch, token_w, None, step, trainer.gen, trainer.ctx, loss="nll")
    trainer.policy.invalidate_caches()
    return {**out, "actor/rows": float(len(episodes))}

