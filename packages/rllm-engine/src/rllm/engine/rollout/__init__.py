"""Rollouts: the RolloutEngine, where flows run (executors: in-process, flow processes,
Ray, remote agent services), episodes built from traces, scoring and failure classes."""
