"""The Ray side of the verl backend: worker groups, rollout servers, weight sync, checkpoints.

Everything here is verl's own machinery: ``ActorRolloutRefWorker`` in a ``RayWorkerGroup`` (FSDP or
Megatron engine, the reference policy in the same workers when KL is on, LoRA through the model
config), verl's async rollout replicas (vLLM or SGLang) started in hybrid mode on the same GPUs,
and its checkpoint engine for weight sync. rLLM adds the loss (``RllmPolicyLoss`` through
``set_loss_fn``) and registers each replica's OpenAI-compatible address as a gateway upstream.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rllm.algos.config import AlgorithmConfig
from rllm.backends.verl.config import VerlBackendConfig
from rllm.backends.verl.loss import RllmPolicyLoss
from rllm.backends.verl.trainer_config import compose_verl_config


class ActorGroup:
    """verl's hybrid actor/rollout/ref worker group behind the calls ``actor.py`` makes."""

    def __init__(self, group: Any) -> None:
        self.group = group

    def infer_batch(self, data: Any) -> Any:
        return self.group.compute_log_prob(data)

    def train_mini_batch(self, data: Any) -> Any:
        return self.group.update_actor(data)


class ReferenceGroup:
    """The reference policy hosted by the same workers (verl's ``actor_rollout_ref`` role)."""

    def __init__(self, group: Any) -> None:
        self.group = group

    def infer_batch(self, data: Any) -> Any:
        return self.group.compute_ref_log_prob(data)


class RayCluster:
    """Starts (or joins) Ray, builds the worker group and rollout replicas; ``close`` tears down."""

    def __init__(self, config: VerlBackendConfig, algo: AlgorithmConfig) -> None:
        self.config = config
        self.algo = algo
        self.verl_config = compose_verl_config(config, algo)
        self.group: Any = None
        self.replicas: list[Any] = []
        self._checkpoints: Any = None
        self._started_ray = False

    async def start(self) -> None:
        import ray

        from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
        from verl.workers.engine_workers import ActorRolloutRefWorker
        from verl.workers.rollout.replica import get_rollout_replica_class

        c = self.config.cluster
        if not ray.is_initialized():
            env = {"VERL_PLATFORM": "cpu"} if c.device == "cpu" else {}
            ray.init(address=c.ray_address or None, runtime_env={"env_vars": env})
            self._started_ray = True
        role = "actor_rollout_ref" if self.algo.kl_coef > 0 else "actor_rollout"
        pool = RayResourcePool(process_on_nodes=[c.gpus_per_node] * c.nnodes, use_gpu=c.device == "cuda")
        worker = RayClassWithInitArgs(
            cls=ray.remote(ActorRolloutRefWorker), config=self.verl_config.actor_rollout_ref, role=role
        )
        self.group = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=worker)
        self.group.init_model()
        self.set_loss(self.algo)
        rollout = self.verl_config.actor_rollout_ref.rollout
        replica_cls = get_rollout_replica_class(self.config.rollout.engine)
        count = self.config.world_size // self.config.rollout.tensor_model_parallel_size
        self.replicas = [
            replica_cls(
                replica_rank=rank,
                config=rollout,
                model_config=self.verl_config.actor_rollout_ref.model,
                gpus_per_node=c.gpus_per_node,
            )
            for rank in range(count)
        ]
        await asyncio.gather(*(replica.init_hybrid(self.group) for replica in self.replicas))
        # verl starts the servers with dummy weights (rollout.load_format); serve the real ones.
        await self.sync_weights(0)

    def set_loss(self, algo: AlgorithmConfig) -> None:
        self.algo = algo
        self.group.set_loss_fn(RllmPolicyLoss(algo))

    def inference_urls(self) -> list[str]:
        """One OpenAI-compatible base URL per rollout replica (each one gateway upstream worker)."""
        return [f"http://{replica.server_address}/v1" for replica in self.replicas]

    def actor(self) -> ActorGroup:
        return ActorGroup(self.group)

    def reference(self) -> ReferenceGroup | None:
        return ReferenceGroup(self.group) if self.algo.kl_coef > 0 else None

    async def release_rollout_memory(self) -> None:
        """Free the replicas' KV cache (and weights) while the trainer uses the GPUs (hybrid mode)."""
        if self.config.rollout.free_cache_engine:
            await asyncio.gather(*(replica.sleep() for replica in self.replicas))

    async def sync_weights(self, version: int) -> None:
        """verl's checkpoint engine pushes the actor's weights to every replica and wakes them."""
        from verl.checkpoint_engine import CheckpointEngineManager
        from verl.utils.config import omega_conf_to_dataclass

        if self._checkpoints is None:
            self._checkpoints = CheckpointEngineManager(
                config=omega_conf_to_dataclass(self.verl_config.actor_rollout_ref.rollout.checkpoint_engine),
                actor_wg=self.group,
                replicas=self.replicas,
            )
        await self._checkpoints.update_weights(global_steps=version)

    def save_checkpoint(self, path: str, version: int) -> None:
        self.group.save_checkpoint(local_path=path, global_step=version)

    def load_checkpoint(self, path: str) -> None:
        self.group.load_checkpoint(local_path=path)

    def close(self) -> None:
        import ray

        self.replicas, self.group, self._checkpoints = [], None, None
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False
