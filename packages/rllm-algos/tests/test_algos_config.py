import msgspec
import pytest

from rllm.algos import AlgorithmConfig, ConfigError, register_estimator, unregister_estimator


def test_defaults_validate() -> None:
    assert AlgorithmConfig().validate().estimator == "grpo"


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"estimator": "gpro"}, "gpro"),
        ({"estimator_by_role": {"judge": "nope"}}, "judge"),
        ({"loss": "ppo"}, "`loss`"),
        ({"mask_terminations": ["oops"]}, "mask_terminations"),
        ({"gamma": 1.5}, "gamma"),
        ({"min_group_size": 0}, "min_group_size"),
        ({"clip_low": 1.0}, "clip_low"),
        ({"dual_clip_c": 1.0}, "dual_clip_c"),
        ({"tis_cap": 0.5}, "tis_cap"),
        ({"kl_coef": -1.0}, "kl_coef"),
        ({"loss_scale_factor": 0.0}, "loss_scale_factor"),
        ({"loss": "cross_entropy", "tis": "token"}, "tis"),
    ],
)
def test_bad_options_name_the_option(kwargs: dict, names: str) -> None:
    with pytest.raises(ConfigError, match=names):
        AlgorithmConfig(**kwargs).validate()


def test_unknown_field_and_literal_rejected_when_decoding() -> None:
    with pytest.raises(msgspec.ValidationError, match="estimater"):
        msgspec.convert({"estimater": "grpo"}, AlgorithmConfig)
    with pytest.raises(msgspec.ValidationError, match="aggregation"):
        msgspec.convert({"aggregation": "mean"}, AlgorithmConfig)


def test_errors_alias_expands_to_both_error_reasons() -> None:
    config = AlgorithmConfig(mask_terminations=["errors", "timeout"]).validate()
    assert config.masked_termination_reasons() == {"agent_error", "infra_error", "timeout"}


def test_registered_estimator_becomes_valid() -> None:
    with pytest.raises(ConfigError):
        AlgorithmConfig(estimator="mine_cfg").validate()

    @register_estimator("mine_cfg")
    def mine(batch, config):
        return batch.rewards

    try:
        AlgorithmConfig(estimator="mine_cfg", estimator_by_role={"judge": "mine_cfg"}).validate()
        with pytest.raises(ValueError, match="already registered"):
            register_estimator("mine_cfg")(mine)
    finally:
        unregister_estimator("mine_cfg")


def test_estimator_for_role() -> None:
    config = AlgorithmConfig(estimator="grpo", estimator_by_role={"judge": "reinforce"})
    assert config.estimator_for("judge") == "reinforce"
    assert config.estimator_for("solver") == "grpo"
