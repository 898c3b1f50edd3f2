"""rllm.sdk"""
