"""Reward transforms over trajectories: outcome, env, format, tool use, shaping, G-RA and SPA.

Registered names for ``make_reward`` (see ``turngym.rewards.base`` for the spec grammar):

    env        the env's own per-step rewards
    outcome    the episode outcome at the last turn (``scale``)
    format     penalties for unparseable / invalid actions (``unparseable``, ``invalid``, ``valid``)
    tool_use   ToolRL-style score against reference calls (``scale``, ``missing``)
    shaped     step shaping (``shaping``: valid_call | new_observation | new_state, ``bonus``)
    gated      G-RA (``step``, ``high``, ``tau``, ``mode``: gated | direct)
    spa        SPA progress attribution (the fields of ``SPAConfig``)
"""

from turngym.rewards.base import (
    EnvReward, OutcomeReward, RewardTransform, Scale, Sum, available_rewards, bind_policy, load_reward_state_dict,
    make_reward, register_reward, reward_state_dict, reward_stats, wants_policy,
)
from turngym.rewards.format import FormatReward
from turngym.rewards.gated import GatedReward
from turngym.rewards.shaped import ShapedStepReward
from turngym.rewards.tool_use import ToolUseReward, tool_use_score


def _spa(**kw):
    # torch and the encoders load only when SPA is used
    from turngym.rewards.progress import ProgressReward

    return ProgressReward(**kw)


register_reward("format", FormatReward)
register_reward("tool_use", ToolUseReward)
register_reward("shaped", ShapedStepReward)
register_reward("gated", GatedReward)
register_reward("spa", _spa)

__all__ = [
    "RewardTransform", "EnvReward", "OutcomeReward", "Sum", "Scale", "make_reward", "register_reward",
    "available_rewards", "reward_stats", "bind_policy", "wants_policy", "reward_state_dict", "load_reward_state_dict",
    "FormatReward",
    "ToolUseReward", "tool_use_score", "ShapedStepReward", "GatedReward",
]
