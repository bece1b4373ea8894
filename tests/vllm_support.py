"""Whether vLLM can run here, and the head-size-32 tiny model its CPU attention accepts."""

from __future__ import annotations

import importlib.util

import pytest

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def vllm_device() -> str | None:
    """``cuda``, ``cpu`` (vLLM's CPU platform) or None (no vLLM, or no device it can use)."""
    from turngym.agents.vllm import vllm_available

    if not vllm_available():
        return None
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


needs_engine = pytest.mark.skipif(vllm_device() is None, reason="needs vLLM with CUDA or its CPU build "
                                  "(bash scripts/install_vllm_cpu.sh, then run with .venv-vllm/bin/python)")


def build_tiny32(tokenizer):
    """The unit-test Llama with 2 heads of size 32 (vLLM's CPU attention has no kernel for 16)."""
    from fixtures_model import build_tiny_model

    return build_tiny_model(tokenizer, num_attention_heads=2, num_key_value_heads=1)
