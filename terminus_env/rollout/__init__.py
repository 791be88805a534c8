"""The rollout runner, its policies, and trajectories."""

from terminus_env.rollout.policy import NopPolicy, OraclePolicy, Policy, PolicyOutput, Rollout, ServingPolicy
from terminus_env.rollout.runner import RolloutRunner
from terminus_env.rollout.trajectory import Trajectory, TurnRecord

__all__ = [
    "NopPolicy",
    "OraclePolicy",
    "Policy",
    "PolicyOutput",
    "Rollout",
    "RolloutRunner",
    "ServingPolicy",
    "Trajectory",
    "TurnRecord",
]
