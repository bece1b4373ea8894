"""turngym: a multi-turn agentic RL gym and trainer.

    import turngym
    env = turngym.make("turngym/TextWorld-easy-v0")
    obs, info = env.reset(seed=0)
"""

from turngym.envs import TextEnv, list_envs, make, register
from turngym.types import Message, ToolCall, ToolResult, ToolSpec, Trajectory, Turn, Utterance

__version__ = "0.1.0"

__all__ = [
    "make", "register", "list_envs", "TextEnv",
    "Message", "ToolCall", "ToolResult", "ToolSpec", "Turn", "Trajectory", "Utterance",
]
