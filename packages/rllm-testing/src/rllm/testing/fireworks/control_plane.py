"""The control plane and the deployment of the FAKE Fireworks service (see :mod:`.server`):
account resolution, RLOR trainer jobs, deployments, the hot-load API and deployment sampling.
A mixin of FakeFireworksServer, whose state (jobs, deployments, snapshots) it uses."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from aiohttp import web

from rllm.testing.fireworks import trainer as ft
from rllm.testing.service import ContractError

if TYPE_CHECKING:
    from rllm.testing.fireworks.server import Job

ACCOUNT = "rllm-test"


async def read_json(request: web.Request) -> dict[str, Any]:
    """A request's JSON object body; anything else breaks the contract."""
    raw = await request.read()
    try:
        body = json.loads(raw) if raw else {}
    except json.JSONDecodeError as exc:
        raise ContractError(f"body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise ContractError("body is not a JSON object")
    return body


class FakeControlPlane:
    jobs: dict[str, Job]
    created_jobs: list[str]
    deployments: dict[str, dict[str, Any]]
    hotloaded: dict[str, list[str]]
    failed_hotload: dict[str, str]
    fail_hotload_of: str | None
    sampler_snapshots: dict[str, dict[str, Any]]
    vocab_size: int

    def _new_job(self, job_id: str, body: dict[str, Any]) -> Job:
        raise NotImplementedError  # FakeFireworksServer's

    def _next_id(self) -> int:
        raise NotImplementedError  # FakeFireworksServer's

    def _account(self, request: web.Request) -> None:
        if request.match_info["account"] != ACCOUNT:
            raise ContractError(f"account {request.match_info['account']!r} is not this key's account")

    # ---- control plane: accounts, training shapes, trainer jobs, deployments, hot-load ---------
    async def _accounts(self, request: web.Request) -> web.Response:
        return web.json_response({"accounts": [{"name": f"accounts/{ACCOUNT}"}]})

    @staticmethod
    def _shape_version(request: web.Request, version: str) -> dict[str, Any]:
        shape = f"accounts/{request.match_info['account']}/trainingShapes/{request.match_info['shape']}"
        snapshot = {"deploymentShapeVersion": f"{shape}-deployment/versions/1", "acceleratorType": "FAKE_GPU"}
        return {"name": f"{shape}/versions/{version}", "snapshot": snapshot}

    async def _shape_versions(self, request: web.Request) -> web.Response:
        if request.query.get("filter") != "latest_validated=true":
            raise ContractError("an unversioned shape resolves its latest validated version")
        return web.json_response({"trainingShapeVersions": [self._shape_version(request, "1")]})

    async def _shape_version_get(self, request: web.Request) -> web.Response:
        return web.json_response(self._shape_version(request, request.match_info["version"]))

    async def _create_job(self, request: web.Request) -> web.Response:
        self._account(request)
        body = await read_json(request)
        job_id = request.query.get("rlorTrainerJobId") or f"job-{self._next_id()}"
        if job_id in self.jobs:
            return web.json_response({"error": {"message": "already exists"}}, status=409)
        config = body.get("trainingConfig") or {}
        if not config.get("baseModel") or not body.get("serviceMode"):
            raise ContractError("a trainer job needs trainingConfig.baseModel and serviceMode")
        self.jobs[job_id] = self._new_job(job_id, body)
        self.created_jobs.append(job_id)
        return web.json_response(self._job_json(self.jobs[job_id]))

    def _job_json(self, job: Job) -> dict[str, Any]:
        state = "JOB_STATE_CREATING" if job.polls == 0 else "JOB_STATE_RUNNING"
        return {"name": f"accounts/{ACCOUNT}/rlorTrainerJobs/{job.job_id}", "state": state, **job.body}

    async def _get_job(self, request: web.Request) -> web.Response:
        self._account(request)
        job = self.jobs.get(request.match_info["job"])
        if job is None:
            return web.json_response({"error": {"message": "not found"}}, status=404)
        reply = self._job_json(job)
        job.polls += 1
        return web.json_response(reply)

    async def _delete_job(self, request: web.Request) -> web.Response:
        self._account(request)
        self.jobs.pop(request.match_info["job"], None)
        return web.json_response({})

    async def _create_deployment(self, request: web.Request) -> web.Response:
        self._account(request)
        body = await read_json(request)
        deployment_id = request.query.get("deploymentId", "")
        if not deployment_id or not body.get("baseModel"):
            raise ContractError("a deployment needs ?deploymentId= and baseModel")
        if deployment_id in self.deployments:
            return web.json_response({"error": {"message": "already exists"}}, status=409)
        if not body.get("enableHotLoad"):
            raise ContractError("a training deployment must enable hot-load")
        name = f"accounts/{ACCOUNT}/deployments/{deployment_id}"
        self.deployments[deployment_id] = {"name": name, "state": "READY", **body}
        return web.json_response(self.deployments[deployment_id])

    async def _get_deployment(self, request: web.Request) -> web.Response:
        self._account(request)
        deployment = self.deployments.get(request.match_info["deployment"])
        if deployment is None:
            return web.json_response({"error": {"message": "not found"}}, status=404)
        return web.json_response(deployment)

    async def _delete_deployment(self, request: web.Request) -> web.Response:
        self._account(request)
        self.deployments.pop(request.match_info["deployment"], None)
        return web.json_response({})

    def _hotload_target(self, request: web.Request) -> str:
        deployment = request.headers.get("fireworks-deployment", "").rsplit("/", 1)[-1]
        if deployment not in self.deployments:
            raise ContractError(f"hot-load for unknown deployment {deployment!r}")
        if request.headers.get("fireworks-model") != self.deployments[deployment]["baseModel"]:
            raise ContractError("hot-load fireworks-model header is not the deployment's base model")
        return deployment

    async def _hotload(self, request: web.Request) -> web.Response:
        deployment = self._hotload_target(request)
        body = await read_json(request)
        identity = body.get("identity")
        if identity not in self.sampler_snapshots:
            raise ContractError(f"hot-load of unknown snapshot {identity!r}")
        if self.fail_hotload_of and str(identity).startswith(self.fail_hotload_of):
            self.failed_hotload[deployment] = str(identity)  # the replica reports stage=error
            return web.json_response({"identity": identity})
        self.failed_hotload.pop(deployment, None)
        self.hotloaded.setdefault(deployment, []).append(identity)
        return web.json_response({"identity": identity})

    async def _hotload_status(self, request: web.Request) -> web.Response:
        deployment = self._hotload_target(request)
        loaded = self.hotloaded.get(deployment, [])
        replica: dict[str, Any] = {
            "current_snapshot_identity": loaded[-1] if loaded else None,
            "readiness": True,
            "loading_state": {"stage": "done"},
        }
        if deployment in self.failed_hotload:
            target = self.failed_hotload[deployment]
            replica["loading_state"] = {"stage": "error", "target_snapshot_identity": target}
        return web.json_response({"replicas": [replica]})

    # ---- inference: the deployment ---------------------------------------------------------------
    async def _completions(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        model = str(body.get("model", ""))
        deployment = model.removeprefix(f"accounts/{ACCOUNT}/deployments/")
        if deployment not in self.deployments or not self.hotloaded.get(deployment):
            raise ContractError(f"model {model!r} is not a deployment serving a hot-loaded snapshot")
        if body.get("stream"):
            raise ContractError("this fake deployment does not stream")
        logits = self.sampler_snapshots[self.hotloaded[deployment][-1]]["logits"]
        answer = ft.completion(body, logits, self.vocab_size)
        return web.json_response({"id": f"cmpl-{self._next_id()}", "model": model, **answer})
