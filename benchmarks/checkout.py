"""Run a Python child against one checkout's turngym, and check that it is that checkout's.

``python -m`` and ``python -c`` put the current folder first on ``sys.path``, ahead of
``PYTHONPATH``, and an editable install points at one checkout: a child started from another
folder silently imports the wrong version. A child runs in the checkout's folder, with it on
``PYTHONPATH``, and ``check_imports_from`` proves which turngym it gets.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def checkout_env(tree: str | Path, **extra: str) -> dict[str, str]:
    """The environment for a child that must import ``tree``'s turngym."""
    return {**os.environ, "PYTHONPATH": str(Path(tree).resolve()), **extra}


def check_imports_from(tree: str | Path) -> None:
    """Raise unless a child started as the benchmarks start theirs imports turngym from ``tree``."""
    tree = Path(tree).resolve()
    where = subprocess.run([sys.executable, "-c", "import turngym; print(turngym.__file__)"], cwd=tree,
                           env=checkout_env(tree), check=True, capture_output=True, text=True).stdout.strip()
    if not Path(where).resolve().is_relative_to(tree):
        raise RuntimeError(f"a child started in {tree} imports turngym from {where}, not from that checkout")
