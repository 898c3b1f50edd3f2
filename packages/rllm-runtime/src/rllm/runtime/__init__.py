"""rllm.runtime: the process and I/O machinery rLLM's servers share, below every layer that serves.

The gateway, the mock upstream of ``rllm-testing`` and the tinker sampler server run on it; none
of it knows about traces, sessions or models.
"""
