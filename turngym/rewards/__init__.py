"""Reward transforms over trajectories: outcome, env, and (composable) shaping."""

from turngym.rewards.base import EnvReward, OutcomeReward, RewardTransform, Sum, make_reward, register_reward

__all__ = ["RewardTransform", "EnvReward", "OutcomeReward", "Sum", "make_reward", "register_reward"]
