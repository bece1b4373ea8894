"""Kill-anywhere resume of ``turngym train``: SIGKILL the command at random instants, rerun it, and
the finished run must equal an uninterrupted one (held-out results, every metrics row, the stages).

The runs are real ``turngym train`` processes (the CLI, the tiny model, the toy env): a kill can land
in imports, an evaluation, SFT, an RL iteration, a checkpoint write, the final model or summary.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from fixtures_model import build_tiny_model

TESTS = Path(__file__).resolve().parent
VOLATILE = ("time", "rollout/seconds", "rollout/tokens_per_s", "train_seconds", "search/seconds")  # wall-clock readings differ run to run


def _config(tmp_path: Path, tokenizer) -> Path:
    model_dir = tmp_path / "tiny"
    if not model_dir.exists():
        build_tiny_model(tokenizer).save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
    cfg = {
        "model": f"hf:{model_dir}", "algo": "archer", "env_id": "tests/Guess-v0", "env_kwargs": {}, "train_split": "",
        "sft": {"episodes": 2, "epochs": 1, "batch_size": 2, "autocast": "none"},
        "archer": {"iterations": 3, "episodes_per_iter": 2, "num_envs": 2, "max_new_tokens": 6, "critic_epochs": 2,
                   "critic_states": 4, "actor_states": 2, "warmup_iters": 0, "critic_encoder": "reference", "autocast": "none", "reward": ["env", "format"]},
        "eval": {"episodes": 2, "split": "", "max_new_tokens": 6, "num_envs": 2,
                 "allow_train_overlap": True},  # the toy env has no splits: its held-out tasks are its training tasks
    }
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _start(config: Path, out: Path) -> subprocess.Popen:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import toy_envs; from turngym.cli import main; "
            "sys.exit(main(['train', '--config', sys.argv[2], '--output-dir', sys.argv[3], '--quiet']))")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.Popen([sys.executable, "-c", code, str(TESTS), str(config), str(out)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _finish(config: Path, out: Path) -> None:
    proc = _start(config, out)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, f"a restart failed:\n{err[-3000:]}"


def _result(out: Path) -> dict:
    rows = [json.loads(line) for line in (out / "archer" / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        for k in [k for k in r if k in VOLATILE or k.startswith("time/")]:
            r.pop(k)
    summary = json.loads((out / "summary.json").read_text())
    stages = json.loads((out / "stages.json").read_text())
    for s in stages.values():
        if isinstance(s, dict):
            for k in [k for k in s if "wall" in k or "second" in k or k.endswith("_s")]:
                s.pop(k)
    return {"success": summary["success"], "rows": rows, "stages": stages,
            "final_model": sorted(p.name for p in (out / "final_model").iterdir())}


def kill_campaign(tmp_path: Path, tokenizer, kills: int, seed: int) -> int:
    """Kill runs at random instants until ``kills`` kills hit a live process; finish each campaign and
    compare it with an uninterrupted run. Returns how many campaigns it took."""
    config = _config(tmp_path, tokenizer)
    ref = tmp_path / "ref"
    t0 = time.monotonic()
    _finish(config, ref)
    whole = time.monotonic() - t0
    expected = _result(ref)
    rng = random.Random(seed)
    done, campaigns = 0, 0
    while done < kills:
        campaigns += 1
        out = tmp_path / f"killed{campaigns}"
        while done < kills:
            proc = _start(config, out)
            try:
                proc.wait(timeout=rng.uniform(0.2, whole))
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                done += 1
                continue
            assert proc.returncode == 0, f"a restart failed:\n{proc.stderr.read()[-3000:]}"
            break  # this campaign's run got to the end between kills
        _finish(config, out)  # a rerun of a finished run is a no-op that must also succeed
        assert _result(out) == expected
    return campaigns


def test_train_killed_at_random_instants_resumes_to_the_uninterrupted_result(tmp_path, tiny_tokenizer):
    kill_campaign(tmp_path, tiny_tokenizer, kills=4, seed=0)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_train_survives_a_campaign_of_twenty_kills(tmp_path, tiny_tokenizer):
    campaigns = kill_campaign(tmp_path, tiny_tokenizer, kills=20, seed=1)
    print(f"20 kills over {campaigns} campaigns, each finished equal to the uninterrupted run")
