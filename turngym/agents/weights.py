"""Where a model's weights came from, so that a run stores only the weights it changed.

On a CPU only the top blocks of a model train (``trainable: top:8`` trains 8 of SmolLM2's 30): the
rest, and the embeddings, stay what the model folder holds. A state dict saved whole repeats those
frozen tensors in every file of a run (the SFT weights, each checkpoint): 538 MB each, of which
113 MB changed. Instead, a model loaded from a folder records the folder's safetensors files here
(``note_source``), and ``compact`` replaces every tensor of a state dict that is equal to the one
under the same name in such a file by a reference to it; ``expand`` reads the references back and
checks each against a checksum taken when it was written, so a changed or missing source fails
loudly instead of loading other weights.

    note_source(folder)                  # done by the model loaders
    torch.save(compact(model.state_dict()), path)
    model.load_state_dict(expand(torch.load(path)))
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

REF = "turngym.weights_ref"  # the key that marks a reference in a saved state dict
_SOURCES: list[Path] = []


MIN_REF_BYTES = 64 * 1024  # smaller tensors (norms, biases) are stored as they are: a ones vector
                           # equals every fresh model's, and a reference would tie the file to any of them


def note_source(folder: str | Path) -> None:
    """Record the safetensors files of a model folder as a source of unchanged weights (the latest
    noted is searched first: the model loaded last is the likeliest source of what is saved next)."""
    for f in sorted(Path(folder).glob("*.safetensors")):
        f = f.resolve()
        if f in _SOURCES:
            _SOURCES.remove(f)
        _SOURCES.insert(0, f)


def sources() -> list[Path]:
    """The safetensors files noted so far (in this process)."""
    return list(_SOURCES)


def checksum(t: torch.Tensor) -> str:
    """A digest of a tensor's bytes (a float sum would depend on the threads that summed it)."""
    import torch

    raw = t.detach().cpu().contiguous().flatten().view(torch.uint8).numpy()
    return hashlib.blake2b(memoryview(raw), digest_size=16).hexdigest()


def compact(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with each tensor that equals the same-named tensor of a noted source replaced by
    a reference (a tensor that shares its storage with one replaced, such as a tied LM head, is
    replaced by the same reference). Tensors that differ, and any other value, are kept."""
    files = [f for f in _SOURCES if f.exists()]
    if not files:
        return dict(state)
    import torch
    from safetensors import safe_open

    out = dict(state)
    by_storage: dict[tuple, dict] = {}
    handles = [safe_open(str(f), framework="pt") for f in files]
    names = [set(h.keys()) for h in handles]
    for key, t in state.items():
        if not isinstance(t, torch.Tensor) or t.numel() * t.element_size() < MIN_REF_BYTES:
            continue
        ident = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
        if ident in by_storage:
            out[key] = by_storage[ident]
            continue
        for f, h, keys in zip(files, handles, names):
            if key in keys:
                src = h.get_slice(key)
                if tuple(src.get_shape()) == tuple(t.shape) and torch.equal(h.get_tensor(key), t.detach().cpu()):
                    out[key] = by_storage[ident] = {REF: str(f), "name": key, "checksum": checksum(t)}
                break
    return out


def expand(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with its references read back from their files.

    Raises:
        FileNotFoundError: a referenced file is gone.
        ValueError: a referenced tensor is no longer the one that was saved.
    """
    refs = [v for v in state.values() if isinstance(v, dict) and REF in v]
    if not refs:
        return state
    from safetensors import safe_open

    out, read = dict(state), {}
    for key, v in state.items():
        if not (isinstance(v, dict) and REF in v):
            continue
        where = (v[REF], v["name"])
        if where not in read:
            path = Path(v[REF])
            if not path.exists():
                raise FileNotFoundError(f"these weights keep {v['name']} in {path}, which is gone; the run needs the model "
                                        "it started from (reinstall it, or rerun the stage)")
            with safe_open(str(path), framework="pt") as h:
                t = h.get_tensor(v["name"])
            if checksum(t) != v["checksum"]:
                raise ValueError(f"{v['name']} in {path} has changed since these weights were saved; the run needs "
                                 "the model it started from")
            read[where] = t
        out[key] = read[where]
    return out
