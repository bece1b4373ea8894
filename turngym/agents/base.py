"""The policy interface: conversations in, utterances (with exact tokens) out.

A ``Conversation`` is one episode as the agent sees it: the messages so far, the env's tools and
tool format, and the env's latest ``info``. LLM policies render messages + tools through a chat
template; scripted agents read ``info`` (``oracle_action``, ``admissible_actions``) instead. Both
answer through ``Policy.act``, so the rollout, eval and bench code never special-cases either.

The three nouns live in ``turngym.types`` (an env whose counterpart is a language model uses them
too); this module is where the agents room names them.
"""

from __future__ import annotations

from turngym.types import Conversation, Policy, SamplingParams  # noqa: F401  (the interface's home is types.py)

__all__ = ["Conversation", "Policy", "SamplingParams"]
