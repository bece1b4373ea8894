"""turngym: a multi-turn agentic RL gym and trainer.

    import turngym
    env = turngym.make("turngym/TextWorld-easy-v0")
    obs, info = env.reset(seed=0)
"""

import os

# Torch's OpenMP threads spin while they wait for each other. When the cores are shared (env
# workers, a second process, a busy laptop) a spinning team waits a scheduler timeslice per
# parallel region: we measured a 135M-model decode step at 2.4-5.7 s with spinning threads and
# 0.1 s with passive ones on a loaded 2-core machine. Must be set before torch starts OpenMP;
# setdefault leaves a user's own choice alone.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import turngym.agents  # noqa: E402,F401  (installs the agent-spec resolver that LLM-counterpart envs use)
from turngym.envs import TextEnv, list_envs, make, register  # noqa: E402
from turngym.types import Message, ToolCall, ToolResult, ToolSpec, Trajectory, Turn, Utterance  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "make", "register", "list_envs", "TextEnv",
    "Message", "ToolCall", "ToolResult", "ToolSpec", "Turn", "Trajectory", "Utterance",
]
