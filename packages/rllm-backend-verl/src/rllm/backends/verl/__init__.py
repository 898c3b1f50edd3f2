"""rllm.backends.verl"""
