"""rllm.backends.tinker"""
