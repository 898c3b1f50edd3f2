"""The wire contract of the FAKE Tinker service (see :mod:`rllm.testing.tinker.server`): the
documented loss inputs and Adam parameters, protobuf tensors <-> arrays, the parsing and checking
of forward_backward requests, and the unsigned JWTs the SDK is handed."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import numpy as np
from tinker.proto import tinker_public_pb2 as pb

from rllm.testing.service import ContractError

API = "/api/v1"
FAKE_API_KEY = "tml-fake-test-key"

# Documented inputs of Tinker's built-in losses (tinker-docs, "Loss Functions").
LOSS_INPUTS = {
    "cross_entropy": {"target_tokens", "weights"},
    "importance_sampling": {"target_tokens", "logprobs", "advantages"},
    "ppo": {"target_tokens", "logprobs", "advantages"},
    "cispo": {"target_tokens", "logprobs", "advantages"},
    "gspo": {"target_tokens", "logprobs", "advantages"},
}
CLIP_CONFIG = {"clip_low_threshold", "clip_high_threshold"}
LOSS_CONFIG_KEYS = {"ppo": CLIP_CONFIG, "cispo": CLIP_CONFIG, "gspo": CLIP_CONFIG}
ADAM_KEYS = {"learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm"}


def fake_jwt(subject: str, lifetime_s: int = 3600) -> str:
    """An unsigned JWT with the claims the SDK reads (exp, iat); the SDK does not verify it."""

    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    now = int(time.time())
    claims = {"iss": "fake-tinker", "sub": subject, "iat": now, "exp": now + lifetime_s}
    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(claims)}.fake-signature"


def tensor_values(msg: pb.Tensor, where: str) -> np.ndarray:
    """The values of a dense float32/int64 tensor of a request."""
    if msg.WhichOneof("encoding") != "dense":
        raise ContractError(f"{where}: expected a dense tensor")
    dtype = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64}.get(msg.dtype)
    if dtype is None:
        raise ContractError(f"{where}: dtype {pb.DType.Name(msg.dtype)} is not float32/int64")
    values = np.frombuffer(msg.dense, dtype=dtype)
    if list(msg.shape) != [values.size]:
        raise ContractError(f"{where}: shape {list(msg.shape)} does not match {values.size} values")
    return values


def batched_float32(rows: list[np.ndarray]) -> pb.BatchedTensor:
    """Rows of float32 values as one protobuf BatchedTensor (offsets into one buffer)."""
    sizes = [r.astype(np.float32).nbytes for r in rows]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    data = b"".join(r.astype(np.float32).tobytes() for r in rows)
    return pb.BatchedTensor(data=data, offsets=offsets.tobytes(), dtype=pb.DTYPE_FLOAT32)


def parse_forward_backward(msg: pb.ForwardBackwardRequest, vocab_size: int) -> dict[str, Any]:
    """A forward_backward request as plain lists, checked against the documented contract."""
    loss_fn = msg.loss_fn
    if loss_fn not in LOSS_INPUTS:
        raise ContractError(f"unknown loss_fn {loss_fn!r}; built-ins are {sorted(LOSS_INPUTS)}")
    config = {k: v.number for k, v in msg.loss_fn_config_v2.items()}
    if dict(msg.loss_fn_config) != config:
        raise ContractError("loss_fn_config and loss_fn_config_v2 disagree")
    expected = LOSS_CONFIG_KEYS.get(loss_fn, set())
    if set(config) != expected:
        raise ContractError(f"{loss_fn} takes loss_fn_config keys {sorted(expected)}, got {sorted(config)}")
    if expected and not config["clip_low_threshold"] < 1.0 < config["clip_high_threshold"]:
        raise ContractError(f"{loss_fn}: clip thresholds must satisfy low < 1 < high, got {config}")
    if not msg.data:
        raise ContractError("forward_backward with no data")
    datums = []
    for i, datum in enumerate(msg.data):
        where = f"data[{i}]"
        tokens = np.concatenate(
            [np.frombuffer(c.encoded_text.tokens, dtype=np.int32) for c in datum.model_input]
        )
        names = set(datum.loss_fn_inputs)
        if names != LOSS_INPUTS[loss_fn]:
            raise ContractError(
                f"{where}: {loss_fn} takes loss_fn_inputs {sorted(LOSS_INPUTS[loss_fn])}, got {sorted(names)}"
            )
        inputs = {name: tensor_values(t, f"{where}.{name}") for name, t in datum.loss_fn_inputs.items()}
        for name, values in inputs.items():
            want = np.int64 if name == "target_tokens" else np.float32
            if values.dtype != want:
                raise ContractError(f"{where}.{name}: dtype {values.dtype}, expected {np.dtype(want)}")
            if values.size != tokens.size:
                raise ContractError(
                    f"{where}.{name}: {values.size} values for a model input of {tokens.size} tokens"
                )
        for name, values in (("model_input", tokens), ("target_tokens", inputs["target_tokens"])):
            if values.size and (values.min() < 0 or values.max() >= vocab_size):
                raise ContractError(f"{where}.{name}: token id outside the vocabulary [0, {vocab_size})")
        datums.append({"model_input": tokens.tolist(), **{k: v.tolist() for k, v in inputs.items()}})
    return {
        "model_id": msg.model_id,
        "seq_id": msg.seq_id,
        "loss_fn": loss_fn,
        "loss_fn_config": config,
        "forward_only": msg.forward_only,
        "data": datums,
    }
