"""Agents by name, for the CLI and configs: ``oracle``, ``random``, ``default``, ``hf:PATH``, ...

A spec is ``NAME`` or ``NAME:ARG``; the factory registered under NAME gets ARG ("" if absent).
Factories import their backend lazily, so listing agents never loads torch or vLLM.
"""

from __future__ import annotations

from typing import Callable

from turngym.agents.base import Policy

AgentFactory = Callable[[str], Policy]
_AGENTS: dict[str, tuple[AgentFactory, str]] = {}


def register_agent(name: str, factory: AgentFactory, help: str = "") -> None:
    """Make ``make_agent(f"{name}:ARG")`` call ``factory(ARG)``."""
    _AGENTS[name] = (factory, help)


def make_agent(spec: str) -> Policy:
    """Build the agent a spec names.

    Raises:
        ValueError: no agent is registered under the spec's name.
    """
    name, _, arg = spec.partition(":")
    if name not in _AGENTS:
        raise ValueError(f"unknown agent {spec!r}; choose from: {', '.join(available_agents())}")
    return _AGENTS[name][0](arg)


def available_agents() -> list[str]:
    return [f"{n}" + (f" ({h})" if h else "") for n, (_, h) in sorted(_AGENTS.items())]


def _oracle(arg: str) -> Policy:
    from turngym.agents.scripted import OracleAgent

    return OracleAgent()


def _random(arg: str) -> Policy:
    from turngym.agents.scripted import RandomAgent

    return RandomAgent(seed=int(arg) if arg else 0)


register_agent("oracle", _oracle, "the env's expert actions")
register_agent("random", _random, "random admissible actions; random:SEED")


def _default(arg: str) -> Policy:
    from turngym.agents.default_model import load_default

    return load_default(device=arg or None)


def _hf(arg: str) -> Policy:
    if not arg:
        raise ValueError("hf:PATH needs a model folder or hub id, e.g. hf:HuggingFaceTB/SmolLM2-135M-Instruct")
    from turngym.agents.hf import HFPolicy

    return HFPolicy(arg)


def _openai(arg: str) -> Policy:
    import os

    from turngym.agents.http import OpenAIPolicy

    return OpenAIPolicy.from_spec(arg, api_key=os.environ.get("OPENAI_API_KEY"))


def _vllm(arg: str) -> Policy:
    if not arg:
        raise ValueError("vllm:PATH needs a model folder or hub id")
    from turngym.agents.vllm import VLLMPolicy

    return VLLMPolicy(arg)


register_agent("default", _default, "embedded SmolLM2-135M-Instruct on CPU; default:cuda for GPU")
register_agent("hf", _hf, "any Hugging Face causal LM: hf:PATH")
register_agent("openai", _openai, "OpenAI-compatible server: openai:URL#MODEL[?timeout=S&retries=N&concurrency=N&token_ids=auto] (key from $OPENAI_API_KEY)")
register_agent("vllm", _vllm, "vLLM engine (GPU, or CPU via scripts/install_vllm_cpu.sh): vllm:PATH")
