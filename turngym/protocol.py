"""``turngym protocol``: the learning protocol every learning claim is measured with.

Per seed, SFT runs once (the ``turngym train`` pipeline's SFT stage); every arm starts from those
weights and is evaluated on the same held-out games (greedy, and ``--samples`` times per game at the
training temperature) at its start, every ``--eval-every`` iterations and at its end:

- ``sft``: the SFT stage itself;
- RL arms ``[NAME=]ALGO[:KEY=VALUE ...]``: the train pipeline's RL stage with config overrides,
  e.g. ``rloo`` or ``"archer_fast=archer:archer.tau=0.5 archer.critic_epochs=20"``;
- ``sft_continued``: SFT continued on the expert data for as many training seconds as the longest
  RL arm of that seed trained (evaluation excluded), evaluated at the same wall-clock points.
  Every such arm (``NAME=sft_continued``) is a baseline the others are compared with; a finished one
  is kept when a longer RL arm is added later, so match that arm with a second, newly named one.
  ``sft_continued:sft.time_budget_s=SECONDS`` trains for those seconds instead, to match an RL arm
  trained in another run that ``scripts/merge_protocols.py`` pairs it with; it is also evaluated
  where each shorter RL arm of this run ended.

    turngym protocol --config configs/quickstart.yaml --arm sft --arm sft_continued \\
        --arm archer --arm rloo --seeds 0 1 2 --games 128 --samples 2 --out runs/protocol

Writes ``protocol.json`` (everything), ``protocol.md`` (the tables) and ``protocol.png`` (learning
curves) in ``--out``; ``--out/seed<S>/<arm>/`` are ordinary ``turngym train`` output dirs, so a
killed run rerun with the same arguments resumes where it stopped. The statistics (paired and
cluster-bootstrap differences, seed-level intervals, the report) are ``turngym.bench.protocol``'s.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from turngym.bench.protocol import (compare_arms, held_out_eval, markdown_report, plot_curves, release_memory,
                                    steps_to_target, task_groups)
from turngym.config import apply_overrides, load_yaml
from turngym.rollout import Collector
from turngym.train import TrainConfig, load_policy, rl_section, run, train_env_kwargs
from turngym.trainers.checkpoint import load_weights
from turngym.trainers.registry import get_algorithm
from turngym.trainers.sft import sft


@dataclass
class Arm:
    name: str
    algo: str  # sft | sft_continued | an RL algo of TrainConfig
    overrides: list[str] = field(default_factory=list)

    @property
    def is_rl(self) -> bool:
        return self.algo not in ("sft", "sft_continued")


def parse_arm(spec: str) -> Arm:
    """``[NAME=]ALGO[:KEY=VALUE KEY=VALUE ...]`` (overrides split like a shell line)."""
    head, _, rest = spec.partition(":")
    name, _, algo = head.rpartition("=")
    return Arm(name or algo, algo, shlex.split(rest))


def _write_json(path: Path, data) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def _read_json(path: Path, default=None):
    return json.loads(path.read_text()) if path.exists() else default


def _split(env_kwargs: dict, split: str) -> dict:
    return {**env_kwargs, "split": split} if split else dict(env_kwargs)


def _given_budget(arm: Arm) -> float | None:
    """The training seconds an SFT-continued arm was given (``sft.time_budget_s=``), or None."""
    given = [o.partition("=")[2] for o in arm.overrides if o.partition("=")[0].strip() == "sft.time_budget_s"]
    if not given:
        return None
    try:
        seconds = float(given[-1])
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise SystemExit(f"--arm {arm.name}: sft.time_budget_s must be > 0 seconds, got {given[-1]}")
    return seconds


def _with_fitted_caps(cfg: TrainConfig, run_dir: Path) -> TrainConfig:
    """``cfg`` with the eval reply cap that the run in ``run_dir`` fitted to the env when it was left at 0
    (``turngym.train.fit_reply_caps``; the run's ``config.json`` holds it), so that the protocol's own
    evaluations cap replies as the run's do."""
    fitted = _read_json(run_dir / "config.json", {}).get("eval", {}).get("max_new_tokens")
    if fitted and not cfg.eval.max_new_tokens:
        return apply_overrides(cfg, [f"eval.max_new_tokens={fitted}"])
    return cfg


def _point(rec: dict, iteration: int, env_steps: int | None, train_seconds: float, env_episodes: int | None = None) -> dict:
    """A learning-curve point: where it was taken (iteration, env steps and episodes, training
    seconds) and its held-out record."""
    return {"iteration": iteration, "env_steps": env_steps, "env_episodes": env_episodes, "train_seconds": train_seconds,
            **rec}


class Protocol:
    """Runs (or resumes) every seed and arm, then assembles the report from the per-run files."""

    def __init__(self, args: argparse.Namespace) -> None:
        base = load_yaml(TrainConfig, args.config) if args.config else TrainConfig()
        # the held-out games are --games: turngym.train's checks hold the split to that many
        self.base = apply_overrides(base, list(args.set) + ["eval.zero_shot=false", f"eval.episodes={args.games}"])
        self.args, self.out = args, Path(args.out)
        self.arms = [parse_arm(a) for a in args.arm]
        if not any(a.algo == "sft" for a in self.arms):  # the baseline every arm is compared with
            self.arms.insert(0, Arm("sft", "sft"))
        if any(a.algo == "sft" and a.name != "sft" for a in self.arms):
            raise SystemExit("the sft arm is the baseline and keeps its name: --arm 'sft[:KEY=VALUE ...]'")
        if len({a.name for a in self.arms}) != len(self.arms):
            raise SystemExit("arm names must be distinct (name them: NAME=ALGO:...)")
        if any(a.algo == "sft_continued" and _given_budget(a) is None for a in self.arms) and \
                not any(a.is_rl for a in self.arms):
            raise SystemExit("sft_continued matches an RL arm's training time: add an RL arm, "
                             "or give its seconds (sft_continued:sft.time_budget_s=SECONDS)")
        for arm in self.arms:  # every arm's config is checked before the first one trains
            try:
                arm_cfg = self.config(arm, args.seeds[0])
            except ValueError as e:
                raise SystemExit(f"--arm {arm.name}: {e}") from e
            section, arm_rl = rl_section(arm_cfg)
            if arm.is_rl and getattr(arm_rl, "time_budget_s", 0):  # e.g. the pg section's quickstart default
                print(f"[protocol] warning: arm {arm.name} stops after {arm_rl.time_budget_s:g} training seconds "
                      f"({section}.time_budget_s), whatever its iterations: its episode budget is not the "
                      f"other arms'. Set {section}.time_budget_s=0 to train every iteration.", file=sys.stderr, flush=True)
        rl = rl_section(self.base)[1]
        # the training temperature of the online trainers; branch BC plays greedily, so the default 1.0
        trained_at = getattr(rl, "temperature", 1.0)
        self.temperature = trained_at if args.temperature is None else args.temperature
        self.held_out = _split(self.base.env_kwargs, self.base.eval.split)
        self.groups = task_groups(self.base.env_id, self.held_out)
        self.collector = Collector(None)  # the held-out envs stay open across every evaluation of this process

    # ----- configs and evaluation ------------------------------------------------------------
    def config(self, arm: Arm, seed: int, rl_iterations: int | None = None) -> TrainConfig:
        algo = arm.algo if arm.is_rl else self.base.algo
        # the run's seed derives every stage's (sections that set their own keep it)
        sets = [f"algo={algo}", *arm.overrides, f"seed={seed}", f"output_dir={self.out / f'seed{seed}' / arm.name}"]
        if not self.args.same_demos:  # each seed's SFT sees its own subset of the training tasks
            sets.append("sft.demos=drawn")
        if rl_iterations is not None:
            sets.append(f"{get_algorithm(algo).section}.iterations={rl_iterations}")
        return apply_overrides(self.base, sets)

    def evaluate(self, policy, cfg: TrainConfig, label: str) -> dict:
        a = self.args
        rec = held_out_eval(policy, cfg.env_id, self.held_out, games=a.games, samples=a.samples,
                            temperature=self.temperature, max_new_tokens=cfg.eval.max_new_tokens,
                            num_envs=cfg.eval.num_envs, groups=self.groups, collector=self.collector)
        temp = "" if rec["temp_success"] is None else f", T={self.temperature} {rec['temp_success']:.1%}"
        lo, hi = rec["success_ci95"]
        print(f"[protocol] {label}: greedy {rec['success']:.1%} [{lo:.1%}, {hi:.1%}] (n={rec['episodes']}){temp}",
              flush=True)
        return rec

    # ----- the arms ---------------------------------------------------------------------------
    def run_sft(self, seed: int) -> Path:
        """The seed's SFT stage and its evaluation (the pipeline with no RL iterations)."""
        arm = next(a for a in self.arms if a.algo == "sft")  # its overrides shape the SFT stage
        cfg = self.config(arm, seed, rl_iterations=0)
        run(cfg, progress=not self.args.quiet, evaluator=lambda p, c, tag: self.evaluate(p, c, f"seed {seed} {arm.name}"))
        return Path(cfg.output_dir)

    def start_from_sft(self, sft_dir: Path, out: Path) -> None:
        """Give an arm's output dir the seed's SFT stage, so the pipeline resumes after it."""
        out.mkdir(parents=True, exist_ok=True)
        stages = _read_json(out / "stages.json", {})
        if "sft" in stages:
            return
        link_or_copy(sft_dir / "sft_model.pt", out / "sft_model.pt")
        done = _read_json(sft_dir / "stages.json")
        _write_json(out / "stages.json", {"sft": done["sft"], "eval_sft": done["eval_sft"], **stages})

    def run_rl(self, arm: Arm, seed: int, sft_dir: Path) -> None:
        cfg = self.config(arm, seed)
        out = Path(cfg.output_dir)
        rl = rl_section(cfg)[1]
        done = _read_json(out / "stages.json", {})
        acting = "eval_final_critic" in done or not cfg.hierarchy.tasks  # the critic stage, when configured
        if "eval_final" in done and done.get("rl", {}).get("iterations") == rl.iterations and acting:
            return  # finished as configured: its weights and checkpoints may have been deleted to save disk
        self.start_from_sft(sft_dir, out)
        curve_path = out / "curve.json"
        every = self.args.eval_every or max(1, rl.iterations // 4)
        first = []

        def on_iteration(trainer, metrics) -> None:
            cfg_run = _with_fitted_caps(cfg, out)  # the run wrote its config, caps fitted, before training
            curve = _read_json(curve_path, {})
            if not first:  # the first iteration of this process: points from here on are replayed
                first.append(trainer.iteration)
                curve = {k: v for k, v in curve.items() if int(k) < trainer.iteration}
            if trainer.iteration % every == 0 and not trainer.done():
                label = f"seed {seed} {arm.name} it {trainer.iteration} ({trainer.train_seconds:.0f}s)"
                rec = self.evaluate(trainer.policy, cfg_run, label)
                curve[str(trainer.iteration)] = _point(rec, trainer.iteration, trainer.env_steps, trainer.train_seconds,
                                                       trainer.env_episodes)
            _write_json(curve_path, curve)

        run(cfg, progress=not self.args.quiet, on_iteration=on_iteration,
            evaluator=lambda p, c, tag: self.evaluate(p, c, f"seed {seed} {arm.name} {tag}"))

    def run_sft_continued(self, arm: Arm, seed: int, sft_dir: Path, budget: float, at: list[float]) -> None:
        """SFT from the seed's SFT weights for ``budget`` training seconds, evaluated at ``at``.

        Hours of training save as they go (``sft``'s checkpoint) and the curve is written at each
        evaluation, so a killed protocol goes on from the last save without evaluating a point twice."""
        cfg = self.config(arm, seed).with_seeds()
        out = Path(cfg.output_dir)
        if self.finished(arm, seed):
            return
        self.start_from_sft(sft_dir, out)
        stages = _read_json(out / "stages.json")
        cfg = _with_fitted_caps(cfg, sft_dir)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        policy = load_policy(cfg.model)
        policy.model.load_state_dict(load_weights(out / "sft_model.pt"))
        policy.invalidate_caches()
        curve = _read_json(out / "curve.json", {})
        done_s = max((p["train_seconds"] for p in curve.values()), default=-1.0)
        todo = sorted(t for t in at if t > done_s)

        def on_step(m: dict) -> None:
            if todo and m["sft/train_seconds"] >= todo[0]:
                while todo and m["sft/train_seconds"] >= todo[0]:
                    todo.pop(0)
                rec = self.evaluate(policy, cfg, f"seed {seed} {arm.name} step {m['sft/step']} "
                                                 f"({m['sft/train_seconds']:.0f}s)")
                curve[str(m["sft/step"])] = _point(rec, m["sft/step"], None, m["sft/train_seconds"])
                _write_json(out / "curve.json", curve)

        sft_cfg = apply_overrides(cfg, ["sft.epochs=1000000", f"sft.time_budget_s={budget}"]).sft
        checkpoint = out / "checkpoint"
        res = sft(policy, cfg.env_id, sft_cfg, env_kwargs=train_env_kwargs(cfg),
                  progress=not self.args.quiet, on_step=on_step, checkpoint_dir=checkpoint)
        _write_json(out / "curve.json", curve)
        stages["sft_continued"] = res
        stages["eval_final"] = self.evaluate(policy, cfg, f"seed {seed} {arm.name} final")
        _write_json(out / "stages.json", stages)
        shutil.rmtree(checkpoint, ignore_errors=True)  # finished: the weights' optimizer state is not needed

    # ----- the whole protocol -----------------------------------------------------------------
    def run_all(self) -> dict:
        with self.collector:
            for seed in self.args.seeds:
                sft_dir = self.run_sft(seed)
                release_memory()
                for arm in (a for a in self.arms if a.is_rl):
                    self.run_rl(arm, seed, sft_dir)
                    release_memory()
                for arm in (a for a in self.arms if a.algo == "sft_continued"):
                    budget, at = self.matched_time(seed, arm)
                    self.run_sft_continued(arm, seed, sft_dir, budget, at)
                    release_memory()
        return self.assemble()

    def matched_time(self, seed: int, arm: Arm) -> tuple[float, list[float]]:
        """The training seconds of SFT-continued ``arm`` and the training seconds it is evaluated at.

        By default the longest-training RL arm of ``seed``: its seconds and its evaluation times. With
        its seconds given (``sft.time_budget_s``, to match an RL arm of another run) it also stops to
        be evaluated where each shorter RL arm of this run ended, so it is matched to those too."""
        runs = []
        for rl in (a for a in self.arms if a.is_rl):
            out = self.out / f"seed{seed}" / rl.name
            runs.append((_read_json(out / "stages.json")["rl"]["train_seconds"],
                         [p["train_seconds"] for p in _read_json(out / "curve.json", {}).values()]))
        given = _given_budget(arm)
        if given is not None:
            return given, sorted(secs for secs, _ in runs if secs < given)
        secs, at = max(runs, default=(0.0, []))
        if secs <= 0:
            raise RuntimeError(f"seed {seed}: no RL arm trained, so sft_continued has no time budget")
        return secs, at

    def curve(self, arm: Arm, seed: int) -> tuple[dict, list[dict]]:
        """An arm's final record and its learning curve (start = the SFT evaluation)."""
        out = self.out / f"seed{seed}" / arm.name
        stages = _read_json(self.out / f"seed{seed}" / "sft" / "stages.json")
        points = [_point(stages["eval_sft"], 0, 0, 0.0, 0)]
        if arm.algo == "sft":
            return stages["eval_sft"], points
        mine = _read_json(out / "stages.json")
        mid = sorted(_read_json(out / "curve.json", {}).values(), key=lambda p: p["iteration"])
        if arm.is_rl:
            rl = mine["rl"]
            end = _point(mine["eval_final"], rl["iterations"], rl["env_steps"], rl["train_seconds"], rl.get("env_episodes"))
        else:
            res = mine["sft_continued"]
            end = _point(mine["eval_final"], res["sft/steps"], None, res["sft/train_seconds"])
            points[0]["env_steps"] = None  # SFT-continued plays no env steps: plotted against time only
        return mine["eval_final"], points + mid + [end]

    def finished(self, arm: Arm, seed: int) -> bool:
        stages = _read_json(self.out / f"seed{seed}" / arm.name / "stages.json", {})
        return "eval_sft" in stages if arm.algo == "sft" else "eval_final" in stages

    def baselines(self) -> tuple[str, ...]:
        """The arms every other arm is paired with: SFT, every SFT-continued arm (one matched to each RL
        arm's time gets its own column), branch BC, the floor a new method must beat, and ``--baseline``."""
        names = [a.name for a in self.arms]
        picked = ["sft", *(a.name for a in self.arms if a.algo == "sft_continued")]
        picked += [n for n in ("branch_bc", *self.args.baseline) if n in names]
        unknown = [n for n in self.args.baseline if n not in names]
        if unknown:
            raise SystemExit(f"--baseline {' '.join(unknown)}: not an arm of this protocol ({', '.join(names)})")
        return tuple(dict.fromkeys(picked))

    def assemble(self, partial: bool = False) -> dict:
        """The report from the arms' output dirs; ``partial`` leaves out the (arm, seed) pairs that
        have not finished (pooled statistics then use the seeds both arms have)."""
        finals, curves = {}, {}
        for arm in self.arms:
            for seed in self.args.seeds:
                if partial and not self.finished(arm, seed):
                    continue
                final, points = self.curve(arm, seed)
                keep = ("iteration", "env_steps", "env_episodes", "train_seconds", "success", "success_ci95", "temp_success")
                rows = [(arm.name, final, points)]
                guided = _read_json(self.out / f"seed{seed}" / arm.name / "stages.json", {}).get("eval_final_critic")
                if guided is not None and arm.is_rl:  # eval.critic_guided: the same actor, acting with its critic
                    rows.append((f"{arm.name}+critic", guided, [*points[:-1], {**points[-1], **guided}]))
                for name, rec, pts in rows:
                    finals.setdefault(name, {})[seed] = rec
                    curves.setdefault(name, {})[seed] = [{k: p.get(k) for k in keep} for p in pts]
        baselines = self.baselines()
        table = compare_arms(finals, baselines)
        a = self.args
        target = a.target
        if target is None:  # default: 5 points above the SFT arm's mean, a gain every RL arm should reach
            target = (table["sft"]["mean"]["success"] + 0.05) if "sft" in table else 0.5
        to_target = steps_to_target(curves, target)
        report = {"env_id": self.base.env_id, "held_out_split": self.base.eval.split, "games": a.games,
                  "samples": a.samples, "temperature": self.temperature, "seeds": a.seeds,
                  "arms": {arm.name: asdict(arm) for arm in self.arms}, "config": asdict(self.base),
                  "table": table, "curves": curves, "finals": finals,
                  "target": target, "steps_to_target": to_target}
        _write_json(self.out / "protocol.json", report)
        note = (f"{self.base.env_id}, {a.games} held-out games ({self.base.eval.split or 'no split'}), greedy and "
                f"{a.samples} samples per game at T={self.temperature}; seeds {a.seeds}. Paired differences: "
                f"bootstrap 95% CI over games, exact McNemar p on greedy outcomes.")
        (self.out / "protocol.md").write_text(markdown_report(table, note=note, to_target=to_target, target=target,
                                                                    baselines=baselines))
        plot_curves(curves, self.out / "protocol.png", title=f"{self.base.env_id}: held-out greedy success")
        return report


def link_or_copy(src: Path, dst: Path) -> None:
    """``dst`` as a hard link to ``src`` (every arm of a seed starts from the same SFT weights: half a
    GB each for the embedded model), or a copy across file systems. Sharing the file is safe because
    the pipeline never writes into an existing weights file: it writes a new one and renames it over."""
    dst.unlink(missing_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="base YAML train config (default: the quickstart)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a base config field")
    p.add_argument("--arm", action="append", default=[], help="sft | sft_continued | [NAME=]ALGO[:KEY=VALUE ...] "
                                                              "(default: sft, sft_continued, rloo)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--games", type=int, default=128, help="held-out games per evaluation")
    p.add_argument("--samples", type=int, default=2, help="samples per game at the training temperature")
    p.add_argument("--temperature", type=float, default=None, help="default: the base config's RL temperature")
    p.add_argument("--eval-every", type=int, default=0, help="RL iterations between evaluations (0: iterations/4)")
    p.add_argument("--target", type=float, default=None,
                   help="held-out success whose env steps to reach are reported (default: SFT's mean + 0.05)")
    p.add_argument("--same-demos", action="store_true",
                   help="every seed's SFT sees the same (first) training tasks; by default seed S draws its own "
                        "subset (sft.demos=drawn, with the seed), so seeds vary the demonstrations, not only the data order")
    p.add_argument("--baseline", action="append", default=[], metavar="ARM",
                   help="also pair every arm with this one (SFT, SFT-continued and branch_bc always are)")
    p.add_argument("--out", default="runs/protocol")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--report-only", action="store_true",
                   help="train nothing: report the (arm, seed) pairs that have finished")


def run_protocol(args: argparse.Namespace) -> dict:
    """Run (or resume, or with ``--report-only`` only report) the protocol; returns ``protocol.json``'s content."""
    if not args.arm:
        args.arm = ["sft", "sft_continued", "rloo"]
    protocol = Protocol(args)
    report = protocol.assemble(partial=True) if args.report_only else protocol.run_all()
    print((Path(args.out) / "protocol.md").read_text())
    return report


def main(args: argparse.Namespace) -> int:
    """``turngym protocol``."""
    run_protocol(args)
    return 0
