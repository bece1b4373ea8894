"""The full training path behind ``turngym train``: registered stages, run in order.

The stages and config sections come from the modules that own them (``trainers.stages``): SFT
warm start, held-out evaluations, the RL algorithm (any registered one), and post-stages such as
ArCHer's hierarchy. This module builds ``TrainConfig`` from the registered sections, checks the run
before any CPU is spent (``preflight``), and runs the stages; it names no algorithm.

Stages are recorded in ``<output_dir>/stages.json`` as they finish, and the SFT weights are kept,
so a killed run resumes at the stage it was in (the RL stage from its own checkpoint).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable

import torch

import turngym.trainers  # noqa: F401  (registers every algorithm, section and stage)
from turngym.agents.base import SamplingParams
from turngym.agents.loading import no_transformers_bars
from turngym.bench.evaluate import evaluate
from turngym.bench.heldout import SplitCheck, check_splits, describe_overlap, plot_stages
from turngym.bench.protocol import held_out_table
from turngym.clock import CLOCK, breakdown_table, quiet
from turngym.config import apply_overrides, describe, knob, load_yaml
from turngym.envs.registry import resolve_env_id
from turngym.rollout import Collector
from turngym.trainers.checkpoint import has_checkpoint, load_weights, save_weights
from turngym.trainers.distributed import DistContext, full_params, is_sharded, model_state_dict
from turngym.trainers.logger import MetricsLogger
from turngym.trainers.registry import algorithm_names, algorithms_help, get_algorithm
from turngym.trainers.sft import sft
from turngym.trainers.stages import Section, Stage, register_section, register_stage, sections, stages
from turngym.trainers.trainer import resolve_rollout_engine


@dataclasses.dataclass
class EvalConfig:
    """Held-out evaluation between stages."""

    episodes: int = knob(128, "held-out games per evaluation (distinct: the split must hold that many)")
    split: str = knob("test", "the held-out split ('' for an env without splits)")
    zero_shot: bool = knob(False, "evaluate before any training too (the embedded model: 0% on TextWorld, "
                                  "and its 100% invalid actions play every turn: the slowest evaluation)")
    max_new_tokens: int = knob(0, "length cap per reply (0: from the env: its oracle's longest demonstration reply "
                                  "x 1.25, at least 16)")
    max_state_visits: int = knob(0, "end (truncate) a held-out episode that reaches one env state this many times, as "
                                    "training's max_state_visits does; a looping agent then costs less time (0 = off)")
    num_envs: int = knob(32, "episodes in flight")
    overlap_check_s: float = knob(10.0, "seconds spent comparing held-out and training task contents "
                                        "before training (0: task ids only)")
    allow_train_overlap: bool = knob(False, "train even when held-out tasks are training tasks (a loud "
                                            "warning, and summary.json's held_out_check lists them)")

    def __post_init__(self) -> None:
        if self.episodes < 1 or self.num_envs < 1 or min(self.max_new_tokens, self.max_state_visits) < 0:
            raise ValueError("episodes and num_envs must be >= 1, max_new_tokens and max_state_visits >= 0")
        if self.overlap_check_s < 0:
            raise ValueError(f"overlap_check_s must be >= 0, got {self.overlap_check_s}")


register_section(Section("eval", EvalConfig, EvalConfig, "held-out evaluation"))


class _TrainConfigBase:
    """``turngym train``'s config: the run's own knobs, then one section per registered config
    section (``trainers.stages.sections``). Its defaults are the quickstart (embedded model, SFT,
    branch-search BC, TextWorld-easy)."""

    @classmethod
    def prepare_fields(cls, data: dict) -> dict:
        """Before the sections are built: the top-level algo names the pg section's algo, so
        ``algo=filtered_bc pg.expert_replay=8`` over a config whose pg.algo is rloo builds."""
        from turngym.trainers.pg import PGConfig

        algo, pg = data.get("algo"), data.get("pg")
        if algo in algorithm_names("pg") and isinstance(pg, dict) and pg.get("algo", algo) != algo:
            data["pg"] = PGConfig.fields_for(algo, pg)
        return data

    def __post_init__(self) -> None:
        algo = get_algorithm(self.algo)
        rl = getattr(self, algo.section)
        if hasattr(rl, "algo") and rl.algo != self.algo:  # a section several algorithms share names its own
            setattr(self, algo.section, type(rl)(**type(rl).fields_for(self.algo, asdict(rl))))
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0, got {self.threads}")
        if not (self.model == "default" or self.model.startswith("hf:")):
            raise ValueError(f"model must be default or hf:PATH (a model this process can train), got {self.model!r}")
        for section in sections():
            if section.check is not None and hasattr(self, section.name):
                section.check(self)

    def with_seeds(self) -> Any:
        """A copy whose sections without a seed of their own (None) have the run's: one seed derives
        every stage's (``turngym protocol`` sets that one knob)."""
        out = copy.deepcopy(self)
        for section in sections():
            part = getattr(out, section.name, None)
            if part is not None and getattr(part, "seed", 0) is None:
                part.seed = self.seed
        return out

    def rl_section(self) -> Any:
        """The config of the RL algorithm ``algo`` (the registry names its section)."""
        return getattr(self, get_algorithm(self.algo).section)

    def rl_trainer(self) -> type:
        return get_algorithm(self.algo).trainer


def _train_config_class() -> type:
    own = [
        ("model", str, knob("default", "policy: default (embedded SmolLM2-135M) | hf:PATH")),
        ("algo", str, knob("branch_bc", "the algorithm after SFT: " + " | ".join(algorithm_names()))),
        ("env_id", str, knob("turngym/TextWorld-easy-v0", "environment to train on (pkg.module:ns/Name-v0 imports "
                                                         "pkg.module first, which registers it)")),
        ("env_kwargs", dict, knob({"tool_format": "xml"}, "env constructor overrides, for training and evaluation")),
        ("train_split", str, knob("train", "split the trainers play ('' for an env without splits)")),
        ("train_env_kwargs", dict, knob({}, "env constructor overrides for the training split only, over env_kwargs: "
                                            "e.g. {num_games: 512} gives RL more tasks than the walkthroughs come from "
                                            "(with sft.demo_pool at the old count)")),
        ("output_dir", str, knob("runs/quickstart", "checkpoints, metrics, plots, summary.json")),
        ("seed", int, knob(0, "the run's seed: every section's seed (demonstration draw, SFT order, RL sampling) "
                              "unless the section sets its own, and the evaluations'")),
        ("threads", int, knob(0, "torch CPU threads (0 = torch's default)")),
    ]
    parts = [(s.name, s.config, knob(s.default, s.help)) for s in sections()]
    return dataclasses.make_dataclass("TrainConfig", own + parts, bases=(_TrainConfigBase,), namespace={"__module__": __name__})


TrainConfig = _train_config_class()


def rl_section(cfg: Any) -> tuple[str, Any]:
    """The config section that ``cfg.algo`` trains with (the registry says which), and its config:
    e.g. ``("branch", cfg.branch)`` or ``("pg", cfg.pg)``."""
    section = get_algorithm(cfg.algo).section
    return section, getattr(cfg, section)


def load_policy(spec: str) -> Any:
    """An HF policy for training from an agent spec (``default`` or ``hf:PATH``).

    Raises:
        ValueError: the spec names a policy that cannot be trained here (scripted, HTTP).
    """
    from turngym.agents import make_agent

    policy = make_agent(spec)
    if not hasattr(policy, "model") or not hasattr(policy, "chat"):
        raise ValueError(f"agent {spec!r} has no trainable model; use 'default' or 'hf:PATH'")
    return policy


def _with_split(env_kwargs: dict, split: str) -> dict:
    """The env kwargs for one split ('' = an env without splits: pass none)."""
    return {**env_kwargs, "split": split} if split else dict(env_kwargs)


def train_env_kwargs(cfg: Any) -> dict:
    """The env kwargs of the tasks the SFT and RL stages train on: env_kwargs, then train_env_kwargs."""
    return _with_split({**cfg.env_kwargs, **cfg.train_env_kwargs}, cfg.train_split)


def save_final_model(policy: Any, path: Path, state_dict: dict | None = None) -> Path:
    """The trained policy as a Hugging Face model folder: ``--agent hf:PATH`` plays it and
    ``turngym bench`` benchmarks it. LoRA adapters are folded into a copy of the weights.
    ``state_dict``: the full weights to write instead of ``policy.model``'s own (an FSDP-sharded
    model's, gathered by ``trainers.distributed.model_state_dict``). The weights are written in
    bf16, half the disk of fp32; the run's own evaluations play the fp32 weights in memory, and the
    run's checkpoint keeps them exactly."""
    model = policy.model
    if hasattr(model, "merge_and_unload"):
        model = copy.deepcopy(model).merge_and_unload()
    state = state_dict if state_dict is not None else model.state_dict()
    half = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in state.items()}
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with no_transformers_bars():
        model.save_pretrained(tmp, state_dict=half)
    config = json.loads((tmp / "config.json").read_text())
    config["dtype" if "dtype" in config else "torch_dtype"] = "bfloat16"  # what the file holds (4.x: torch_dtype)
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    policy.tokenizer.save_pretrained(tmp)
    shutil.rmtree(path, ignore_errors=True)  # a kill from here to the rename leaves no folder: the stage reruns
    tmp.rename(path)
    return path


# ----- checks before any CPU is spent ---------------------------------------------------------------
def preflight(cfg: Any, warn: bool = True) -> SplitCheck:
    """Check what can fail late before training starts: the env id, its constructor kwargs, the
    split sizes against ``eval.episodes``, an oracle for SFT, and that the held-out tasks are not
    training tasks (``turngym.bench.heldout``). The knobs' own values are checked as the config is
    built.

    Args:
        cfg: The pipeline's config.
        warn: Print the warning for a held-out split that shares content with training (off on
            every rank but 0 of a data-parallel job, so it prints once).

    Returns:
        The held-out check (recorded in ``summary.json``).

    Raises:
        ValueError: One line naming the knob and the fix.
    """
    train_kwargs = train_env_kwargs(cfg)
    test_kwargs = _with_split(cfg.env_kwargs, cfg.eval.split)
    try:
        check = check_splits(cfg.env_id, train_kwargs, test_kwargs, cfg.eval.episodes, budget_s=cfg.eval.overlap_check_s)
    except TypeError as e:  # a constructor kwarg the env does not take
        raise ValueError(f"env_kwargs / train_split / eval.split: {cfg.env_id} rejects {sorted(test_kwargs)}: {e}; "
                         "fix the --set env_kwargs=... (or split) value") from e
    if not check.train_tasks:
        raise ValueError(f"train_split={cfg.train_split!r}: {cfg.env_id} has no tasks there; name a split it has "
                         "(--set train_split=NAME, '' for an env without splits)")
    if check.split_size < cfg.eval.episodes:
        raise ValueError(f"eval.episodes={cfg.eval.episodes}: the held-out split {cfg.eval.split!r} of {cfg.env_id} "
                         f"has {check.split_size} tasks, and a held-out score counts distinct tasks; "
                         f"--set eval.episodes={check.split_size} (or give the env more test tasks)")
    if cfg.sft.enabled and not check.train_oracle:
        raise ValueError(f"sft.enabled: {cfg.env_id} has no oracle_action() for SFT to imitate; "
                         "--set sft.enabled=false, or give the env an oracle_action()")
    _refuse_overlap(cfg, check, warn)
    return check


def _refuse_overlap(cfg: Any, check: SplitCheck, warn: bool) -> None:
    """A held-out claim on training tasks: refused when ids are shared (unless
    ``eval.allow_train_overlap``), a loud warning when only the content is."""
    if check.clean:
        return
    what = describe_overlap(check)
    if check.id_overlap and not cfg.eval.allow_train_overlap:
        raise ValueError(f"eval.split={cfg.eval.split!r} / train_split={cfg.train_split!r}: not held out: {what}. "
                         "Make the env give disjoint task ids per split= (train and test), or "
                         "--set eval.allow_train_overlap=true to train anyway (the summary marks it)")
    if warn:
        print(f"WARNING: the held-out evaluation is not fully held out: {what}. summary.json's held_out_check "
              "lists them; a gain measured on these tasks is not a held-out result.", file=sys.stderr, flush=True)


def evaluate_policy(policy: Any, cfg: Any, tag: str, collector: Collector | None = None) -> dict:
    policy.invalidate_caches()
    res = evaluate(cfg.env_id, policy, agent_name=f"{cfg.model}@{tag}", episodes=cfg.eval.episodes,
                   seed=10_000 + cfg.seed, env_kwargs=_with_split(cfg.env_kwargs, cfg.eval.split),
                   sampling=SamplingParams(temperature=0.0, max_new_tokens=cfg.eval.max_new_tokens, seed=cfg.seed),
                   num_envs=cfg.eval.num_envs, progress=f"eval {tag}", distinct=True, collector=collector,
                   max_state_visits=cfg.eval.max_state_visits)
    res.save(Path(cfg.output_dir) / f"eval_{tag}.json")
    # every stage plays the same held-out (task, seed) list in the same order: outcomes pair up
    return {**res.summary, "per_episode_success": [float(t.success) for t in res.trajectories]}


class _Stages:
    """``stages.json``: which stages finished, with their results."""

    def __init__(self, out: Path, write: bool = True) -> None:
        self.path = out / "stages.json"
        self.write = write  # only rank 0 writes; the others reload after a barrier
        self.reload()

    def reload(self) -> None:
        self.data = json.loads(self.path.read_text()) if self.path.exists() else {}

    def done(self, name: str) -> bool:
        return name in self.data

    def finish(self, name: str, result: Any) -> None:
        self.data[name] = result
        if self.write:
            _write_json(self.path, self.data)


def _write_json(path: Path, data: Any) -> None:
    """Write a JSON file so a kill at any instant leaves the old content or the new (``os.replace``)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def fit_reply_caps(cfg: Any, collector: Collector, say: Callable[[str], None] = print) -> Any:
    """``cfg`` with every reply cap left at 0 (``eval.max_new_tokens``, the RL section's
    ``max_new_tokens``) taken from the env: its oracle's longest reply among the SFT stage's
    demonstrations, in the policy's tokens, x 1.25 and at least 16 (48 for an env without an oracle).
    A cap set shorter than that reply gets a warning: replies like the oracle's would be cut, and a
    cut call reads as no call."""
    rl_name = get_algorithm(cfg.algo).section
    parts = {"eval": cfg.eval, rl_name: getattr(cfg, rl_name)}
    caps = {name: part.max_new_tokens for name, part in parts.items() if hasattr(part, "max_new_tokens")}
    longest = _longest_oracle_reply(cfg, collector) if cfg.sft.enabled or not all(caps.values()) else None
    fitted = 48 if longest is None else max(16, -(-longest * 5 // 4))
    out = copy.deepcopy(cfg)
    for name, cap in caps.items():
        if cap == 0:
            setattr(out, name, replace(getattr(out, name), max_new_tokens=fitted))
            say(f"[reply cap] {name}.max_new_tokens = {fitted} (the env's oracle's longest reply: "
                f"{longest if longest is not None else 'unknown, no oracle'} tokens)")
        elif longest is not None and cap < longest:
            print(f"WARNING: {name}.max_new_tokens={cap} is shorter than the env's oracle's longest reply ({longest} "
                  f"tokens): replies like it are cut, and a cut call reads as no call; --set {name}.max_new_tokens="
                  f"{max(16, -(-longest * 5 // 4))} (or 0: from the env)", file=sys.stderr, flush=True)
    return out


def _longest_oracle_reply(cfg: Any, collector: Collector) -> int | None:
    """The longest reply in tokens among the SFT stage's demonstrations (played once: SFT reuses them)."""
    from turngym.rollout import EnvTarget

    d = cfg.sft.demo_choice()
    try:
        demos = collector.demonstrations(EnvTarget(cfg.env_id, train_env_kwargs(cfg)), cfg.sft.episodes, d["seed"],
                                         d["demo_seed"], pool=d["pool"])
    except (RuntimeError, NotImplementedError, AttributeError):  # no oracle, or it solved nothing
        return None
    return max((t.num_tokens for ep in demos for t in ep.turns), default=None)


class Pipeline:
    """A run in progress: what every stage sees (``trainers.stages.PipelineRun``)."""

    def __init__(self, cfg: Any, progress: bool, ctx: DistContext, evaluator: Callable | None,
                 on_iteration: Callable | None) -> None:
        self.cfg, self.progress, self.ctx, self.on_iteration = cfg, progress, ctx, on_iteration
        self.main = ctx.is_main
        self.out = Path(cfg.output_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.stages = _Stages(self.out, write=self.main)
        self.train_kwargs = train_env_kwargs(cfg)
        with CLOCK.stage("load"):
            self.policy = load_policy(cfg.model)
        if ctx.enabled and ctx.device != self.policy.device:  # each rank on its own GPU
            self.policy.model.to(ctx.device)
            self.policy.device = ctx.device
        # decided once, so the trainer and the evaluations agree on the engine: one Collector for the
        # run keeps envs open from one evaluation (and collection) to the next, and with vLLM one
        # engine generates the trainer's collection and every evaluation
        rl = cfg.rl_section()
        engine, vllm = "hf", {}
        if hasattr(rl, "rollout_engine"):
            rl = resolve_rollout_engine(rl, ctx.enabled)
            engine, vllm = rl.rollout_engine, rl.vllm
        self.collector = Collector(self.policy, engine=engine, vllm=vllm, workers=getattr(rl, "env_workers", "local"),
                                   ctx=ctx)
        self.cfg = cfg = fit_reply_caps(cfg, self.collector, self.say)
        self.rl_cfg = replace(rl, max_new_tokens=cfg.rl_section().max_new_tokens) if hasattr(rl, "max_new_tokens") else rl
        self.evaluator = evaluator or functools.partial(evaluate_policy, collector=self.collector)
        self.trainer = None

    def say(self, line: str) -> None:
        if self.progress and self.main:
            print(line, flush=True)

    def held_out(self, tag: str, act: Callable[[Any], Any] | None = None) -> None:
        """Evaluate on rank 0 (the others wait) and record stage ``eval_<tag>``, with the engine that
        generates (the policy, or the vLLM engine synced with it), or ``act(engine)`` wrapping it;
        the wrapper's ``stats`` join the record."""
        if self.main:
            with CLOCK.stage(f"eval_{tag}"):
                policy_now = self.collector.generator() if act is None else act(self.collector.generator())
                record = self.evaluator(policy_now, self.cfg, tag)
                if act is not None:
                    record.update({f"acting/{k}": v for k, v in policy_now.stats.items()})
                self.stages.finish(f"eval_{tag}", record)
        self.ctx.barrier()
        self.stages.reload()
        self.say(_line(tag, self.stages.data[f"eval_{tag}"]))


# ----- the pipeline's own stages (others register from their modules) ---------------------------
def _zero_shot(p: Pipeline) -> None:
    if p.cfg.eval.zero_shot and not p.stages.done("eval_zero_shot"):
        p.held_out("zero_shot")


def _sft(p: Pipeline) -> None:
    """SFT on the oracle's demonstrations (its weights kept for a resumed run), then its evaluation."""
    cfg, weights = p.cfg, p.out / "sft_model.pt"
    if not cfg.sft.enabled:
        return
    if not p.stages.done("sft"):
        with CLOCK.stage("sft"):
            result = sft(p.policy, cfg.env_id, cfg.sft, env_kwargs=p.train_kwargs, progress=p.progress and p.main,
                         collector=p.collector)
        if p.main:
            save_weights(p.policy.model.state_dict(), weights)  # the blocks SFT changed, once
            p.stages.finish("sft", result)
        p.ctx.barrier()
    else:
        p.policy.model.load_state_dict(load_weights(weights))
        p.policy.invalidate_caches()
    if not p.stages.done("eval_sft"):
        p.held_out("sft")


def _rl(p: Pipeline) -> None:
    """The RL algorithm (``algo``) from its own checkpoint; after a finished run (a kill came after
    it) it only reloads the trained weights, for the final model and the stages after it."""
    cfg, rl = p.cfg, p.rl_cfg
    if rl.iterations <= 0 or p.stages.done("eval_final"):
        return
    trainer = cfg.rl_trainer()(p.policy, cfg.env_id, rl, env_kwargs=p.train_kwargs, out_dir=p.out / cfg.algo,
                               ctx=p.ctx, collector=p.collector, demos=cfg.sft.demo_choice())
    logger = None
    if p.main:
        logger = MetricsLogger(p.out / cfg.algo, config=asdict(cfg), resume=has_checkpoint(p.out / cfg.algo / "checkpoint"))
    with CLOCK.stage(cfg.algo):
        trainer.train(logger=logger, progress=p.progress, on_iteration=p.on_iteration)
    if logger is not None:
        logger.close()
        p.stages.finish("rl", {"iterations": trainer.iteration, "env_steps": trainer.env_steps,
                               "env_episodes": trainer.env_episodes, "train_seconds": trainer.train_seconds})
    full = model_state_dict(p.policy.model) if is_sharded(p.policy.model) else None  # every rank gathers
    if p.main:
        save_final_model(p.policy, p.out / "final_model", full)
    p.trainer = trainer


def _final(p: Pipeline) -> None:
    if p.rl_cfg.iterations > 0 and not p.stages.done("eval_final"):
        with full_params(p.policy.model):  # rank 0 evaluates a sharded model alone: no collectives in its forwards
            p.held_out("final")


register_stage(Stage("zero_shot", 10, _zero_shot, "held-out success of the untrained policy (eval.zero_shot)"))
register_stage(Stage("sft", 20, _sft, "SFT warm start, then its held-out evaluation"))
register_stage(Stage("rl", 50, _rl, "the RL algorithm (algo)"))
register_stage(Stage("final", 60, _final, "held-out success after the RL stage"))


def run(cfg: Any, progress: bool = True, ctx: DistContext | None = None, *,
        evaluator: Callable[[Any, Any, str], dict] | None = None,
        on_iteration: Callable[[Any, dict], None] | None = None) -> dict:
    """Run (or resume) every registered stage; returns ``summary.json``'s content.

    Under ``torchrun`` / ``accelerate launch`` (``ctx`` from ``DistContext.from_env()``) the RL stage
    is data-parallel; SFT runs identically on every rank and rank 0 alone evaluates and writes.

    Args:
        cfg: The pipeline's config (a ``TrainConfig``).
        progress: Progress bars and a line per stage.
        ctx: The data-parallel context (default: from the environment).
        evaluator: ``evaluator(policy, cfg, tag)`` returns a stage's held-out record, with at least
            ``evaluate_policy``'s keys (default: ``evaluate_policy``).
        on_iteration: Passed to the RL trainer's ``train`` (called after each iteration).

    Returns:
        The summary: per-stage held-out success, ``held_out_table``, this run's wall time and where
        it went (``time_breakdown``: ``clock.Clock.breakdown``).
    """
    with quiet(not progress):  # bars deep inside (game generation, evaluations) follow --quiet too
        CLOCK.reset()
        ctx = ctx or DistContext.from_env()
        cfg = replace(cfg, env_id=resolve_env_id(cfg.env_id)).with_seeds()  # pkg.module:ns/... imports pkg.module
        check = preflight(cfg, warn=ctx.is_main)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        t0 = time.perf_counter()
        p = Pipeline(cfg, progress, ctx, evaluator, on_iteration)
        if p.main:  # as run: the reply caps fitted to the env
            (p.out / "config.json").write_text(json.dumps(asdict(p.cfg), indent=2))
        try:
            for stage in stages():
                stage.run(p)
        finally:
            p.collector.close()
        return _summary(p, check, time.perf_counter() - t0)


def _summary(p: Pipeline, check: SplitCheck, wall_s: float) -> dict:
    cfg, data = p.cfg, p.stages.data
    summary = {
        "env_id": cfg.env_id, "model": cfg.model, "algo": cfg.algo, "held_out_split": cfg.eval.split,
        "held_out_episodes": cfg.eval.episodes,
        "success": {k.removeprefix("eval_"): v["success"] for k, v in data.items() if k.startswith("eval_")},
        "held_out": held_out_table(data), "held_out_check": check.to_dict(), "wall_s_this_run": wall_s,
        "time_breakdown": CLOCK.breakdown(),
    }
    p.say("[time, s] where this run's wall-clock went:\n" + breakdown_table(summary["time_breakdown"]))
    if "vs_sft" in summary["held_out"].get("final", {}):
        d = summary["held_out"]["final"]["vs_sft"]
        p.say(f"[paired, final - SFT] {d['diff']:+.1%} (95% CI {d['ci95'][0]:+.1%} to {d['ci95'][1]:+.1%}, n={d['n']} games)"
              + ("" if check.clean else f"  NOT HELD OUT: {describe_overlap(check)}"))
    if p.main:
        _write_json(p.out / "summary.json", summary)
        plot_stages(summary["held_out"], p.out / "stages.png", f"{cfg.env_id}: held-out success per stage", cfg.algo)
    return summary


_TAGS = {"zero_shot": "zero-shot", "sft": "after SFT", "final": "after RL", "final_critic": "after RL, acting with its critic"}


def _line(tag: str, s: dict) -> str:
    lo, hi = s["success_ci95"]
    return (f"[{_TAGS.get(tag, tag)}] held-out success {s['success']:.1%} (95% CI {lo:.1%}-{hi:.1%}), "
            f"invalid actions {s['invalid_action_rate']:.1%}")


# ----- the command line: turngym train ---------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="YAML config (default: the quickstart, built in)")
    p.add_argument("--env", default=None, help="env id to train on (env_id); pkg.module:ns/Name-v0 imports "
                                               "pkg.module from the current folder first")
    p.add_argument("--algo", default=None, help="the algorithm after SFT (default: the config's, branch_bc): "
                   + algorithms_help())
    p.add_argument("--output-dir", default=None, help="where checkpoints, metrics and plots go")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set archer.iterations=4 --set sft.epochs=1")
    p.add_argument("--show-config", action="store_true", help="print every field as this command would run it, with its help, and exit")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def main(args: argparse.Namespace) -> int:
    cfg = load_yaml(TrainConfig, args.config) if args.config else TrainConfig()
    overrides = list(args.set)
    if args.algo:
        overrides.append(f"algo={args.algo}")
    if args.env:
        overrides.append(f"env_id={args.env}")
    if args.output_dir:
        overrides.append(f"output_dir={args.output_dir}")
    cfg = apply_overrides(cfg, overrides)
    if args.show_config:  # as it would run: --config, then --set, --algo, --env and --output-dir
        print(describe(cfg))
        return 0
    ctx = DistContext.from_env()  # under torchrun / accelerate launch: joins the job's process group
    try:
        summary = run(cfg, progress=not args.quiet, ctx=ctx)
    finally:
        # Leave the group before the interpreter exits: left to finalization, gloo's threads can
        # outlive the objects they use and abort a rank that finished its work (SIGABRT).
        ctx.close()
    if ctx.is_main:  # under torchrun every rank returns; one prints
        print(json.dumps(summary, indent=2))
    return 0
