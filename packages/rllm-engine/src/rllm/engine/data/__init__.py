"""Training data that is not RL rollouts: supervised fine-tuning on chat data, its sources,
eval traces as SFT sets, and on-policy distillation from a teacher."""
