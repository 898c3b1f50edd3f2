"""Harbor's task format (the ``harbor`` package's ``task.toml``, schema 1.x) as rLLM's task
directories read it: what maps onto a ``SandboxSpec``, and what is refused by name.

Checked against harbor 0.25 (``harbor.models.task.config.TaskConfig``, ``TaskPaths``,
``harbor.verifier``). Mapped: ``[environment] docker_image`` (``SandboxSpec.image``), ``cpus``,
``memory_mb``, ``storage_mb`` (the workdir's ``disk_mb``), ``env``, ``workdir``, ``network_mode``
/ ``allow_internet`` (public network is a request the operator must grant, as ``network = true``;
a task that states ``schema_version`` and no network policy has Harbor's default, public);
``[verifier] env`` (the verifier's environment); ``[task]``, ``source`` and ``schema_version``
(kept in ``Task.metadata["harbor"]``). Refused, each naming itself: what rLLM's sandboxes or
verifier do not do — an image built from ``environment/Dockerfile`` or a compose file, GPUs and
TPUs, health checks, MCP servers, skills, Windows (``os``, ``.bat`` scripts), network allowlists,
per-phase users and network policies, a separate verifier environment, multi-step tasks,
artifacts, a prior trajectory (``trajectory.json``), and a ``tests/test.sh`` that reports through
Harbor's reward file (``/logs/verifier/reward.txt``) or reads its files at ``/tests`` (rLLM's
verifier reads the script's exit status and copies ``tests/`` into the workdir).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rllm.types.errors import RLLMError

# [environment] keys rLLM reads itself (rllm.sdk.task_dir) or maps here.
OWN_ENV_KEYS = frozenset(
    {"network", "setup_timeout_sec", "cpu_s", "memory_mb", "max_procs", "output_bytes", "desktop"}
)
MAPPED_ENV_KEYS = frozenset(
    {
        "docker_image",
        "cpus",
        "storage_mb",
        "env",
        "workdir",
        "network_mode",
        "allow_internet",
        "os",
        "build_timeout_sec",
    }
)
REFUSED = {
    ("environment", "gpus"): "GPUs in the sandbox",
    ("environment", "gpu_types"): "GPUs in the sandbox",
    ("environment", "tpu"): "TPUs in the sandbox",
    ("environment", "healthcheck"): "an environment health check",
    (
        "environment",
        "mcp_servers",
    ): "MCP servers of a task directory (rllm-adapter-mcp takes them in its task files)",
    ("environment", "skills_dir"): "agent skills",
    ("environment", "allowed_hosts"): "a network allowlist",
    ("agent", "user"): "running the agent as another user",
    ("agent", "network_mode"): "a network policy of the agent's own",
    ("agent", "allowed_hosts"): "a network allowlist",
    ("verifier", "user"): "running the verifier as another user",
    ("verifier", "network_mode"): "a network policy of the verifier's own",
    ("verifier", "allowed_hosts"): "a network allowlist",
    ("verifier", "environment_mode"): "a separate verifier environment",
    ("verifier", "environment"): "a separate verifier environment",
    ("verifier", "collect"): "collecting verifier outputs from services",
    ("", "steps"): "multi-step tasks",
    ("", "multi_step_reward_strategy"): "multi-step tasks",
    ("", "artifacts"): "artifacts",
}
KNOWN_SECTIONS = frozenset(
    {"schema_version", "task", "metadata", "verifier", "agent", "environment", "solution", "source"}
)
REFUSED_FILES = {
    "environment/Dockerfile": "building the task's image (set [environment] docker_image to a pre-built one)",
    "environment/docker-compose.yaml": "multi-container environments",
    "environment/docker-compose.yml": "multi-container environments",
    "environment/singularity-compose.yaml": "multi-container environments",
    "tests/test.bat": "Windows verifiers",
    "solution/solve.bat": "Windows solutions",
    "trajectory.json": "a prior agent trajectory (ATIF) seeded before the agent runs",
    "steps": "multi-step tasks",
}


def refuse(root: Path, what: str, why: str) -> RLLMError:
    from rllm.sdk.task_dir import TaskDirError  # task_dir imports this module

    return TaskDirError(f"task directory {root}: {what}: {why} is not supported by rLLM's task directories")


def check_harbor(root: Path, config: dict[str, Any]) -> None:
    """Refuse, naming it, every Harbor feature rLLM's task directories do not run."""
    for key in config:
        if key not in KNOWN_SECTIONS and ("", key) not in REFUSED:
            raise refuse(root, f"task.toml key {key!r}", "an unknown section")
    for (section, key), why in REFUSED.items():
        table = config if not section else config.get(section, {})
        if isinstance(table, dict) and key in table:
            raise refuse(root, f"task.toml [{section or 'top level'}] {key}", why)
    env = config.get("environment", {})
    unknown = sorted(
        set(env) - OWN_ENV_KEYS - MAPPED_ENV_KEYS - {k for s, k in REFUSED if s == "environment"}
    )
    if unknown:
        raise refuse(root, f"task.toml [environment] {', '.join(unknown)}", "an unknown key")
    if str(env.get("os", "linux")).lower() != "linux":
        raise refuse(root, f"task.toml [environment] os = {env['os']!r}", "a non-Linux sandbox")
    if env.get("network_mode") == "allowlist":
        raise refuse(root, "task.toml [environment] network_mode = 'allowlist'", "a network allowlist")
    for rel, why in REFUSED_FILES.items():
        if (root / rel).exists() and not (rel == "environment/Dockerfile" and env.get("docker_image")):
            raise refuse(root, rel, why)
    test = root / "tests" / "test.sh"
    script = test.read_text() if test.is_file() else ""
    if "/logs/verifier" in script:
        raise refuse(
            root,
            "tests/test.sh writes Harbor's reward file (/logs/verifier/reward.txt or reward.json)",
            "a reward file (rLLM's verifier reads the script's exit status: 0 solved, else not)",
        )
    if "/tests/" in script:
        raise refuse(
            root,
            "tests/test.sh reads its files at /tests/",
            'that path (rLLM copies tests/ into the workdir; refer to them beside the script: $(dirname "$0"))',
        )


def wants_network(config: dict[str, Any]) -> bool:
    """rLLM's ``network = true``, Harbor's ``network_mode = "public"`` / ``allow_internet = true``,
    or a Harbor task (``schema_version``) that states no policy: Harbor's default is public."""
    env = config.get("environment", {})
    if "network" in env:
        return bool(env["network"])
    if "network_mode" in env:
        return env["network_mode"] == "public"
    if "allow_internet" in env:
        return bool(env["allow_internet"])
    return "schema_version" in config


def mapped_spec_fields(env: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(SandboxSpec keyword arguments, SandboxLimits keyword arguments) from Harbor's keys."""
    spec: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    if env.get("docker_image"):
        spec["image"] = str(env["docker_image"])
    if env.get("env"):
        spec["env"] = {str(k): str(v) for k, v in dict(env["env"]).items()}
    if env.get("workdir"):
        spec["workdir"] = str(env["workdir"])
    if env.get("cpus") is not None:
        limits["cpus"] = float(env["cpus"])
    if env.get("storage_mb") is not None:
        limits["disk_mb"] = int(env["storage_mb"])
    return spec, limits


def harbor_metadata(config: dict[str, Any]) -> dict[str, Any]:
    """What a task keeps of Harbor's descriptive keys (``Task.metadata["harbor"]``)."""
    kept = {k: config[k] for k in ("schema_version", "task", "source") if k in config}
    return {"harbor": kept} if kept else {}
