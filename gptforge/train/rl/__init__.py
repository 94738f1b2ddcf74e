"""Reinforcement learning with verifiable rewards: rollouts and the GRPO / DAPO loss."""
