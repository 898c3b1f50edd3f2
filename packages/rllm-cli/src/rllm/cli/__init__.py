"""rllm.cli: the `rllm` command (entry point `rllm.cli.main:main`)."""
