"""Envs whose counterpart is a language model (an LLM answerer, a simulated buyer) take a ``Policy``
or an agent spec such as ``"default"`` or ``"hf:PATH"``.

Envs sit below agents in the house, so they do not import ``make_agent``: ``turngym.agents``
installs it here when it is imported (``import turngym`` does that), and ``resolve_agent`` calls it.
"""

from __future__ import annotations

from typing import Any, Callable

from turngym.types import Policy

_resolver: Callable[[str], Policy] | None = None


def set_agent_resolver(fn: Callable[[str], Policy]) -> None:
    """Install the function that turns an agent spec into a policy (``turngym.agents.make_agent``)."""
    global _resolver
    _resolver = fn


def resolve_agent(agent: Any) -> Policy:
    """``agent`` itself if it is a policy, else the policy its spec names.

    Raises:
        RuntimeError: a spec was given and ``turngym.agents`` was never imported.
    """
    if not isinstance(agent, str):
        return agent
    if _resolver is None:
        raise RuntimeError(f"cannot build agent {agent!r}: import turngym.agents first (import turngym does)")
    return _resolver(agent)
