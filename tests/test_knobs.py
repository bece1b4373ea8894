"""No knob is read by nothing. For every registered algorithm, ``turngym train``'s whole path runs on
the tiny model while every read of a config field is recorded (reads made while a config is built
and checked, or copied, do not count). Every knob of the SFT, evaluation and algorithm sections (and
of every ArCHer plug-in) that no run read must be refused, naming it, when set away from its default:
a knob a run accepts and then ignores lets a user believe they configured something they did not."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
from fixtures_model import build_tiny_model

from turngym.config import apply_overrides
from turngym.train import TrainConfig, run
from turngym.trainers.archer import plugin_names
from turngym.trainers.archer.plugins import _PLUGINS
from turngym.trainers.registry import algorithm_names, get_algorithm

# frames whose reads do not count: building, checking, copying and printing a config
NOT_A_READ = {"__post_init__", "__repr__", "__eq__", "refuse_unless", "default_value", "fields_for",
              "unused_knobs", "check", "describe", "to_dict", "from_dict", "apply_overrides", "with_seeds",
              "prepare_fields", "_parse", "build"}
SKIP_FILES = ("dataclasses.py", "copy.py")

# a non-default value for knobs whose type alone does not say what is valid
ALTERNATIVES = {"trainable": "top:1", "autocast": "none", "env_workers": "thread", "rollout_engine": "auto",
                "critic_encoder": "reference", "pg_loss": "nll", "old_logprobs": "rescored", "sharding": "fsdp",
                "task_sampling": "contrast", "branch_by": "observation", "branch_pick": "uncertain",
                "split": "train", "by": "state_key", "pick": "uncertain", "values": "returns", "baseline": "zero",
                "demos": "drawn", "reward": ["outcome"], "vllm": {"gpu_memory_utilization": 0.5},
                "plugins": ["tree"], "env_kwargs": {"n_tasks": 3}, "model": "default"}


def _non_default(f: dataclasses.Field, value):
    if f.name in ALTERNATIVES:
        return ALTERNATIVES[f.name]
    if isinstance(value, bool):
        return not value
    if isinstance(value, int) or value is None:
        return (value or 0) + 1
    if isinstance(value, float):
        return value + 0.5 if value < 0.5 else value / 2
    raise AssertionError(f"give knob {f.name} an alternative value in ALTERNATIVES")


class Reads:
    """Records which fields of which config classes code reads (see the module docstring)."""

    def __init__(self, monkeypatch, classes) -> None:
        self.seen: dict[type, set[str]] = {c: set() for c in classes}
        self.on = False
        for cls in classes:
            names = {f.name for f in dataclasses.fields(cls)}
            monkeypatch.setattr(cls, "__getattribute__", self._hook(cls, names), raising=False)

    def _hook(self, cls, names):
        def getattribute(obj, name, _seen=self.seen[cls]):
            if self.on and name in names:
                frame, counted = sys._getframe(1), True
                for _ in range(12):  # a read inside a config's own building or checking is not a use
                    if frame is None:
                        break
                    if frame.f_code.co_name in NOT_A_READ or frame.f_code.co_filename.endswith(SKIP_FILES):
                        counted = False
                        break
                    frame = frame.f_back
                if counted:
                    _seen.add(name)
            return object.__getattribute__(obj, name)

        return getattribute


def _base(tmp_path: Path, tiny_tokenizer) -> TrainConfig:
    model_dir = tmp_path / "tiny"
    if not model_dir.exists():
        build_tiny_model(tiny_tokenizer).save_pretrained(model_dir)
        tiny_tokenizer.save_pretrained(model_dir)
    small = ["iterations=2", "episodes_per_iter=4", "num_envs=4", "max_new_tokens=6", "trainable=all", "autocast=none"]
    sets = [f"model=hf:{model_dir}", "env_id=tests/Guess-v0", "env_kwargs={}", "train_split=", "eval.split=",
            "eval.episodes=2", "eval.num_envs=2", "eval.max_new_tokens=6", "eval.allow_train_overlap=true",
            "sft.episodes=2", "sft.epochs=1", "sft.batch_size=2", "sft.autocast=none", "sft.trainable=all",
            *[f"{s}.{kv}" for s in ("branch", "pg", "archer") for kv in small],
            # every stage updates: demonstrations join the clones, rewards that differ give advantages
            "branch.expert_replay=2", "pg.group_size=2", "pg.reward=[env, test_varied]", "archer.critic_epochs=2",
            "archer.critic_states=4", "archer.actor_states=2", "archer.warmup_iters=1", "archer.critic_encoder=top:1",
            "archer.critic_window=4"]
    return apply_overrides(TrainConfig(), sets)


class _Varied:
    """A reward that differs from one reply to the next (by its ids): group advantages are never all 0."""

    def __call__(self, trajectories):
        return [[(sum(t.action_ids(k)) % 7) / 10 for k in range(len(t.turns))] for t in trajectories]


@pytest.mark.parametrize("algo", algorithm_names())
def test_every_knob_changes_what_the_run_does_or_is_refused(algo, tmp_path, tiny_tokenizer, monkeypatch):
    from turngym.rewards import register_reward

    register_reward("test_varied", _Varied)
    base = _base(tmp_path, tiny_tokenizer)
    section = get_algorithm(algo).section
    sets = [f"algo={algo}", f"output_dir={tmp_path / 'run'}"]
    if algo == "filtered_bc":  # it clones successes: the demonstrations make sure there is something to clone
        sets.append("pg.expert_replay=2")
    sections = {"sft": type(base.sft), "eval": type(base.eval), section: type(getattr(base, section))}
    reads = Reads(monkeypatch, list(sections.values()))
    cfg = apply_overrides(base, sets)
    reads.on = True
    run(cfg, progress=False)
    reads.on = False
    unread = []
    for name, cls in sections.items():
        built = getattr(apply_overrides(base, [f"algo={algo}"]), name)
        for f in dataclasses.fields(cls):
            if f.name not in reads.seen[cls] and f.name != "algo":
                unread.append((name, f, getattr(built, f.name)))
    accepted, chosen = [], apply_overrides(base, [f"algo={algo}"])  # (switching algo resets the others' knobs)
    for name, f, value in unread:  # read by nothing: a non-default value must be refused, naming the knob
        try:
            apply_overrides(chosen, [f"{name}.{f.name}={_yaml(_non_default(f, value))}"])
            accepted.append(f"{name}.{f.name}")
        except ValueError as e:
            if f.name not in str(e):
                accepted.append(f"{name}.{f.name} (refused without naming it: {e})")
    assert not accepted, f"{algo}: knobs read by nothing and accepted: {accepted}"


def test_every_archer_plugin_knob_is_read_with_every_plugin_on(tiny_tokenizer, tmp_path, monkeypatch):
    from fixtures_model import EveryGuess

    import torch
    from turngym.trainers.archer import ArcherConfig, ArcherTrainer

    configs = {n: _PLUGINS[n].config for n in plugin_names() if _PLUGINS[n].config is not None}
    reads = Reads(monkeypatch, list(configs.values()))
    plugins = [{"name": "tree", "points": 1, "width": 4, "depth": 1, "by": "state_key"},
               {"name": "sibling_auc", "holdout": 0.25, "gate": 0.0}, {"name": "awr", "min_shift": 0.0, "margin": 0.0},
               {"name": "self_imitation", "min_weight": 0.01}, "clone_wins", {"name": "critic_rank", "pool": 6},
               {"name": "expert_replay", "episodes": 2}, "expert_auc", {"name": "best_of_n", "n": 2}]
    cfg = ArcherConfig(iterations=2, episodes_per_iter=4, num_envs=4, max_new_tokens=6, critic_epochs=2, critic_states=4,
                       actor_states=2, warmup_iters=0, critic_encoder="reference", trainable="all", autocast="none",
                       plugins=plugins)
    policy = EveryGuess(build_tiny_model(tiny_tokenizer), tiny_tokenizer, generation_dtype=torch.float32)
    trainer = ArcherTrainer(policy, "tests/Guess-v0", cfg, env_kwargs={"tool_format": "text"}, out_dir=tmp_path)
    reads.on = True
    trainer.train(progress=False)
    reads.on = False
    unread = [f"{p}.{f.name}" for p, cls in configs.items() for f in dataclasses.fields(cls) if f.name not in reads.seen[cls]]
    assert not unread, f"plug-in knobs read by nothing in a run with every plug-in on: {unread}"


def _yaml(value) -> str:
    import yaml

    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def test_a_taken_stage_or_section_name_is_refused_and_the_same_one_is_a_no_op():
    from turngym.trainers.stages import Section, Stage, register_section, register_stage, sections, stages

    sft = next(s for s in stages() if s.name == "sft")
    assert register_stage(sft) is sft  # a module imported twice
    with pytest.raises(ValueError, match="pipeline stage 'sft' is already registered"):
        register_stage(Stage("sft", 1.0, lambda p: None))
    pg = next(s for s in sections() if s.name == "pg")
    assert register_section(pg) is pg
    with pytest.raises(ValueError, match="config section 'pg' is already registered"):
        register_section(Section("pg", dict, dict, "another pg"))
