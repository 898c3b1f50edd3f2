"""rllm.engine"""
