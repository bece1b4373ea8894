"""Shared test fixtures: the real-data folder, and test-only env registrations."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))  # so entry points like "toy_envs:GuessEnv" resolve in workers too

import toy_envs  # noqa: E402,F401  (registers tests/Guess-v0)

pytest_plugins = ["fixtures_model"]

SHARED_DATA = TESTS.parent.parent / "shared" / "data"
if SHARED_DATA.is_dir():  # the data-backed envs and loaders resolve their data through TURNGYM_DATA
    os.environ.setdefault("TURNGYM_DATA", str(SHARED_DATA))


def shared_data_dir() -> Path | None:
    """``$TURNGYM_DATA`` when set (None if it is no folder: ``.ci/bare.sh`` hides the data that
    way), else ``../shared/data`` when present, else None."""
    env = os.environ.get("TURNGYM_DATA")
    p = Path(env) if env else SHARED_DATA
    return p if p.is_dir() else None


@pytest.fixture
def shared_data() -> Path:
    """The real task-data folder; skips the test when it is absent."""
    d = shared_data_dir()
    if d is None:
        pytest.skip("real task data not found: set TURNGYM_DATA or provide ../shared/data")
    return d
