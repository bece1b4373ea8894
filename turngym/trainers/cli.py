"""``turngym train``: run the training path from a YAML config plus overrides."""

from __future__ import annotations

import argparse
import json
import os

from turngym.trainers.config import apply_overrides, describe, load_yaml


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="YAML config (default: the quickstart, built in)")
    p.add_argument("--algo", default=None, help="archer | grpo | gigpo | rloo | reinforce")
    p.add_argument("--output-dir", default=None, help="where checkpoints, metrics and plots go")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set archer.iterations=4 --set sft.epochs=1")
    p.add_argument("--show-config", action="store_true", help="print every field with its help and exit")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def main(args: argparse.Namespace) -> int:
    from turngym.trainers.pipeline import TrainConfig, run

    if args.show_config:
        print(describe(TrainConfig))
        return 0
    cfg = load_yaml(TrainConfig, args.config) if args.config else TrainConfig()
    overrides = list(args.set)
    if args.algo:
        overrides.append(f"algo={args.algo}")
    if args.output_dir:
        overrides.append(f"output_dir={args.output_dir}")
    cfg = apply_overrides(cfg, overrides)
    summary = run(cfg, progress=not args.quiet)
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun every rank returns; one prints
        print(json.dumps(summary, indent=2))
    return 0
