"""rllm.cli"""
