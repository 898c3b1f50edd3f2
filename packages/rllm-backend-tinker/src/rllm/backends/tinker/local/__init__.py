"""The local service: in-process torch + transformers (+ peft) training and an HTTP sampler."""
