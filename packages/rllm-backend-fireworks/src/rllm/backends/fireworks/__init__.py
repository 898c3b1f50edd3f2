"""rllm.backends.fireworks: train on Fireworks through the official fireworks-ai training SDK."""
