"""The command line as a new user meets it: one-line errors (``--debug`` for the traceback), envs of
one's own named as ``pkg.module:ns/Name-v0`` from one's own folder (eval, train, bench, mcp),
``turngym train --env``, ``--algo`` naming every algorithm, ``eval --out`` a folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from turngym.cli import build_parser, main
from turngym.trainers.registry import algorithm_names

ROOT = Path(__file__).resolve().parent.parent
CLI = Path(sys.executable).parent / "turngym"


def test_errors_are_one_line_and_debug_shows_the_traceback(capsys):
    assert main(["eval", "--env", "mine/Guess-v0"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("turngym eval: error: ValueError: unknown env id 'mine/Guess-v0'")
    assert "--env your_package.your_module:mine/Guess-v0" in err and "(--debug shows the traceback)" in err
    for argv in (["--debug", "eval", "--env", "mine/Guess-v0"], ["eval", "--env", "mine/Guess-v0", "--debug"]):
        with pytest.raises(ValueError, match="unknown env id"):
            main(argv)


def test_a_module_that_cannot_be_imported_is_one_line(capsys):
    assert main(["eval", "--env", "no_such_package.envs:mine/Guess-v0"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot import 'no_such_package.envs'" in err and "run from the folder" in err


def test_an_agent_path_with_no_model_says_so(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    for path, why in ((tmp_path / "missing", "there is no such folder"), ("runs/nothing/final_model", "there is no such folder"),
                      (tmp_path / "empty", "the folder has no config.json")):
        assert main(["eval", "--env", "turngym/Maze-v0", "--agent", f"hf:{path}", "--episodes", "1"]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"FileNotFoundError: no model at {path}: {why}" in err, err


def test_algo_lists_every_algorithm_the_code_has(capsys):
    names = algorithm_names()
    assert {"branch_bc", "archer", "grpo", "gigpo", "rloo", "reinforce", "filtered_bc"} <= set(names)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for algo in names:
        assert algo in help_text, algo
    assert main(["train", "--algo", "ppo"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown algorithm 'ppo'" in err and "branch_bc" in err


def test_show_config_prints_the_config_this_command_would_run(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("algo: archer\narcher: {iterations: 3}\n")
    assert main(["train", "--config", str(config), "--set", "archer.critic_epochs=7", "--show-config"]) == 0
    shown = capsys.readouterr().out
    assert "algo = 'archer'" in shown and "  iterations = 3  #" in shown and "  critic_epochs = 7  #" in shown


def test_train_env_sets_the_env_and_checks_it_before_training(capsys):
    # the toy env has 4 tasks: 999 held-out games fail at once, naming the knob and the fix
    argv = ["train", "--env", "tests/Guess-v0", "--set", "train_split=", "--set", "eval.split=",
            "--set", "eval.episodes=999", "--set", "env_kwargs={}"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "eval.episodes=999" in err and "tests/Guess-v0 has 4 tasks" in err
    assert "--set eval.episodes=4" in err


def test_eval_out_may_be_a_folder(tmp_path, capsys):
    argv = ["eval", "--env", "tests/Guess-v0", "--agent", "oracle", "--episodes", "2", "--split", "", "--quiet"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    (written,) = tmp_path.glob("tests_Guess-v0__oracle__*.json")
    assert json.loads(written.read_text())["summary"]["success"] == 1.0
    assert main([*argv, "--out", str(tmp_path / "new") + "/"]) == 0  # a folder to be, by its trailing slash
    assert len(list((tmp_path / "new").glob("*.json"))) == 1
    assert main([*argv, "--out", str(tmp_path / "one.json")]) == 0 and (tmp_path / "one.json").is_file()


# ----- an env of one's own, from one's own folder, through the installed console script -----------------
USER_ENVS = (Path(__file__).parent / "toy_envs.py").read_text().replace("toy_envs:GuessEnv", "user_envs:GuessEnv")


@pytest.fixture
def user_folder(tmp_path):
    """A folder holding ``user_envs.py`` (registers ``tests/Guess-v0``), and the environment to run
    the console script in: this checkout on PYTHONPATH, the folder itself not."""
    if not CLI.exists():
        pytest.skip(f"the turngym console script is not installed next to {sys.executable}")
    (tmp_path / "user_envs.py").write_text(USER_ENVS)
    return tmp_path, {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _turngym(args, folder, env):
    return subprocess.run([str(CLI), *args], cwd=folder, env=env, capture_output=True, text=True, timeout=300)


def test_bench_imports_the_users_module_from_the_current_folder(user_folder):
    folder, env = user_folder
    r = _turngym(["bench", "--env", "user_envs:tests/Guess-v0", "--split", "", "--agent", "oracle", "--episodes", "3",
                  "--in-process", "--out", "runs/b", "--quiet"], folder, env)
    assert r.returncode == 0, r.stderr
    results = json.loads((folder / "runs" / "b" / "results.json").read_text())
    assert results["envs"]["tests/Guess-v0"]["success"] == 1.0 and results["envs"]["tests/Guess-v0"]["episodes"] == 3
    missing = _turngym(["bench", "--env", "tests/Guess-v0", "--agent", "oracle"], folder, env)
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1 and "unknown env id" in missing.stderr


def test_mcp_imports_the_users_module_from_the_current_folder(user_folder):
    anyio = pytest.importorskip("anyio")
    pytest.importorskip("mcp", reason="needs the MCP SDK: pip install 'turngym[mcp]'")
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    folder, env = user_folder
    params = StdioServerParameters(command=str(CLI), args=["mcp", "user_envs:tests/Guess-v0"], cwd=str(folder), env=env)

    async def play():
        with anyio.fail_after(120):  # a hang guard for the subprocess, not a timing assertion
            async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
                await s.initialize()
                assert sorted(t.name for t in (await s.list_tools()).tools) == ["guess", "reset"]
                await s.call_tool("reset", {"task_id": "3", "seed": 0})
                out = (await s.call_tool("guess", {"number": 3})).structured_content
                assert out["reward"] == 1.0 and out["terminated"]

    anyio.run(play)


def test_train_under_torchrun_finishes_on_every_rank(user_folder, tiny_tokenizer):
    # the whole path (SFT, GRPO, evaluations) on 2 gloo ranks through the CLI; every rank must exit 0,
    # which needs the process group left before interpreter exit
    from fixtures_model import build_tiny_model

    folder, env = user_folder
    build_tiny_model(tiny_tokenizer).save_pretrained(folder / "tiny")
    tiny_tokenizer.save_pretrained(folder / "tiny")
    (folder / "run.yaml").write_text(f"""
model: hf:{folder / 'tiny'}
algo: grpo
env_id: user_envs:tests/Guess-v0
env_kwargs: {{}}
train_split: ""
output_dir: runs/ddp
sft: {{episodes: 2, epochs: 1, batch_size: 2, autocast: none}}
pg: {{iterations: 1, task_sampling: uniform, episodes_per_iter: 4, group_size: 2, num_envs: 2, max_new_tokens: 6,
      autocast: none}}
eval: {{episodes: 2, split: "", max_new_tokens: 6, num_envs: 2, zero_shot: false, allow_train_overlap: true}}
""")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        "-m", "turngym.cli", "train", "--config", "run.yaml", "--quiet"],
                       cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((folder / "runs" / "ddp" / "summary.json").read_text())
    assert set(summary["success"]) == {"sft", "final"}
    assert (folder / "runs" / "ddp" / "grpo" / "metrics.jsonl").read_text().count("\n") == 1
    assert r.stdout.count('"held_out_episodes"') == 1  # rank 0 alone prints the summary
    assert r.stderr.count("WARNING: the held-out evaluation is not fully held out") == 1  # and warns
