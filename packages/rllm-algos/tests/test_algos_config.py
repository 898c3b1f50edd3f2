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
        ({"max_mismatch": 0.0}, "max_mismatch"),
        ({"max_mismatch": float("nan")}, "max_mismatch"),
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


def test_a_config_is_validated_when_built_and_never_again_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Built (or decoded) once, checked once: filters, advantages and the loss (per micro-batch)
    trust it and do not run validate() again."""
    import torch

    from rllm.algos import compute_advantages, filter_groups
    from rllm.algos.losses import compute_policy_loss
    from rllm.types import Step, Trajectory, TrajectoryGroup

    with pytest.raises(ConfigError, match="gamma"):
        AlgorithmConfig(gamma=2.0)  # refused at construction, not at first use
    with pytest.raises(msgspec.ValidationError, match="gamma"):
        msgspec.convert({"gamma": 2.0}, AlgorithmConfig)  # and when decoded from a config file

    config = AlgorithmConfig(step_credit="turn")
    calls: list[str] = []
    monkeypatch.setattr(AlgorithmConfig, "validate", lambda self: calls.append("validate") or self)
    groups = [
        TrajectoryGroup(
            task_id="t",
            role="solver",
            trajectories=[Trajectory(steps=[Step(), Step()], reward=r) for r in (1.0, 0.0)],
        )
    ]
    kept, _ = filter_groups(groups, config)
    compute_advantages(kept, config)
    for _ in range(3):  # three micro-batches
        compute_policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2), torch.ones(2, 3), config)
    assert calls == []


@pytest.mark.parametrize(
    ("options", "listed"),
    [
        ({"estimator": "nope"}, "known: batch_norm, drgrpo, grpo, "),
        ({"loss": "nope"}, "known: cispo, cross_entropy, "),
        ({"mask_terminations": ["nope"]}, "known: "),
    ],
)
def test_unknown_names_list_the_valid_ones_as_plain_words(options: dict, listed: str) -> None:
    with pytest.raises(ConfigError) as caught:
        AlgorithmConfig(**options)
    assert listed in str(caught.value) and "[" not in str(caught.value)
