"""The whole quickstart (``turngym train``, warm caches) of two checkouts, back to back, in one run.

Each version runs ``python -m turngym.cli train --quiet`` into its own output folder (so nothing
resumes), with the games already generated. The table gives each version's wall time, the seconds
of its stages (from what every version records: the SFT stage's ``sft/seconds``, each evaluation's
``wall_s``, the RL stage's ``train_seconds``), its held-out success after SFT and after the RL
stage, and the paired difference; a version that records it also gives its time breakdown
(``summary.json``'s ``time_breakdown``).

    python benchmarks/quickstart.py --compare /tmp/before            # before, then this checkout
    python benchmarks/quickstart.py --compare /tmp/before --rounds 2 # A B A B
    python benchmarks/quickstart.py --set branch.actor_epochs=4      # overrides for both versions
    .venv-vllm/bin/python benchmarks/quickstart.py --engines hf vllm-inprocess   # this checkout: HF, then vLLM

``--engines`` runs this checkout once per engine: ``hf`` generates with the trained HF model
(``branch.rollout_engine=hf``); the others with a vLLM engine synced with its weights (``=vllm``:
the screen, the search and both evaluations), ``vllm`` in its own process (vLLM's default),
``vllm-inprocess`` in the trainer's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: no queue between
them to busy-poll), ``vllm-inprocess-bf16`` the same in bf16. Run it with the interpreter of the
vLLM venv (``scripts/install_vllm_cpu.sh``), which then serves every run.

Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from checkout import check_imports_from, checkout_env

HERE = Path(__file__).resolve().parent.parent
# --engines: name -> (overrides, environment variables) of that run
VLLM = ["branch.rollout_engine=vllm"]
ENGINES: dict[str, tuple[list[str], dict[str, str]]] = {
    "hf": (["branch.rollout_engine=hf"], {}),
    "vllm": (VLLM, {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}),  # vLLM's default: the engine in its own process
    "vllm-inprocess": (VLLM, {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}),  # no queue between them to busy-poll
    "vllm-inprocess-bf16": (VLLM + ["branch.vllm={dtype: bfloat16}"], {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}),
}


def run_version(tree: str, out: Path, overrides: list[str], environ: dict[str, str] | None = None) -> dict:
    """``turngym train`` from ``tree`` into ``out`` (``environ``: extra environment variables); its wall
    time, summary and stage records."""
    cmd = [sys.executable, "-m", "turngym.cli", "train", "--quiet", "--output-dir", str(Path(out).resolve())]
    for o in overrides:
        cmd += ["--set", o]
    check_imports_from(tree)
    env = checkout_env(tree, TURNGYM_PROGRESS="never", **(environ or {}))
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=tree, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    summary = json.loads((out / "summary.json").read_text())
    stages = json.loads((out / "stages.json").read_text())
    return {"wall_s": wall, "load": load, "load_end": os.getloadavg()[0], "summary": summary, "stages": stages}


def stage_seconds(r: dict) -> dict[str, float]:
    s = r["stages"]
    return {"sft": s.get("sft", {}).get("sft/seconds", 0.0), "eval_sft": s.get("eval_sft", {}).get("wall_s", 0.0),
            "rl": s.get("rl", {}).get("train_seconds", 0.0), "eval_final": s.get("eval_final", {}).get("wall_s", 0.0)}


def table(results: dict[str, dict]) -> str:
    """One column per version, then the first version's time over each other's (its speed-up)."""
    names = list(results)
    ratios = [f"{names[0]} / {n}" for n in names[1:]]
    lines = ["| | " + " | ".join(names + ratios) + " |", "|---" * (1 + len(names) + len(ratios)) + "|"]

    def row(label, values, fmt="{:.0f}", ratio=True):
        cells = [fmt.format(v) for v in values]
        cells += [f"{values[0] / v:.2f}x" if ratio and v else "" for v in values[1:]]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    row("wall, s", [results[n]["wall_s"] for n in names])
    for k in ("sft", "eval_sft", "rl", "eval_final"):
        row(f"{k}, s", [stage_seconds(results[n])[k] for n in names])
    for k in ("sft", "final"):
        row(f"held-out success after {k}", [results[n]["summary"]["success"].get(k, float("nan")) for n in names],
            "{:.1%}", ratio=False)
    diffs = [results[n]["summary"]["held_out"].get("final", {}).get("vs_sft", {}) for n in names]
    lines.append("| paired final - SFT | " + " | ".join(
        [f"{d['diff']:+.1%} [{d['ci95'][0]:+.1%}, {d['ci95'][1]:+.1%}]" if d else "-" for d in diffs] + [""] * len(ratios))
        + " |")
    lines.append("| load (start-end) | " + " | ".join(
        [f"{results[n]['load']:.1f}-{results[n]['load_end']:.1f}" for n in names] + [""] * len(ratios)) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compare", default=None, help="a checkout of the version to compare against (run first)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="passed to both versions")
    p.add_argument("--engines", nargs="+", choices=sorted(ENGINES), default=None,
                   help="this checkout with each of these generation engines, in this order")
    p.add_argument("--out", default=None, help="where the runs go (default: a temporary folder)")
    args = p.parse_args()
    root = Path(args.out or tempfile.mkdtemp(prefix="turngym-quickstart-"))
    if args.engines:  # name -> (tree, its own overrides, its environment)
        versions = {e: (str(HERE), *ENGINES[e]) for e in args.engines}
    elif args.compare:
        versions = {"before": (args.compare, [], {}), "after": (str(HERE), [], {})}
    else:
        versions = {"this": (str(HERE), [], {})}
    runs: dict[str, list[dict]] = {n: [] for n in versions}
    for r in range(args.rounds):
        for name, (tree, own, environ) in versions.items():
            runs[name].append(run_version(tree, root / f"{name}-{r}", args.set + own, environ))
            print(name, r, f"{runs[name][-1]['wall_s']:.0f} s", json.dumps(stage_seconds(runs[name][-1])), flush=True)
            bd = runs[name][-1]["summary"].get("time_breakdown")
            if bd:
                print(json.dumps(bd), flush=True)
    best = {n: min(rs, key=lambda x: x["wall_s"]) for n, rs in runs.items()}
    print(table(best))


if __name__ == "__main__":
    main()
