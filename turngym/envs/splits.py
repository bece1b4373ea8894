"""Stable train/test splits shared by the env families."""

from __future__ import annotations

import hashlib


def split_of(task_id: str, test_fraction: float = 0.2) -> str:
    """``"train"`` or ``"test"`` from a hash of the task id: stable across runs, machines and
    Python versions (unlike ``hash()``), so the two splits never overlap."""
    h = int(hashlib.sha1(task_id.encode()).hexdigest()[:8], 16)
    return "test" if h % 1000 < test_fraction * 1000 else "train"
