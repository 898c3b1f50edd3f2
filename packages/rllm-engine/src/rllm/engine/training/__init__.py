"""The training loop: one step shared by the sync and async loops, staleness, prefetch,
checkpoints, run folders, metrics and the launch of a Trainer from names."""
