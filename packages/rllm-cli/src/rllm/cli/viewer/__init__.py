"""`rllm view`: a local web page over a run directory (episodes, tokens, curves)."""
