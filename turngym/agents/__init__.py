"""Policies: scripted agents, HF / vLLM / HTTP LLM backends, chat and token assembly."""

from turngym.agents.base import Conversation, Policy, SamplingParams
from turngym.agents.registry import available_agents, make_agent, register_agent
from turngym.agents.scripted import OracleAgent, RandomAgent
from turngym.envs.counterpart import set_agent_resolver

set_agent_resolver(make_agent)  # envs with an LLM counterpart build it from a spec

__all__ = [
    "Conversation", "Policy", "SamplingParams", "OracleAgent", "RandomAgent",
    "make_agent", "register_agent", "available_agents",
    "load_default", "HFPolicy", "OpenAIPolicy", "VLLMPolicy", "ChatRenderer",
]

# LLM backends import torch / httpx / vllm; they load on first access (PEP 562), so that
# `import turngym.agents` stays light.
_LAZY = {
    "load_default": "turngym.agents.default_model",
    "HFPolicy": "turngym.agents.hf",
    "OpenAIPolicy": "turngym.agents.http",
    "VLLMPolicy": "turngym.agents.vllm",
    "ChatRenderer": "turngym.agents.chat",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'turngym.agents' has no attribute {name!r}")
