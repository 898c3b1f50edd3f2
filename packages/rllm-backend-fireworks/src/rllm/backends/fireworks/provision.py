"""Set up, or attach to, the two Fireworks resources a run needs: an RLOR trainer job (the
Tinker-compatible training service) and an inference deployment with hot-load that serves its
weights. All calls here block (the SDK's control plane is synchronous): run them on a thread.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from rllm.backends.fireworks.config import OPTIONS, FireworksBackendConfig
from rllm.types.errors import InputError

logger = logging.getLogger(__name__)


@dataclass
class Resources:
    trainer_mgr: Any  # fireworks.training.sdk.TrainerJobManager
    deploy_mgr: Any  # fireworks.training.sdk.DeploymentManager
    account: str
    job_id: str
    job_name: str
    trainer_url: str  # the trainer gateway route the training client talks to
    deployment_id: str
    created_job: bool
    created_deployment: bool

    @property
    def deployment_model(self) -> str:
        """The model name the deployment's OpenAI-compatible endpoint serves."""
        return f"accounts/{self.account}/deployments/{self.deployment_id}"


def _check_job(job: dict[str, Any], config: FireworksBackendConfig) -> None:
    training = job.get("trainingConfig") or {}
    if training.get("baseModel") != config.model:
        raise InputError(
            f"{OPTIONS}.trainer_job_id={config.trainer_job_id!r} trains {training.get('baseModel')!r}, "
            f"not {OPTIONS}.model={config.model!r}"
        )
    if int(training.get("loraRank") or 0) != config.lora_rank:
        raise InputError(
            f"{OPTIONS}.trainer_job_id={config.trainer_job_id!r} has LoRA rank {training.get('loraRank')}, "
            f"not {OPTIONS}.lora_rank={config.lora_rank}"
        )


def _trainer(config: FireworksBackendConfig, trainer_mgr: Any) -> tuple[Any, bool]:
    from fireworks.training.sdk import TrainerJobConfig

    waits = {"poll_interval_s": config.poll_interval_s, "timeout_s": config.trainer_ready_timeout_s}
    if config.trainer_job_id:
        job = trainer_mgr.try_get(config.trainer_job_id)
        if job is None:
            raise InputError(f"{OPTIONS}.trainer_job_id={config.trainer_job_id!r}: no such trainer job")
        _check_job(job, config)
        return trainer_mgr.wait_for_existing(config.trainer_job_id, **waits), False
    job_config = TrainerJobConfig(
        base_model=config.model,
        lora_rank=config.lora_rank,
        learning_rate=config.learning_rate,
        display_name=f"{config.checkpoint_prefix}-trainer",
        region=config.region or None,
        training_shape_ref=config.training_shape or None,
        auto_select_training_shape=not config.training_shape,
    )
    return trainer_mgr.create_and_wait(job_config, **waits), True


def _deployment_shape(config: FireworksBackendConfig, trainer_mgr: Any) -> str | None:
    """The option, else the deployment shape the training shape's validated profile names (the
    SDK's advice: a hot-load deployment on the trainer's RFT shape), else the service's choice."""
    if config.deployment_shape or not config.training_shape:
        return config.deployment_shape or None
    profile = trainer_mgr.resolve_training_profile(config.training_shape)
    return profile.deployment_shape_version or None


def _deployment(
    config: FireworksBackendConfig, deploy_mgr: Any, shape: str | None, job_name: str, job_id: str
) -> tuple[str, bool]:
    from fireworks.training.sdk import DeploymentConfig

    deployment_id = config.deployment_id or f"rllm-{job_id}"[:63].rstrip("-")
    existing = deploy_mgr.get(deployment_id)
    created = existing is None
    if existing is not None:
        if existing.base_model and existing.base_model != config.model:
            raise InputError(
                f"{OPTIONS}.deployment_id={deployment_id!r} serves {existing.base_model!r}, "
                f"not {OPTIONS}.model={config.model!r}"
            )
        if existing.hot_load_trainer_job != job_name:
            # A deployment kept from an earlier run hot-loads from that run's trainer bucket.
            deploy_mgr.reattach_trainer(
                existing,
                base_model=config.model,
                trainer_job_name=job_name,
                timeout_s=config.hot_load_timeout_s,
                poll_interval_s=config.poll_interval_s,
            )
    else:
        deploy_mgr.create_or_get(
            DeploymentConfig(
                deployment_id=deployment_id,
                base_model=config.model,
                deployment_shape=shape,
                region=config.region or None,
                min_replica_count=1,
                max_replica_count=1,
                hot_load_trainer_job=job_name,
                # Rollouts must not mix two weight versions inside one generation.
                hot_load_transition_type="SYNC",
                for_training=True,
            )
        )
    deploy_mgr.wait_for_ready(
        deployment_id, timeout_s=config.trainer_ready_timeout_s, poll_interval_s=config.poll_interval_s
    )
    return deployment_id, created


def provision(config: FireworksBackendConfig, api_key: str) -> Resources:
    """Create (or attach to) the trainer job and the deployment, and wait until both are ready."""
    from fireworks.training.sdk import DeploymentManager, TrainerJobManager

    trainer_mgr = TrainerJobManager(api_key=api_key, base_url=config.base_url)
    deploy_mgr = DeploymentManager(
        api_key=api_key,
        base_url=config.base_url,
        inference_url=config.resolved_inference_url().removesuffix("/inference/v1"),
        hotload_api_url=config.base_url,
    )
    account = trainer_mgr.account_id
    if config.account and config.account != account:
        raise InputError(
            f"{OPTIONS}.account={config.account!r}, but FIREWORKS_API_KEY belongs to account {account!r}"
        )
    shape = _deployment_shape(config, trainer_mgr)
    endpoint, created_job = _trainer(config, trainer_mgr)
    try:
        deployment_id, created_deployment = _deployment(
            config, deploy_mgr, shape, endpoint.job_name, endpoint.job_id
        )
    except BaseException:
        if created_job and config.cleanup_on_close:
            trainer_mgr.delete(endpoint.job_id)
        raise
    return Resources(
        trainer_mgr=trainer_mgr,
        deploy_mgr=deploy_mgr,
        account=account,
        job_id=endpoint.job_id,
        job_name=endpoint.job_name,
        trainer_url=endpoint.base_url,
        deployment_id=deployment_id,
        created_job=created_job,
        created_deployment=created_deployment,
    )


def release(resources: Resources, config: FireworksBackendConfig) -> None:
    """Delete what this backend created (attached resources are never touched)."""
    if config.cleanup_on_close and resources.created_deployment:
        resources.deploy_mgr.delete(resources.deployment_id)
    if config.cleanup_on_close and resources.created_job:
        resources.trainer_mgr.delete(resources.job_id)
    resources.deploy_mgr.close()
    resources.trainer_mgr.close()
