"""Policies: scripted agents, HF / vLLM / HTTP LLM backends, chat and token assembly."""

from turngym.agents.base import Conversation, Policy, SamplingParams
from turngym.agents.registry import available_agents, make_agent, register_agent
from turngym.agents.scripted import OracleAgent, RandomAgent

__all__ = [
    "Conversation", "Policy", "SamplingParams", "OracleAgent", "RandomAgent",
    "make_agent", "register_agent", "available_agents",
]
