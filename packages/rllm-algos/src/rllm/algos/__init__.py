"""rllm.algos"""
