"""A run stores the weights it changed, once: tensors still equal to the model folder's are saved as
checked references to it (``agents.weights``), in SFT weights and in trainer checkpoints alike; the
final model is a bf16 Hugging Face folder."""

from __future__ import annotations

import pytest
import torch
from fixtures_model import build_tiny_model

from turngym.agents.hf import HFPolicy
from turngym.agents.weights import MIN_REF_BYTES, REF
from turngym.trainers.checkpoint import load_checkpoint, load_weights, save_checkpoint, save_weights


@pytest.fixture
def trained(tmp_path, tiny_tokenizer):
    """A policy loaded from a model folder (tied embeddings, as SmolLM2's), whose top block and
    final norm then changed, as ``trainable: top:1`` leaves them."""
    folder = tmp_path / "base"
    build_tiny_model(tiny_tokenizer, tie_word_embeddings=True).save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    policy = HFPolicy(str(folder))
    with torch.no_grad():
        for p in [*policy.model.model.layers[-1].parameters(), *policy.model.model.norm.parameters()]:
            p.add_(0.01)
    return policy, folder


def kept_names(model) -> set[str]:
    """What a save must store as it is: the changed tensors, and the small ones (norms)."""
    top = len(model.model.layers) - 1
    return {k for k, v in model.state_dict().items()
            if k.startswith((f"model.layers.{top}.", "model.norm.")) or v.numel() * v.element_size() < MIN_REF_BYTES}


def test_saved_weights_hold_the_changed_tensors_and_reload_exactly(trained, tmp_path):
    policy, _ = trained
    state = policy.model.state_dict()
    path = save_weights(state, tmp_path / "sft_model.pt")
    raw = torch.load(path, weights_only=True)
    kept = {k for k, v in raw.items() if isinstance(v, torch.Tensor)}
    assert kept == kept_names(policy.model)  # the tied head, the embeddings and block 0 are references
    assert all(raw[k][REF].endswith("model.safetensors") for k in set(raw) - kept)
    whole = tmp_path / "whole.pt"
    torch.save(state, whole)
    assert path.stat().st_size < 0.2 * whole.stat().st_size  # the tiny model is mostly embeddings
    back = load_weights(path)
    assert back.keys() == state.keys() and all(torch.equal(back[k], state[k]) for k in state)
    fresh = HFPolicy(str(trained[1]))
    fresh.model.load_state_dict(back)
    assert all(torch.equal(a, b) for a, b in zip(fresh.model.state_dict().values(), state.values()))


def test_a_checkpoint_compacts_its_model_and_resumes_exactly(trained, tmp_path):
    policy, _ = trained
    opt_state = {"step": torch.tensor(3.0)}
    save_checkpoint(tmp_path / "ckpt", {"model": policy.model.state_dict(), "opt": opt_state, "iteration": 2})
    raw = torch.load(tmp_path / "ckpt" / "state.pt", weights_only=False)
    assert {k for k, v in raw["model"].items() if isinstance(v, torch.Tensor)} == kept_names(policy.model)
    st = load_checkpoint(tmp_path / "ckpt", restore_rng=False)
    assert st["iteration"] == 2 and torch.equal(st["opt"]["step"], opt_state["step"])
    assert all(torch.equal(st["model"][k], v) for k, v in policy.model.state_dict().items())


def test_a_changed_or_missing_source_fails_loudly(trained, tmp_path, tiny_tokenizer):
    policy, folder = trained
    path = save_weights(policy.model.state_dict(), tmp_path / "sft_model.pt")
    build_tiny_model(tiny_tokenizer, seed=1, tie_word_embeddings=True).save_pretrained(folder)  # other weights
    with pytest.raises(ValueError, match="has changed since these weights were saved"):
        load_weights(path)
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="which is gone"):
        load_weights(path)


def test_a_model_no_folder_holds_is_saved_whole(tmp_path, tiny_tokenizer):
    model = build_tiny_model(tiny_tokenizer, seed=2)  # built here, not loaded: no file holds its weights
    raw = torch.load(save_weights(model.state_dict(), tmp_path / "w.pt"), weights_only=True)
    assert all(isinstance(v, torch.Tensor) for v in raw.values())
