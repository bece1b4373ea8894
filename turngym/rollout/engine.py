"""The generation engine: who samples a run's episodes. ``hf`` is the trained HF policy itself;
``vllm`` is a vLLM engine that generates the trainer's rollouts (and held-out evaluations) while the
HF model trains (``rollout_engine: vllm``). The ``Collector`` holds the engine of a run.

The split is the usual one of RL trainers for LLMs (verl, OpenRLHF, TRL's vLLM mode): the HF model
owns the weights, gradients and optimizer; a vLLM engine, started once from a copy of the starting
weights, samples the episodes; before each collection the trainer pushes its current weights into
the engine (``VLLMPolicy.load_weights``, no restart). The engine records exact prompt/action ids and
its own log-probs at sampling time, so nothing is re-tokenized.

Because two engines compute the log-probs, the PPO ratio's old log-probs are rescored with the
training forward by default (``old_logprobs: auto``; see ``actor.rescore_old_logprobs``): on this
CPU in fp32 the two agree within 2e-3, but a bf16 engine on a GPU does not.

Limits: one process (not under torchrun) and full weights (``trainable: all`` or ``top:K``): LoRA's
adapters would have to be merged before each sync; use ``rollout_engine: hf`` with LoRA.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

# What the engine gets unless the config says otherwise. The KV cache must hold every episode in
# flight: SmolLM2-135M in fp32 needs 46 KB per token, so 32 TextWorld episodes of about 1,500 tokens
# take about 2.2 GB; vLLM preempts (recomputes) requests that do not fit.
DEFAULT_VLLM_KWARGS: dict[str, Any] = {"max_model_len": 4096, "kv_cache_gib": 4}


class VLLMRollouts:
    """A ``VLLMPolicy`` built from ``policy``'s weights, kept in step with them by ``sync``.

    Args:
        policy: The trained ``HFPolicy`` (its model, tokenizer and chat template are copied).
        vllm_kwargs: Engine options (``vllm.LLM`` keyword arguments), over ``DEFAULT_VLLM_KWARGS``;
            ``kv_cache_gib`` sets ``VLLM_CPU_KVCACHE_SPACE`` on a CPU.
        folder: Where the starting weights are written for the engine to load (default: a
            temporary folder, removed by ``close``).

    Raises:
        ImportError: vLLM is not installed (``bash scripts/install_vllm_cpu.sh`` on a CPU).
    """

    def __init__(self, policy: Any, vllm_kwargs: dict | None = None, folder: str | Path | None = None) -> None:
        from turngym.agents.vllm import VLLMPolicy

        kwargs = {**DEFAULT_VLLM_KWARGS, **(vllm_kwargs or {})}
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kwargs.pop("kv_cache_gib")))
        self._own_folder = folder is None
        self.folder = Path(folder or tempfile.mkdtemp(prefix="turngym-vllm-"))
        model = policy.model
        model.save_pretrained(self.folder, state_dict=engine_state_dict(model))
        policy.tokenizer.save_pretrained(self.folder)
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        self.policy = VLLMPolicy(str(self.folder), chat_template=policy.chat.template, **{"dtype": dtype, **kwargs})
        self.synced_version: Any = "start"  # the engine holds the weights it was built from

    def sync(self, model: torch.nn.Module, version: Any = None) -> bool:
        """Push ``model``'s weights into the engine unless ``version`` is the one already there
        (``None`` always pushes). Returns whether it pushed."""
        if version is not None and version == self.synced_version:
            return False
        self.policy.load_weights(engine_state_dict(model))
        self.synced_version = version
        return True

    @property
    def sync_seconds(self) -> list[float]:
        return self.policy.sync_seconds

    def close(self) -> None:
        """Shut the engine down and remove the temporary weights folder."""
        llm = getattr(self.policy, "llm", None)
        engine = getattr(llm, "llm_engine", None)
        if engine is not None and hasattr(engine, "engine_core"):
            engine.engine_core.shutdown()
        if self._own_folder:
            shutil.rmtree(self.folder, ignore_errors=True)


ENGINES = ("hf", "vllm", "auto")


def resolve_engine(name: str, allowed: bool) -> str:
    """``name`` with ``auto`` decided: ``vllm`` on a GPU where vLLM is installed and the run
    ``allowed`` it (one process, synchronous collection, full weights), else ``hf``. On a CPU ``auto``
    is ``hf``: there the whole quickstart took as long with vLLM as with HF when vLLM generated
    1.56x faster than HF's fp32 path (2026-11-23), and HF has since gained packed bf16 forwards
    (2.8x on an evaluation) and drafted greedy decoding; on 2026-11-26 the whole quickstart with an
    in-process bf16 engine took 0.92-1.06x of HF's time, and on 2026-11-27, on a CPU without AMX,
    1.12x (docs/benchmarks.md).

    Raises:
        ValueError: an unknown engine name.
    """
    if name not in ENGINES:
        raise ValueError(f"rollout_engine must be hf, vllm or auto, got {name!r}")
    if name != "auto":
        return name
    from turngym.agents.vllm import vllm_available

    return "vllm" if allowed and torch.cuda.is_available() and vllm_available() else "hf"


def engine_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights as the engine names them: the HF model's own state dict.

    Raises:
        ValueError: the model carries LoRA adapters (vLLM would need them merged first).
    """
    if hasattr(model, "peft_config"):
        raise ValueError("rollout_engine=vllm needs full weights; with trainable=lora use rollout_engine=hf")
    return model.state_dict()
