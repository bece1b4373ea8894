"""Loading a Hugging Face causal LM for ``HFPolicy``: from a folder or a hub id, with a one-line
error when a path holds no model, and without transformers' own progress bars in a run's log."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator

import torch

from turngym.agents.weights import note_source


def load_model(model_or_path: Any, tokenizer: Any, device: Any, dtype: Any) -> tuple[Any, Any]:
    """``(model, tokenizer)``: a loaded model moved to ``device``, or one read from a folder or hub
    id (fp32 on a CPU, bf16 on CUDA unless ``dtype``), its folder noted as the source of its
    weights (``weights.note_source``).

    Raises:
        ValueError: a loaded model without its tokenizer.
        FileNotFoundError: no model at the path (``model_folder``).
    """
    if not isinstance(model_or_path, (str, bytes)) and not hasattr(model_or_path, "__fspath__"):
        if tokenizer is None:
            raise ValueError("pass tokenizer=... together with a loaded model")
        model = model_or_path.to(device) if device is not None else model_or_path
        return model, tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = model_folder(str(model_or_path))
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = dtype or (torch.bfloat16 if str(device).startswith("cuda") else torch.float32)
    try:
        with no_transformers_bars():
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    except OSError as e:
        if Path(path).is_dir():
            raise
        raise FileNotFoundError(f"no model at {path}: no such folder here, and as a hub id: {e}") from e
    note_source(path)  # a checkpoint of this model stores only the tensors that change
    return model, tokenizer or AutoTokenizer.from_pretrained(path)


@contextlib.contextmanager
def no_transformers_bars() -> Iterator[None]:
    """Inside, transformers draws no progress bars of its own ("Loading weights", the GGUF
    conversion): loading a 135M model takes a second, and their redraws would fill a run's log."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def model_folder(path: str) -> str:
    """``path`` when it names a model folder here or may be a hub id (``org/name``).

    Raises:
        FileNotFoundError: ``path`` is a local path (it starts with ``/``, ``.`` or ``~``, or has
            more than one ``/``) with no model there, or a folder without a ``config.json``.
            Without this check, transformers reads it as a hub id and says only that the id is
            malformed.
    """
    local = Path(path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise FileNotFoundError(f"no model at {path}: the folder has no config.json (a Hugging Face model "
                                    "folder, e.g. a run's final_model)")
        return str(local)
    if local.exists():
        raise FileNotFoundError(f"no model at {path}: it is a file; give the model's folder")
    if path.startswith(("/", ".", "~")) or path.count("/") > 1 or "\\" in path:
        raise FileNotFoundError(f"no model at {path}: there is no such folder")
    return path
