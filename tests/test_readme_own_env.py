"""The README's "Add your own environment" and "Train from Python", run verbatim from a fresh folder
as a new user would: the env file saved as the README says, each shell command through the
installed ``turngym`` console script (which, unlike ``python -m``, does not put the current folder
on ``sys.path``), and the Python script with ``python train_guess.py``.

The one difference from a user's machine: ``TURNGYM_CACHE`` points at a folder whose "embedded
model" is the tiny random test model, so ``default`` trains in seconds. Everything else (the model
loading path, the tokenizer, the trainers) is the real one.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures_model import build_tiny_model

from turngym.agents import default_model

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
CLI = Path(sys.executable).parent / "turngym"


def section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end]


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_tokenizer):
    """A user's folder holding the README's env module, and the environment its commands run in."""
    if not CLI.exists():
        pytest.skip(f"the turngym console script is not installed next to {sys.executable}")
    own, py = section("Add your own environment"), section("Train from Python")
    assert "save this as `my_package/my_envs.py`" in own and "save as `train_guess.py`" in py
    folder = tmp_path_factory.mktemp("my_project")
    (folder / "my_package").mkdir()
    (folder / "my_package" / "my_envs.py").write_text(blocks(own, "python")[0])
    (folder / "train_guess.py").write_text(blocks(py, "python")[0])
    cache = tmp_path_factory.mktemp("turngym_cache")
    model = cache / "models" / default_model.MODEL_NAME
    build_tiny_model(tiny_tokenizer).save_pretrained(model)
    tiny_tokenizer.save_pretrained(model)
    # the marker that says "this folder is the current conversion of the embedded GGUF"
    marker = default_model._source_marker(default_model.gguf_path())
    (model / default_model._MARKER).write_text(json.dumps(marker))
    env = {**os.environ, "TURNGYM_CACHE": str(cache), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT)}  # this checkout's turngym; the user's folder is not on it
    return folder, env


def run(argv: list[str], folder: Path, env: dict) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"{shlex.join(argv)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def readme_commands() -> list[list[str]]:
    lines = blocks(section("Add your own environment"), "bash")[0].strip().splitlines()
    return [shlex.split(line, comments=True) for line in lines]


def written(stdout: str, folder: Path) -> dict:
    return json.loads((folder / re.search(r"^wrote (.+)$", stdout, re.M).group(1)).read_text())


def test_readme_commands_run_from_the_users_folder(project):
    folder, env = project
    cmds = readme_commands()
    assert [c[:2] for c in cmds] == [["turngym", "eval"], ["turngym", "eval"], ["turngym", "train"]]
    outs = [run([str(CLI), *c[1:], "--quiet"], folder, env) for c in cmds]

    oracle, rand = written(outs[0].stdout, folder)["summary"], written(outs[1].stdout, folder)["summary"]
    # the oracle bisects on "higher" / "lower": a strategy a policy can learn from what it sees
    assert oracle["success"] == 1.0 and oracle["episodes"] == 20 and 4 < oracle["mean_turns"] <= 7
    # the example lists no admissible actions: the random agent samples calls from the tool's schema
    assert rand["invalid_action_rate"] < 0.5 and rand["episodes"] == 20

    summary = json.loads((folder / "runs" / "guess" / "summary.json").read_text())
    assert summary["env_id"] == "mine/Guess-v0" and summary["held_out"]["final"]["n"] == 20
    check = summary["held_out_check"]
    assert check["id_overlap"] == [] and check["content_overlap"] == [] and check["content_checked"]["test"] == 20
    assert (folder / "runs" / "guess" / "stages.png").exists()


def test_readme_python_script_trains_the_pipeline_and_a_trainer_with_its_own_reward(project):
    folder, env = project
    out = run([sys.executable, "train_guess.py"], folder, env).stdout
    summary = json.loads((folder / "runs" / "guess_py" / "summary.json").read_text())
    assert summary["held_out"]["final"]["n"] == 20 and "'final'" in out
    rows = [json.loads(line) for line in (folder / "runs" / "guess_grpo" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["step"] == 1  # one iteration (make_reward found the registered turn_cost)


def test_readme_env_passes_gymnasiums_checker_unpatched(project):
    folder, env = project
    code = ("import gymnasium, my_package.my_envs\n"
            "from gymnasium.utils.env_checker import check_env\n"
            "check_env(gymnasium.make('mine/Guess-v0').unwrapped, skip_render_check=True)\n"
            "print('ok')")
    assert run([sys.executable, "-c", code], folder, env).stdout.strip().endswith("ok")
