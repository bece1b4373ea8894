"""Checkpoints that resume exactly: weights, optimizers, critic, replay buffer, RNGs, counters.

A checkpoint is a directory holding one file, ``state.pt``. It is written to a temporary file beside
it and moved over the old one with ``os.replace``, which is atomic: a run killed at any instant
leaves either the previous checkpoint or the new one, never a mix, and never a state from which
the next save fails.

The model's weights are stored once: a tensor still equal to the one in the folder the model was
loaded from (on a CPU, every block but the top ones that train, and the embeddings) is stored as
a checked reference to that file (``agents.weights``), so a quickstart checkpoint holds 113 MB of
weights instead of 538. ``save_weights`` / ``load_weights`` do the same for a bare state dict
(the SFT stage's weights).
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from turngym.agents.weights import compact, expand


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` (tensors, state dicts, plain data) atomically to ``path/state.pt``; the
    tensors of ``state["model"]`` (a state dict) that the model's source folder holds unchanged
    are stored as references to it."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / f"state.pt.tmp{os.getpid()}"
    if isinstance(state.get("model"), dict):
        state = {**state, "model": compact(state["model"])}
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
    if isinstance(state.get("model"), dict):
        state["model"] = expand(state["model"])
    if restore_rng:
        set_rng_state(state["rng"])
    return state


def save_weights(state_dict: dict[str, torch.Tensor], path: str | Path) -> Path:
    """Write a model's state dict atomically, its unchanged tensors as references (see above)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(compact(state_dict), tmp)
    os.replace(tmp, path)
    return path


def load_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """A state dict written by ``save_weights`` (or by ``torch.save``), its references read back.

    Raises:
        FileNotFoundError, ValueError: a referenced source is gone or changed (``weights.expand``).
    """
    return expand(torch.load(path, map_location="cpu", weights_only=True))
