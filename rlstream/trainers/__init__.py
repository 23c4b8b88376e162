"""Learning core: model, pre-training, RL (GRPO, PPO), samplers, checkpoints."""
