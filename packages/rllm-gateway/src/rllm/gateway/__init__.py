"""rllm.gateway"""
