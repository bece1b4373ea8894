"""The algorithms ``turngym train`` can run, each registered by its own module.

An algorithm names its config class, its trainer class and the ``TrainConfig`` section its knobs
live in; the critic-free family also names its advantage estimator and default loss (``pg.py``).
``turngym.trainers`` imports every algorithm module, so the registry is full once the package is
imported; ``train.py`` and ``--algo``'s help read it instead of listing names by hand.

    register_algorithm(Algorithm("rloo", section="pg", config=PGConfig, trainer=PGTrainer,
                                 help="leave-one-out baseline in a group", estimator=RLOO()))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Algorithm:
    """One trainable algorithm.

    Attributes:
        name: What ``algo`` / ``--algo`` calls it.
        section: The ``TrainConfig`` section holding its config (several algorithms may share one).
        config: Its config dataclass.
        trainer: Its trainer class: ``trainer(policy, env_id, cfg, env_kwargs=, out_dir=, ctx=, collector=)``.
        help: One line for ``--algo``'s help.
        estimator: The critic-free family's per-algorithm part (advantages, loss); None otherwise.
    """

    name: str
    section: str
    config: type
    trainer: type
    help: str
    estimator: Any = None


_ALGORITHMS: dict[str, Algorithm] = {}


def register_algorithm(algo: Algorithm) -> Algorithm:
    """Add ``algo`` to the registry (a module registers its own algorithms when it is imported).

    Raises:
        ValueError: another algorithm already has this name.
    """
    if algo.name in _ALGORITHMS and _ALGORITHMS[algo.name] != algo:
        raise ValueError(f"algorithm {algo.name!r} is already registered")
    _ALGORITHMS[algo.name] = algo
    return algo


def get_algorithm(name: str) -> Algorithm:
    """The registered algorithm called ``name``.

    Raises:
        ValueError: no such algorithm (the message lists the registered ones).
    """
    if name not in _ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; registered: {', '.join(algorithm_names())}")
    return _ALGORITHMS[name]


def algorithm_names(section: str | None = None) -> list[str]:
    """Registered algorithm names, in registration order (only ``section``'s, if given)."""
    return [n for n, a in _ALGORITHMS.items() if section is None or a.section == section]


def algorithms_help() -> str:
    """``name: help`` for every registered algorithm, one per line (``--algo``'s help)."""
    return "; ".join(f"{a.name} ({a.help})" for a in _ALGORITHMS.values())
