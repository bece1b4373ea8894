"""Checkpoints that resume exactly: weights, optimizers, critic, replay buffer, RNGs, counters.

A checkpoint is a directory holding one file, ``state.pt``. It is written to a temporary file beside
it and moved over the old one with ``os.replace``, which is atomic: a run killed at any instant
leaves either the previous checkpoint or the new one, never a mix, and never a state from which
the next save fails.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` (tensors, state dicts, plain data) atomically to ``path/state.pt``.

    ``state["model"]`` may be a module: only its trainable state is needed for LoRA, but the
    full state dict is small for the models we train on CPU, so we keep it simple and exact.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / f"state.pt.tmp{os.getpid()}"
    torch.save({**state, "rng": rng_state()}, tmp)
    os.replace(tmp, path / "state.pt")  # the swap: old or new, whenever a kill comes
    for stale in path.glob("state.pt.tmp*"):  # left by saves that were killed mid-write
        stale.unlink(missing_ok=True)
    return path


def has_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` holds a complete checkpoint (a killed first save leaves none)."""
    path = Path(path)
    return (path / "state.pt").exists() or (path.with_name(path.name + ".old") / "state.pt").exists()


def load_checkpoint(path: str | Path, restore_rng: bool = True) -> dict[str, Any]:
    """Read a checkpoint written by ``save_checkpoint`` (and restore global RNGs by default).

    Raises:
        FileNotFoundError: no checkpoint at ``path``.
    """
    path = Path(path)
    f = path / "state.pt"
    if not f.exists():
        old = path.with_name(path.name + ".old") / "state.pt"  # a checkpoint from before the atomic swap
        if not old.exists():
            raise FileNotFoundError(f"no checkpoint at {path}")
        f = old
    state = torch.load(f, map_location="cpu", weights_only=False)
    if restore_rng:
        set_rng_state(state["rng"])
    return state
