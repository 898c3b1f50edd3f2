"""The Ray side of the verl backend: worker groups, rollout servers, weight sync, checkpoints.

Everything here is verl's own machinery: ``ActorRolloutRefWorker`` (as ``HybridWorker``, which
only sets up its process first) in a ``RayWorkerGroup`` on a ``RayResourcePool`` (FSDP or
Megatron engine, the reference policy in the same workers when KL is on, LoRA through the model
config), verl's rollout replicas started in hybrid mode on the same workers (its vLLM or SGLang
servers on GPUs, or ``external`` servers, external_rollout.py), and its ``CheckpointEngineManager``
for weight sync. rLLM adds the loss (``RllmPolicyLoss`` through ``set_loss_fn``) and registers each
replica's OpenAI-compatible address as a gateway upstream.

On the CPU (``cluster.device = "cpu"``) Ray gets CPU bundles only and the workers run verl's
engine on the CPU platform (cpu_platform.py); the rollout must then be external, or none at all
(``rollout.engine = "none"``: the workers in verl's ``actor`` role only, for ``rllm sft``; sft.py).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from typing import Any

from rllm.algos.config import AlgorithmConfig
from rllm.backends.verl.config import NO_ROLLOUT, VerlBackendConfig
from rllm.backends.verl.loss import RllmPolicyLoss
from rllm.backends.verl.sft import no_sampler
from rllm.backends.verl.trainer_config import compose_verl_config
from rllm.engine.rollout.ray_connect import init_ray

# verl's own trainer reserves 3 CPUs per GPU bundle (actor/ref, rollout, reward); a CPU worker
# is one process on one CPU.
GPU_COLOCATE_COUNT = 3


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
        self._own_weights_dir: str | None = None

    @property
    def cpu(self) -> bool:
        return self.config.cluster.device == "cpu"

    @property
    def no_rollout(self) -> bool:
        return self.config.rollout.engine == NO_ROLLOUT

    async def start(self) -> None:
        import ray

        from rllm.backends.verl.external_rollout import ENGINE, check_servers, register_external_rollout
        from rllm.backends.verl.ray_worker import HybridWorker
        from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
        from verl.workers.rollout.replica import get_rollout_replica_class

        c = self.config.cluster
        external = self.config.rollout.engine == ENGINE
        if external:
            check_servers(list(self.config.rollout.server_urls), self.config.resolved_served_model_name())
            register_external_rollout()
            self._configure_external()
        worker_env = {}
        if self.cpu:
            from rllm.backends.verl.cpu_platform import CPU_PLATFORM, use_cpu_platform

            use_cpu_platform()  # the driver sizes the placement groups through verl's platform too
            worker_env = {"VERL_PLATFORM": CPU_PLATFORM}
        if not ray.is_initialized():
            init_ray(ray, address=c.ray_address or None, include_dashboard=False, **self._local_resources())
            self._started_ray = True
        role = "actor_rollout_ref" if self.algo.kl_coef > 0 else "actor_rollout"
        if self.no_rollout:
            role = "actor"  # the trainer alone: verl builds no rollout in these workers (sft.py)
        pool = RayResourcePool(
            process_on_nodes=[c.gpus_per_node] * c.nnodes,
            use_gpu=not self.cpu,
            max_colocate_count=1 if self.cpu else GPU_COLOCATE_COUNT,
        )
        worker = RayClassWithInitArgs(
            cls=ray.remote(HybridWorker), config=self.verl_config.actor_rollout_ref, role=role
        )
        self.group = RayWorkerGroup(
            resource_pool=pool,
            ray_cls_with_init=worker,
            device_name="cpu" if self.cpu else "cuda",
            worker_env=worker_env,
        )
        await asyncio.to_thread(self.group.init_model)
        self.set_loss(self.algo)
        if self.no_rollout:
            return
        rollout = self.verl_config.actor_rollout_ref.rollout
        replica_cls = get_rollout_replica_class(self.config.rollout.engine)
        if external:
            count = len(self.config.rollout.server_urls)
        else:
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
        if external:  # every hybrid worker pushes to every server; no replica owns workers
            await asyncio.gather(*(replica.launch_servers() for replica in self.replicas))
        else:
            await asyncio.gather(*(replica.init_hybrid(self.group) for replica in self.replicas))
        # verl starts its servers with dummy weights (rollout.load_format) and an external server
        # serves whatever it loaded: from here on they serve the trainer's weights.
        await self.sync_weights(0)

    def _local_resources(self) -> dict[str, Any]:
        """A Ray started here for CPU workers: enough CPU slots for one bundle per worker."""
        if not self.cpu or self.config.cluster.ray_address:
            return {}
        return {"num_cpus": max(os.cpu_count() or 1, self.config.world_size + 1)}

    def _configure_external(self) -> None:
        """The servers and the weights directory, through verl's ``rollout.custom`` extension point."""
        from omegaconf import open_dict

        from rllm.backends.verl.external_rollout import default_weights_dir

        r = self.config.rollout
        weights_dir = r.weights_dir
        if not weights_dir:
            weights_dir = self._own_weights_dir = default_weights_dir()
        os.makedirs(weights_dir, exist_ok=True)
        with open_dict(self.verl_config):
            self.verl_config.actor_rollout_ref.rollout.custom = {
                "server_urls": list(r.server_urls),
                "weights_dir": weights_dir,
            }

    def set_loss(self, algo: AlgorithmConfig) -> None:
        self.algo = algo
        self.group.set_loss_fn(RllmPolicyLoss(algo))

    def inference_urls(self) -> list[str]:
        """One OpenAI-compatible base URL per rollout replica (each one gateway upstream worker)."""
        if self.no_rollout:
            raise no_sampler()
        return [
            getattr(replica, "base_url", None) or f"http://{replica.server_address}/v1"
            for replica in self.replicas
        ]

    def actor(self) -> ActorGroup:
        return ActorGroup(self.group)

    def set_learning_rate(self, lr: float) -> float:
        return self.group.set_learning_rate(lr)[0]  # one value a rank, all the same

    def learning_rate(self) -> float:
        return self.group.learning_rate()[0]

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

        if self.no_rollout:
            raise no_sampler()
        if self._checkpoints is None:
            self._checkpoints = CheckpointEngineManager(
                config=omega_conf_to_dataclass(self.verl_config.actor_rollout_ref.rollout.checkpoint_engine),
                actor_wg=self.group,
                replicas=self.replicas,
            )
        # verl's manager blocks on Ray futures; a thread keeps this event loop (the gateway's) free.
        await asyncio.to_thread(self._checkpoints.update_weights, global_steps=version)

    def save_checkpoint(self, path: str, version: int) -> None:
        self.group.save_checkpoint(local_path=path, global_step=version)

    def load_checkpoint(self, path: str) -> None:
        self.group.load_checkpoint(local_path=path)

    def close(self) -> None:
        import ray

        if self.group is not None and not self._started_ray:  # a joined cluster outlives us
            for worker in self.group.workers:
                ray.kill(worker)
        self.replicas, self.group, self._checkpoints = [], None, None
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False
        if self._own_weights_dir:
            shutil.rmtree(self._own_weights_dir, ignore_errors=True)
            self._own_weights_dir = None
