"""Checkpoints that resume exactly: weights, optimizers, critic, replay buffer, RNGs, counters.

A checkpoint is one directory written to ``<dir>.tmp`` and renamed into place, so a run killed
while saving leaves the previous checkpoint intact.
"""

from __future__ import annotations

import random
import shutil
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
    """Write ``state`` (tensors, state dicts, plain data) atomically to the directory ``path``.

    ``state["model"]`` may be a module: only its trainable state is needed for LoRA, but the
    full state dict is small for the models we train on CPU, so we keep it simple and exact.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    torch.save({**state, "rng": rng_state()}, tmp / "state.pt")
    old = path.with_name(path.name + ".old")
    if path.exists():
        path.rename(old)
    tmp.rename(path)
    if old.exists():
        shutil.rmtree(old)
    return path


def load_checkpoint(path: str | Path, restore_rng: bool = True) -> dict[str, Any]:
    """Read a checkpoint written by ``save_checkpoint`` (and restore global RNGs by default).

    Raises:
        FileNotFoundError: no checkpoint at ``path``.
    """
    path = Path(path)
    f = path / "state.pt"
    if not f.exists():
        old = path.with_name(path.name + ".old") / "state.pt"  # killed between the two renames
        if not old.exists():
            raise FileNotFoundError(f"no checkpoint at {path}")
        f = old
    state = torch.load(f, map_location="cpu", weights_only=False)
    if restore_rng:
        set_rng_state(state["rng"])
    return state
