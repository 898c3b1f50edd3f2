"""Small verifiers environments, one per shape the adapter runs (single-turn, multi-turn, tools):
its CI examples (`rllm train verifiers:rllm_adapter_verifiers.examples.say`) and a template."""
