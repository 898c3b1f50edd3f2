"""Config parsing and validate(): every AlgorithmConfig option is honoured or refused by name."""

from __future__ import annotations

import pytest

from rllm.algos.config import AlgorithmConfig
from rllm.backends.tinker import TinkerBackend, TinkerBackendConfig
from rllm.engine.backend import Backend


def test_backend_satisfies_the_engine_protocol_and_entry_point() -> None:
    from importlib.metadata import entry_points

    assert isinstance(TinkerBackend({"model": "x"}), Backend)
    (ep,) = [e for e in entry_points(group="rllm.backends") if e.name == "tinker"]
    assert ep.load() is TinkerBackend


def test_local_service_honours_every_algorithm_option() -> None:
    backend = TinkerBackend({"model": "x"})
    for loss in ("ppo_clip", "dual_clip", "gspo", "cispo", "importance_sampling"):
        backend.validate(
            AlgorithmConfig(
                loss=loss,
                kl_coef=0.1,
                tis="sequence",
                entropy_coef=0.01,
                aggregation="seq-mean-token-sum-norm",
            )
        )
    backend.validate(AlgorithmConfig(loss="cross_entropy"))
    backend.validate(AlgorithmConfig(max_mismatch=0.05))  # it records the trainer's logprobs


def test_invalid_algorithm_values_are_refused_by_name() -> None:
    backend = TinkerBackend({"model": "x"})
    with pytest.raises(ValueError, match="loss"):
        backend.validate(AlgorithmConfig(loss="dpo"))


@pytest.mark.parametrize(
    ("option", "algo"),
    [
        ("kl_coef", AlgorithmConfig(kl_coef=0.1)),
        ("entropy_coef", AlgorithmConfig(entropy_coef=0.01)),
        ("tis", AlgorithmConfig(tis="token")),
        ("max_mismatch", AlgorithmConfig(max_mismatch=0.05)),
    ],
)
def test_remote_service_refuses_what_it_cannot_honour(option: str, algo: AlgorithmConfig) -> None:
    backend = TinkerBackend({"service": "remote", "model": "m", "lora": {"rank": 8}})
    with pytest.raises(ValueError, match=option):
        backend.validate(algo)
    backend.validate(AlgorithmConfig(loss="dual_clip", aggregation="seq-mean-token-mean"))


def test_remote_service_refuses_full_fine_tuning() -> None:
    with pytest.raises(ValueError, match=r"lora\.rank"):
        TinkerBackend({"service": "remote", "model": "m"}).validate(AlgorithmConfig())


def test_bad_backend_options_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"lora\.rank"):
        TinkerBackend({"model": "m", "lora": {"rank": "eight"}})
    with pytest.raises(ValueError, match="mini_batches"):
        TinkerBackend({"model": "m", "mini_batches": 0})
    with pytest.raises(ValueError, match="learning_rat"):
        TinkerBackend({"model": "m", "learning_rat": 0.1})
    assert TinkerBackend(TinkerBackendConfig(model="m"), learning_rate=0.5).config.learning_rate == 0.5


async def test_local_start_errors_are_clear(tmp_path) -> None:
    backend = TinkerBackend({"model": ""})
    with pytest.raises(ValueError, match="model is empty"):
        await backend.start()
    with pytest.raises(RuntimeError, match="not started"):
        backend.inference_urls()
