"""The full training path behind ``turngym train``: load the policy, evaluate it zero-shot on held-out
tasks, SFT warm start, evaluate, RL (ArCHer or a critic-free algorithm), evaluate.

Stages are recorded in ``<output_dir>/stages.json`` as they finish, and the SFT weights are kept,
so a killed run resumes at the stage it was in (the RL stage from its own checkpoint).

This module sits above both the trainers and bench (it uses bench's held-out evaluation), and holds
the ``turngym train`` command line too.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable

import torch

from turngym.agents.base import SamplingParams
from turngym.agents.loading import no_transformers_bars
from turngym.bench.evaluate import evaluate
from turngym.bench.heldout import SplitCheck, check_splits, describe_overlap, plot_stages
from turngym.bench.protocol import held_out_table
from turngym.clock import CLOCK, breakdown_table, quiet
from turngym.config import apply_overrides, describe, knob, load_yaml
from turngym.envs.registry import resolve_env_id
from turngym.rollout import Collector
from turngym.trainers.archer import ArcherConfig
from turngym.trainers.branch_bc import BranchBCConfig
from turngym.trainers.checkpoint import has_checkpoint, load_weights, save_weights
from turngym.trainers.critic_guided import CriticGuidedPolicy
from turngym.trainers.distributed import DistContext, full_params, is_sharded, model_state_dict
from turngym.trainers.hierarchy import HierarchyConfig, fit_critic, trained_actor
from turngym.trainers.logger import MetricsLogger
from turngym.trainers.pg import PGConfig
from turngym.trainers.registry import algorithm_names, algorithms_help, get_algorithm
from turngym.trainers.sft import SFTConfig, sft
from turngym.trainers.trainer import resolve_rollout_engine


@dataclass
class EvalConfig:
    """Held-out evaluation between stages."""

    episodes: int = knob(128, "held-out games per evaluation (distinct: the split must hold that many)")
    split: str = knob("test", "the held-out split ('' for an env without splits)")
    zero_shot: bool = knob(False, "evaluate before any training too (the embedded model: 0% on TextWorld, "
                                  "and its 100% invalid actions play every turn: the slowest evaluation)")
    max_new_tokens: int = knob(16, "length cap per utterance")
    num_envs: int = knob(32, "episodes in flight")
    overlap_check_s: float = knob(10.0, "seconds spent comparing held-out and training task contents "
                                        "before training (0: task ids only)")
    allow_train_overlap: bool = knob(False, "train even when held-out tasks are training tasks (a loud "
                                            "warning, and summary.json's held_out_check lists them)")
    critic_guided: int = knob(0, "after ArCHer (or with hierarchy.tasks, after any RL stage), also evaluate the actor "
                                 "acting with its critic (stage final_critic): at every turn the greedy reply and this "
                                 "many runner-ups are scored by min(Q1, Q2) and the best is played (0: off)")
    critic_margin: float = knob(0.0, "critic_guided: how much higher a runner-up's score must be to replace the greedy reply")
    critic_prior: float = knob(0.0, "critic_guided: a reply's score is min(Q1, Q2) + this x its log-probability "
                                    "under the actor (as archer.branch_rank_prior)")

    def __post_init__(self) -> None:
        if self.episodes < 1 or self.num_envs < 1 or self.max_new_tokens < 1:
            raise ValueError("episodes, num_envs and max_new_tokens must be >= 1")
        if self.overlap_check_s < 0:
            raise ValueError(f"overlap_check_s must be >= 0, got {self.overlap_check_s}")
        if min(self.critic_guided, self.critic_margin, self.critic_prior) < 0:
            raise ValueError("critic_guided, critic_margin and critic_prior must be >= 0, got "
                             f"{self.critic_guided}, {self.critic_margin}, {self.critic_prior}")


# The quickstart: what `turngym train` runs with no config (see configs/quickstart.yaml for the why
# of each number). xml tool calls (<act>go east</act>) are ~8 tokens; the top 8 of SmolLM2's 30 blocks train.
def _quickstart_sft() -> SFTConfig:
    return SFTConfig(episodes=8, epochs=8, lr=3e-4, batch_size=4, trainable="top:8")


def _quickstart_archer() -> ArcherConfig:
    # the branch stage's search (screen 64 games, runner-ups at 2 points, 3 wide, 2 deep) feeds the critic;
    # AWR at the states where the tree holds several replies, fitted like the clones (lr 3e-4, 8 passes)
    return ArcherConfig(iterations=1, episodes_per_iter=64, num_envs=64, max_state_visits=3, max_new_tokens=16,
                        trainable="top:8", branch_by="state_key", actor_lr=3e-4, actor_epochs=8, minibatch_size=4,
                        micro_batch_size=4, expert_replay=8, critic_updates=500)


def _quickstart_branch() -> BranchBCConfig:
    return BranchBCConfig(iterations=1, episodes_per_iter=64, num_envs=64, max_state_visits=3, max_new_tokens=16,
                          trainable="top:8", actor_lr=3e-4, actor_epochs=8, minibatch_size=4, micro_batch_size=4,
                          branch_points=2, branch_width=3, branch_depth=2, expert_replay=8)


def _quickstart_pg() -> PGConfig:
    return PGConfig(algo="filtered_bc", iterations=100, time_budget_s=420, group_size=8, episodes_per_iter=64,
                    num_envs=64, minibatch_size=8, micro_batch_size=4, top_p=1.0, max_state_visits=3,
                    max_new_tokens=16, trainable="top:8", actor_lr=1e-4, actor_epochs=2, actor_warmup_steps=2,
                    task_sampling="greedy_failed", screen_every=3, expert_replay=8,
                    reward=["env", {"name": "format", "unparseable": -0.1, "invalid": -0.1}])


@dataclass
class TrainConfig:
    """``turngym train``: its defaults are the quickstart (embedded model, SFT, online filtered BC, TextWorld-easy)."""

    model: str = knob("default", "policy: default (embedded SmolLM2-135M) | hf:PATH")
    algo: str = knob("branch_bc", "the algorithm after SFT: " + " | ".join(algorithm_names()))
    env_id: str = knob("turngym/TextWorld-easy-v0", "environment to train on (pkg.module:ns/Name-v0 imports "
                                                   "pkg.module first, which registers it)")
    env_kwargs: dict = knob({"tool_format": "xml"}, "env constructor overrides, for training and evaluation")
    train_split: str = knob("train", "split the trainers play ('' for an env without splits)")
    train_env_kwargs: dict = knob({}, "env constructor overrides for the training split only, over env_kwargs: "
                                        "e.g. {num_games: 512} gives RL more tasks than the walkthroughs come from "
                                        "(with sft.demo_pool and the RL section's demo_pool at the old count)")
    output_dir: str = knob("runs/quickstart", "checkpoints, metrics, plots, summary.json")
    seed: int = knob(0, "global seed")
    threads: int = knob(0, "torch CPU threads (0 = torch's default)")
    sft: SFTConfig = knob(_quickstart_sft, "SFT warm start")
    branch: BranchBCConfig = knob(_quickstart_branch, "branch-search BC (algo=branch_bc)")
    archer: ArcherConfig = knob(_quickstart_archer, "ArCHer (algo=archer)")
    pg: PGConfig = knob(_quickstart_pg, "critic-free trainers (algo=" + "|".join(algorithm_names("pg")) + ")")
    hierarchy: HierarchyConfig = knob(HierarchyConfig, "after the RL stage: the critic of the trained actor, which "
                                                       "acts with it (eval.critic_guided; off while hierarchy.tasks is 0)")
    eval: EvalConfig = knob(EvalConfig, "held-out evaluation")

    @classmethod
    def prepare_fields(cls, data: dict) -> dict:
        """Before the sections are built: the top-level algo names the pg section's algo, so
        ``algo=filtered_bc pg.expert_replay=8`` over a config whose pg.algo is rloo builds."""
        algo, pg = data.get("algo"), data.get("pg")
        if algo in algorithm_names("pg") and isinstance(pg, dict) and pg.get("algo", algo) != algo:
            data["pg"] = PGConfig.fields_for(algo, pg)
        return data

    def __post_init__(self) -> None:
        if get_algorithm(self.algo).config is PGConfig and self.pg.algo != self.algo:
            self.pg = PGConfig(**PGConfig.fields_for(self.algo, asdict(self.pg)))
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0, got {self.threads}")
        own_critic = hasattr(get_algorithm(self.algo).trainer, "reply_values")
        if self.eval.critic_guided and not (own_critic or self.hierarchy.tasks):
            raise ValueError(f"eval.critic_guided={self.eval.critic_guided}: algo={self.algo} trains no utterance "
                             "critic to act with; use algo=archer, set hierarchy.tasks (the critic of the trained "
                             "actor), or eval.critic_guided=0")
        if self.hierarchy.tasks and not self.eval.critic_guided:
            raise ValueError(f"hierarchy.tasks={self.hierarchy.tasks} fits a critic that acts: set eval.critic_guided "
                             f"(runner-ups scored per turn, e.g. {self.hierarchy.width}), or hierarchy.tasks=0")
        if not (self.model == "default" or self.model.startswith("hf:")):
            raise ValueError(f"model must be default or hf:PATH (a model this process can train), got {self.model!r}")
        name, section = rl_section(self)
        for knob_name in ("demo_seed", "demo_pool"):
            mine, sft_own = getattr(section, knob_name), getattr(self.sft, knob_name)
            if getattr(section, "expert_replay", 0) and mine != sft_own:
                raise ValueError(f"{name}.expert_replay replays the SFT stage's demonstrations, but {name}.{knob_name}="
                                 f"{mine} and sft.{knob_name}={sft_own} choose different tasks; "
                                 f"set both to the same value")


def rl_section(cfg: TrainConfig) -> tuple[str, Any]:
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


def train_env_kwargs(cfg: TrainConfig) -> dict:
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
def preflight(cfg: TrainConfig, warn: bool = True) -> SplitCheck:
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


def _refuse_overlap(cfg: TrainConfig, check: SplitCheck, warn: bool) -> None:
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


def evaluate_policy(policy: Any, cfg: TrainConfig, tag: str, collector: Collector | None = None) -> dict:
    policy.invalidate_caches()
    res = evaluate(cfg.env_id, policy, agent_name=f"{cfg.model}@{tag}", episodes=cfg.eval.episodes,
                   seed=10_000 + cfg.seed, env_kwargs=_with_split(cfg.env_kwargs, cfg.eval.split),
                   sampling=SamplingParams(temperature=0.0, max_new_tokens=cfg.eval.max_new_tokens, seed=cfg.seed),
                   num_envs=cfg.eval.num_envs, progress=f"eval {tag}", distinct=True, collector=collector)
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


def run(cfg: TrainConfig, progress: bool = True, ctx: DistContext | None = None, *,
        evaluator: Callable[[Any, TrainConfig, str], dict] | None = None,
        on_iteration: Callable[[Any, dict], None] | None = None) -> dict:
    """Run (or resume) the whole path; returns ``summary.json``'s content.

    Under ``torchrun`` / ``accelerate launch`` (``ctx`` from ``DistContext.from_env()``) the RL stage
    is data-parallel; SFT runs identically on every rank and rank 0 alone evaluates and writes.

    Args:
        cfg: The pipeline's config.
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
        return _run(cfg, progress, ctx, evaluator, on_iteration)


def _run(cfg: TrainConfig, progress: bool, ctx: DistContext | None, evaluator: Callable | None,
         on_iteration: Callable | None) -> dict:
    CLOCK.reset()
    ctx = ctx or DistContext.from_env()
    main = ctx.is_main
    cfg = replace(cfg, env_id=resolve_env_id(cfg.env_id))  # pkg.module:ns/Name-v0 imports pkg.module
    check = preflight(cfg, warn=main)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if main:
        (out / "config.json").write_text(json.dumps(asdict(cfg), indent=2))
    stages = _Stages(out, write=main)
    t0 = time.perf_counter()
    with CLOCK.stage("load"):
        policy = load_policy(cfg.model)
    if ctx.enabled and ctx.device != policy.device:  # each rank on its own GPU
        policy.model.to(ctx.device)
        policy.device = ctx.device
    say = print if progress and main else (lambda *a, **k: None)
    train_kwargs = train_env_kwargs(cfg)

    # auto decided once, so the trainer and the evaluations agree on the engine
    rl_cfg = rl_section(cfg)[1]
    engine, vllm = "hf", {}
    if hasattr(rl_cfg, "rollout_engine"):  # the online trainers and branch BC may generate with vLLM
        rl_cfg = resolve_rollout_engine(rl_cfg, ctx.enabled)
        engine, vllm = rl_cfg.rollout_engine, rl_cfg.vllm
    # one Collector for the run: envs stay open from one evaluation (and collection) to the next, and
    # with rollout_engine=vllm one engine generates the trainer's collection and every evaluation
    collector = Collector(policy, engine=engine, vllm=vllm, workers=rl_cfg.env_workers, ctx=ctx)
    evaluator = evaluator or functools.partial(evaluate_policy, collector=collector)

    def held_out(tag: str, act: Callable[[Any], Any] | None = None) -> None:
        """Evaluate on rank 0 (the others wait) and record the stage, with the engine that generates
        (the policy itself, or the vLLM engine synced with its current weights), or ``act(engine)``
        wrapping it; the wrapper's ``stats`` join the stage's record."""
        if main:
            with CLOCK.stage(f"eval_{tag}"):
                policy_now = collector.generator() if act is None else act(collector.generator())
                record = evaluator(policy_now, cfg, tag)
                if act is not None:
                    record.update({f"acting/{k}": v for k, v in policy_now.stats.items()})
                stages.finish(f"eval_{tag}", record)
        ctx.barrier()
        stages.reload()

    if cfg.eval.zero_shot and not stages.done("eval_zero_shot"):
        held_out("zero_shot")
        say(_line("zero-shot", stages.data["eval_zero_shot"]))

    sft_weights = out / "sft_model.pt"
    if cfg.sft.enabled:
        if not stages.done("sft"):
            with CLOCK.stage("sft"):
                result = sft(policy, cfg.env_id, cfg.sft, env_kwargs=train_kwargs, progress=progress and main,
                             collector=collector)
            if main:
                save_weights(policy.model.state_dict(), sft_weights)  # the blocks SFT changed, once
                stages.finish("sft", result)
            ctx.barrier()
        else:
            policy.model.load_state_dict(load_weights(sft_weights))
            policy.invalidate_caches()
        if not stages.done("eval_sft"):
            held_out("sft")
            say(_line("after SFT", stages.data["eval_sft"]))

    if rl_cfg.iterations > 0 and not stages.done("eval_final"):
        # The trainer resumes from its checkpoint; after a finished run (a kill came after the RL
        # stage) it only reloads the trained weights, for the final model and evaluation.
        trainer_cls = get_algorithm(cfg.algo).trainer
        trainer = trainer_cls(policy, cfg.env_id, rl_cfg, env_kwargs=train_kwargs, out_dir=out / cfg.algo, ctx=ctx,
                              collector=collector)
        logger = None
        if main:
            logger = MetricsLogger(out / cfg.algo, config=asdict(cfg), resume=has_checkpoint(out / cfg.algo / "checkpoint"))
        with CLOCK.stage(cfg.algo):
            trainer.train(logger=logger, progress=progress, on_iteration=on_iteration)
        if logger is not None:
            logger.close()
            stages.finish("rl", {"iterations": trainer.iteration, "env_steps": trainer.env_steps,
                                 "train_seconds": trainer.train_seconds})
        sharded = is_sharded(policy.model)
        full = model_state_dict(policy.model) if sharded else None  # gathering: every rank takes part
        if main:
            save_final_model(policy, out / "final_model", full)
        with full_params(policy.model):  # rank 0 evaluates a sharded model alone: no collectives in its forwards
            own_critic = cfg.eval.critic_guided and not cfg.hierarchy.tasks  # ArCHer acting with its own critic
            if own_critic and not stages.done("eval_final_critic"):  # before final: a rerun redoes both
                held_out("final_critic", lambda engine: _acting(cfg, engine, trainer.reply_values))
            held_out("final")
    if cfg.hierarchy.tasks and rl_cfg.iterations > 0 and not stages.done("eval_final_critic"):
        _hierarchy_stage(cfg, rl_cfg, policy, stages, collector, held_out, say, progress and main)
    if rl_cfg.iterations > 0:
        say(_line(f"after {cfg.algo}", stages.data["eval_final"]))
        if "eval_final_critic" in stages.data:
            say(_line(f"after {cfg.algo}, acting with its critic", stages.data["eval_final_critic"]))

    collector.close()
    summary = {
        "env_id": cfg.env_id, "model": cfg.model, "algo": cfg.algo, "held_out_split": cfg.eval.split,
        "held_out_episodes": cfg.eval.episodes,
        "success": {k.removeprefix("eval_"): v["success"] for k, v in stages.data.items() if k.startswith("eval_")},
        "held_out": held_out_table(stages.data),
        "held_out_check": check.to_dict(),
        "wall_s_this_run": time.perf_counter() - t0,
        "time_breakdown": CLOCK.breakdown(),
    }
    say("[time, s] where this run's wall-clock went:\n" + breakdown_table(summary["time_breakdown"]))
    if "vs_sft" in summary["held_out"].get("final", {}):
        d = summary["held_out"]["final"]["vs_sft"]
        say(f"[paired, final - SFT] {d['diff']:+.1%} (95% CI {d['ci95'][0]:+.1%} to {d['ci95'][1]:+.1%}, n={d['n']} games)"
            + ("" if check.clean else f"  NOT HELD OUT: {describe_overlap(check)}"))
    if main:
        _write_json(out / "summary.json", summary)
        plot_stages(summary["held_out"], out / "stages.png", f"{cfg.env_id}: held-out success per stage", cfg.algo)
    return summary


def _hierarchy_stage(cfg: TrainConfig, rl_cfg: Any, policy: Any, stages: _Stages, collector: Collector,
                     held_out: Callable, say: Callable, progress: bool) -> None:
    """The critic of the trained actor (``trainers.hierarchy``), then the held-out evaluation of the
    actor acting with it (stage ``final_critic``); below the gate the actor acts alone."""
    out = Path(cfg.output_dir)
    actor = trained_actor(out / cfg.algo)
    if not stages.done("hierarchy"):
        say(f"[hierarchy] fitting the critic of the trained actor on {cfg.hierarchy.tasks} training tasks")
    policy.model.load_state_dict(actor.pop("model"))  # the RL stage's final weights (a rerun starts from SFT's)
    policy.invalidate_caches()
    with CLOCK.stage("hierarchy"):
        critic, record = fit_critic(policy, cfg.env_id, cfg.hierarchy, rl_cfg, trained_on=actor["screened"],
                                    env_kwargs=train_env_kwargs(cfg), out_dir=out / "hierarchy",
                                    collector=collector, progress=progress)
    if stages.done("hierarchy"):  # the critic was reloaded: the record made when it was fitted stands
        record = stages.data["hierarchy"]
    stages.finish("hierarchy", record)
    if record["gate_open"]:
        held_out("final_critic", lambda engine: _acting(cfg, engine, critic.reply_values))
    else:
        say(f"[hierarchy] the critic's sibling AUC {record.get('sibling_auc_xfit')} is below the gate "
            f"{cfg.hierarchy.gate}: the actor acts alone")
        stages.finish("eval_final_critic", {**stages.data["eval_final"], "acting/gate_open": 0.0})


def _acting(cfg: TrainConfig, engine: Any, values: Callable) -> CriticGuidedPolicy:
    """The trained actor (``engine`` generates with it) acting with a critic's ``values``."""
    return CriticGuidedPolicy(engine, values, cfg.eval.critic_guided, cfg.eval.critic_margin, cfg.eval.critic_prior)


def _line(tag: str, s: dict) -> str:
    lo, hi = s["success_ci95"]
    return f"[{tag}] held-out success {s['success']:.1%} (95% CI {lo:.1%}-{hi:.1%}), invalid actions {s['invalid_action_rate']:.1%}"


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
    p.add_argument("--show-config", action="store_true", help="print every field with its help and exit")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def main(args: argparse.Namespace) -> int:
    if args.show_config:
        print(describe(TrainConfig))
        return 0
    cfg = load_yaml(TrainConfig, args.config) if args.config else TrainConfig()
    overrides = list(args.set)
    if args.algo:
        overrides.append(f"algo={args.algo}")
    if args.env:
        overrides.append(f"env_id={args.env}")
    if args.output_dir:
        overrides.append(f"output_dir={args.output_dir}")
    cfg = apply_overrides(cfg, overrides)
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
