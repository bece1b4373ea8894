"""The integrations stay optional: ``import turngym`` loads none of them or their packages, and each
one, imported without its package, fails with the pip command that installs its extra."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ["trl", "openenv", "skyrl_gym", "datasets", "fastapi", "uvicorn"]


def run(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=300)


def test_import_turngym_loads_no_integration():
    out = run(f"import json, sys, turngym; print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r} "
              "or m.startswith('turngym.integrations'))))")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


@pytest.mark.parametrize("module, package, extra", [
    ("turngym.integrations.trl", "trl", "trl"),
    ("turngym.integrations.openenv", "openenv", "openenv"),
    ("turngym.integrations.skyrl", "skyrl_gym", "skyrl"),
])
def test_a_missing_extra_is_named_in_the_error(module, package, extra):
    out = run(f"import sys; sys.modules[{package!r}] = None\nimport {module}")  # None in sys.modules: not installed
    assert out.returncode != 0
    assert f'ImportError: turngym.integrations.{module.rsplit(".", 1)[-1]} needs the {package!r} package: ' \
           f'pip install "turngym[{extra}]"' in out.stderr


def test_the_openenv_command_names_the_extra_when_it_is_missing():
    out = run("import sys; sys.modules['openenv'] = None\nfrom turngym.cli import main; main(['openenv', 'turngym/Maze-v0'])")
    assert out.returncode == 1 and 'pip install "turngym[openenv]"' in out.stderr and "Traceback" not in out.stderr
