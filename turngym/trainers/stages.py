"""The ``turngym train`` pipeline's config sections and stages, registered by the modules that own them.

A *section* is a config dataclass the pipeline's ``TrainConfig`` holds under a name (``sft``,
``branch``, ``archer``, ``pg``...), with the default the pipeline starts from. A *stage* is a step of
the pipeline (SFT, the RL algorithm, an evaluation, a post-stage such as the hierarchy), run in
``order``; it reads its own section. ``turngym.train`` builds ``TrainConfig`` from the sections and
runs the stages; it names no algorithm. A new algorithm registers its section (and, through
``trainers.registry``, itself) from its own file:

    register_section(Section("archer", ArcherConfig, _quickstart_archer, "ArCHer (algo=archer)"))
    register_stage(Stage("hierarchy", 70, hierarchy_stage, "the critic of the trained actor acts"))

A stage is ``run(pipeline)``: ``pipeline`` is the run in progress (``PipelineRun``); the stage checks
``pipeline.stages.done(name)`` to resume, and records what it did with ``pipeline.stages.finish``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol


@dataclass(frozen=True)
class Section:
    """A config section of ``TrainConfig``.

    Attributes:
        name: Its key (``--set NAME.knob=...``, a YAML mapping of that name).
        config: Its dataclass.
        default: Builds the pipeline's default for it (e.g. the quickstart's sizes).
        help: One line for ``--show-config``.
        check: ``check(train_config)`` raises ``ValueError`` when the section's knobs cannot run with
            the rest of the config (e.g. a stage that needs what the chosen algorithm does not train).
    """

    name: str
    config: type
    default: Callable[[], Any]
    help: str
    check: Callable[[Any], None] | None = None


@dataclass(frozen=True)
class Stage:
    """A step of the pipeline, run in ``order`` (lower first) by ``run(pipeline)``."""

    name: str
    order: float
    run: Callable[[Any], None]
    help: str = ""


class PipelineRun(Protocol):
    """What a stage sees of the run in progress (``turngym.train.Pipeline``)."""

    cfg: Any  # the TrainConfig
    policy: Any  # the HF policy being trained
    collector: Any  # plays every episode of the run (envs stay open between stages)
    stages: Any  # stages.json: done(name), finish(name, record), data
    trainer: Any  # the RL stage's trainer, once it ran (None before, or without RL)
    main: bool  # rank 0 of a data-parallel run (the one that evaluates and writes)

    def held_out(self, tag: str, act: Callable[[Any], Any] | None = None) -> None:
        """Evaluate the policy (wrapped by ``act(engine)`` if given) on the held-out split as stage ``eval_<tag>``."""

    def say(self, line: str) -> None:
        """Print a progress line (rank 0, unless quiet)."""


_SECTIONS: dict[str, Section] = {}
_STAGES: dict[str, Stage] = {}


def _register(table: dict, item: Any, same: Callable[[Any, Any], bool], kind: str) -> Any:
    """Add ``item`` to ``table`` under its name; registering the same one again (a module imported twice)
    is a no-op, another one under a taken name an error."""
    if item.name in table and not same(table[item.name], item):
        raise ValueError(f"{kind} {item.name!r} is already registered")
    table[item.name] = item
    return item


def register_section(section: Section) -> Section:
    """Add a config section (a module registers its own when imported).

    Raises:
        ValueError: another section has its name.
    """
    return _register(_SECTIONS, section, lambda old, new: old.config is new.config, "config section")


def register_stage(stage: Stage) -> Stage:
    """Add a pipeline stage.

    Raises:
        ValueError: another stage has its name.
    """
    return _register(_STAGES, stage, lambda old, new: old.run is new.run, "pipeline stage")


def sections() -> list[Section]:
    """The registered sections, in registration order."""
    return list(_SECTIONS.values())


def stages() -> list[Stage]:
    """The registered stages, in the order they run."""
    return sorted(_STAGES.values(), key=lambda s: s.order)
