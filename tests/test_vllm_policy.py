"""VLLMPolicy. The GPU tests run only where CUDA and vLLM are present; elsewhere they skip."""

from __future__ import annotations

import importlib.util

import pytest

from turngym.agents.base import Conversation, SamplingParams
from turngym.types import Message

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not (HAS_VLLM and _cuda()), reason="needs CUDA and vLLM")


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_without_vllm_the_error_says_how_to_install():
    from turngym.agents.vllm import VLLMPolicy

    with pytest.raises(ImportError, match=r"pip install 'turngym\[vllm\]'"):
        VLLMPolicy("any-model")


def test_module_imports_without_vllm():
    import turngym.agents.vllm as mod

    assert hasattr(mod, "VLLMPolicy")
    assert mod._named_tensors({"a": __import__("torch").zeros(2)})[0][0] == "a"


@pytest.fixture(scope="module")
def saved_tiny(tiny_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    tiny_model.model.save_pretrained(path)
    tiny_model.tokenizer.save_pretrained(path)
    return path


def _convs(n):
    return [Conversation([Message("user", f"Task {i}: go north.")]) for i in range(n)]


@gpu
@needs_gpu
def test_vllm_logprobs_match_hf_scoring_and_weights_reload(tiny_model, saved_tiny):
    import torch

    from turngym.agents.hf import HFPolicy
    from turngym.agents.vllm import VLLMPolicy

    pol = VLLMPolicy(str(saved_tiny), dtype="float32", gpu_memory_utilization=0.2, enforce_eager=True)
    hf = HFPolicy(tiny_model.model.to("cuda"), tiny_model.tokenizer)
    convs = _convs(4)
    out = pol.act(convs, SamplingParams(temperature=1.0, max_new_tokens=16, seed=0))
    for u in out:
        assert len(u.action_ids) == len(u.logprobs) > 0
        ref = hf.score(u.prompt_ids, u.action_ids)
        torch.testing.assert_close(torch.tensor(u.logprobs), torch.tensor(ref), atol=2e-3, rtol=0)
    # Next turn extends the recorded prompt exactly.
    for c, u in zip(convs, out):
        c.messages += [Message("assistant", u.text), Message("user", "You see a door.")]
    nxt = pol.act(convs, SamplingParams(temperature=0.0, max_new_tokens=8))
    for u, v in zip(out, nxt):
        assert v.prompt_ids[: len(u.prompt_ids) + len(u.action_ids)] == u.prompt_ids + u.action_ids
    # New weights without a restart: scores must now match the perturbed model.
    perturbed = {k: v.clone() for k, v in tiny_model.model.state_dict().items()}
    perturbed["lm_head.weight"] *= 2.0
    pol.load_weights(perturbed)
    tiny_model.model.load_state_dict(perturbed)
    try:
        u = pol.act(_convs(1), SamplingParams(temperature=0.0, max_new_tokens=8))[0]
        ref = hf.score(u.prompt_ids, u.action_ids)
        torch.testing.assert_close(torch.tensor(u.logprobs), torch.tensor(ref), atol=2e-3, rtol=0)
    finally:
        perturbed["lm_head.weight"] /= 2.0
        tiny_model.model.load_state_dict(perturbed)
        tiny_model.model.to("cpu")
