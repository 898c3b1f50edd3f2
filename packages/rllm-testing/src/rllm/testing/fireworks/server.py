"""A FAKE of the remote, paid Fireworks training service, for contract tests.

The real service (GPU trainer jobs and inference deployments behind an API key) cannot run here,
so this module stands in for it: a real aiohttp HTTP server on 127.0.0.1 speaking the wire
protocol the official ``fireworks-ai`` training SDK uses (learned by reading the installed SDK,
fireworks-ai 1.2.30). Requests are parsed, and responses built, with the SDK's own types
(``fireworks.training.sdk.types``), so a change of the wire format breaks these tests.

- Control plane (``/v1/...``): account resolution from the API key, training-shape profiles
  (latest validated version, naming a deployment shape), RLOR trainer jobs (create,
  get, delete; a new job reports JOB_STATE_CREATING on its first poll, then RUNNING),
  deployments (create, get, delete; READY at once), and the hot-load API
  (``/hot_load/v1/models/hot_load``: POST loads a sampler snapshot, GET reports replicas).
- Inference (``/inference/v1/completions`` and ``chat/completions``): the deployment samples
  from the weights of the snapshot last hot-loaded to it and, asked with ``raw_output``, reports
  token ids as ``choices[i].raw_output`` and ``logprobs.content[].sampling_logprob`` as the
  service does. Chat text is tokenized one character per token (ord % vocab).
- Data plane (``/training/v1/rlorTrainerJobs/{account}/{job}/api/v1/...``, the trainer gateway
  route): healthz, create_session, session_heartbeat, create_model, get_info, forward,
  forward_backward, optim_step, save_weights, save_weights_for_sampler, load_weights and
  retrieve_future. Training calls answer with a future (``request_id``) the SDK polls through
  ``retrieve_future`` (this fake answers ``try_again`` first, so the polling path runs).

It validates what arrives (credentials, datum fields and dtypes, Adam parameters, checkpoint
names, seq_id order, hot-load snapshot identities) and records every request. ``fail_next``
makes the next call to an endpoint answer an HTTP error, to exercise the SDK's retries and error
types. The control plane and the deployment are in :mod:`.control_plane` (a mixin), the
computing half in :mod:`.trainer`; the SDK and HTTP are real.
"""

from __future__ import annotations

import itertools
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from fireworks.training.sdk import types
from fireworks.training.sdk.types.request_error_category import RequestErrorCategory
from fireworks.training.sdk.types.request_failed_response import RequestFailedResponse
from fireworks.training.sdk.types.try_again_response import TryAgainResponse

from rllm.testing.fireworks import trainer as ft
from rllm.testing.fireworks.control_plane import ACCOUNT, FakeControlPlane, read_json
from rllm.testing.service import ContractError, LoopbackFake, ServiceThread

FAKE_API_KEY = "fw-fake-test-key"
TRAINER = "/training/v1/rlorTrainerJobs/{account}/{job}/api/v1"


@dataclass
class Future:
    request_id: str
    model_id: str | None
    result: dict[str, Any] | None = None
    error: str | None = None
    polls: int = 0


@dataclass
class Job:
    job_id: str
    body: dict[str, Any]
    polls: int = 0
    sessions: set[str] = field(default_factory=set)


class FakeFireworksServer(FakeControlPlane, LoopbackFake):
    """The fake service on its own thread and event loop (the SDK's control-plane calls block
    their caller, so the server must not share the test's loop)."""

    def __init__(self, api_key: str = FAKE_API_KEY, vocab_size: int = 128, try_again_polls: int = 1) -> None:
        self.api_key = api_key
        self.vocab_size = vocab_size
        self.try_again_polls = try_again_polls
        self.requests: list[tuple[str, str, Any]] = []  # (method, path, body)
        self.violations: list[str] = []
        self.jobs: dict[str, Job] = {}
        self.created_jobs: list[str] = []  # every job id ever created, in order
        self.deployments: dict[str, dict[str, Any]] = {}
        self.hotloaded: dict[str, list[str]] = {}  # deployment id -> snapshot identities, in order
        self.failed_hotload: dict[str, str] = {}  # deployment id -> the snapshot that failed to load
        self.fail_hotload_of: str | None = None  # a snapshot-name prefix whose hot-load fails
        self.models: dict[str, ft.FireworksModel] = {}
        self.sampler_snapshots: dict[str, dict[str, Any]] = {}
        self.states: dict[str, dict[str, Any]] = {}
        self.fail_next: dict[str, list[int]] = {}  # endpoint name -> HTTP statuses to answer first
        self._futures: dict[str, Future] = {}
        self._ids = itertools.count(1)
        self._service = ServiceThread("fake-fireworks-server", self._app)

    # ---- the app (start, stop and `with` come from LoopbackFake) ------------------------------
    def _app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth_and_record], client_max_size=64 * 1024 * 1024)
        acct = "/v1/accounts/{account}"
        app.add_routes(
            [
                web.get("/v1/accounts", self._accounts),
                web.get(acct + "/trainingShapes/{shape}/versions", self._shape_versions),
                web.get(acct + "/trainingShapes/{shape}/versions/{version}", self._shape_version_get),
                web.post(acct + "/rlorTrainerJobs", self._create_job),
                web.get(acct + "/rlorTrainerJobs/{job}", self._get_job),
                web.delete(acct + "/rlorTrainerJobs/{job}", self._delete_job),
                web.post(acct + "/deployments", self._create_deployment),
                web.get(acct + "/deployments/{deployment}", self._get_deployment),
                web.delete(acct + "/deployments/{deployment}", self._delete_deployment),
                web.post("/hot_load/v1/models/hot_load", self._hotload),
                web.get("/hot_load/v1/models/hot_load", self._hotload_status),
                web.get(TRAINER + "/healthz", self._healthz),
                web.post("/inference/v1/completions", self._completions),
                web.post("/inference/v1/chat/completions", self._completions),
            ]
        )
        app.add_routes([web.post(TRAINER + "/" + name, h) for name, h in self._trainer_routes().items()])
        return app

    # ---- what tests look at ------------------------------------------------------------------
    def bodies(self, suffix: str) -> list[Any]:
        """Recorded bodies of the requests whose path ends with ``suffix``."""
        return [body for _, path, body in self.requests if path.endswith(suffix)]

    # ---- plumbing ----------------------------------------------------------------------------
    @web.middleware
    async def _auth_and_record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            body = raw
        self.requests.append((request.method, request.path_qs, body))
        credential = request.headers.get("X-API-Key") or request.headers.get("Authorization", "")
        if credential.removeprefix("Bearer ") != self.api_key:
            self.violations.append(f"{request.path}: bad credential")
            return web.json_response({"error": {"message": "invalid API key"}}, status=401)
        name = request.path.rsplit("/", 1)[-1]
        statuses = self.fail_next.get(name)
        if statuses:
            status = statuses.pop(0)
            return web.json_response({"error": {"message": f"injected HTTP {status}"}}, status=status)
        try:
            return await handler(request)
        except ContractError as exc:
            self.violations.append(f"{request.path}: {exc}")
            return web.json_response({"error": {"message": str(exc)}}, status=400)

    _body = staticmethod(read_json)

    @staticmethod
    def _parse(model: Any, body: dict[str, Any]) -> Any:
        try:
            return model.model_validate(body)
        except ValueError as exc:
            raise ContractError(f"{model.__name__}: {exc}") from exc

    @staticmethod
    def _reply(obj: Any) -> web.Response:
        return web.json_response(obj.model_dump(mode="json", exclude_none=True))

    def _new_job(self, job_id: str, body: dict[str, Any]) -> Job:
        return Job(job_id, body)

    def _next_id(self) -> int:
        return next(self._ids)

    async def _healthz(self, request: web.Request) -> web.Response:
        if request.match_info["job"] not in self.jobs:
            return web.json_response({"error": {"message": "no such trainer"}}, status=404)
        return self._reply(types.HealthResponse(status="ok"))

    # ---- data plane: the trainer --------------------------------------------------------------
    def _trainer_routes(self) -> dict[str, Any]:
        return {
            "create_session": self._create_session,
            "session_heartbeat": self._heartbeat,
            "telemetry": self._telemetry,
            "create_model": self._create_model,
            "get_info": self._get_info,
            "forward": self._forward,
            "forward_backward": self._forward_backward,
            "optim_step": self._optim_step,
            "save_weights_for_sampler": self._save_for_sampler,
            "save_weights": self._save_state,
            "load_weights": self._load_weights,
            "retrieve_future": self._retrieve_future,
        }

    def _job(self, request: web.Request) -> Job:
        job = self.jobs.get(request.match_info["job"])
        if job is None or request.match_info["account"] != ACCOUNT:
            raise ContractError(f"no trainer job {request.match_info['job']!r} in this account")
        return job

    async def _create_session(self, request: web.Request) -> web.Response:
        self._parse(types.CreateSessionRequest, await self._body(request))
        session_id = f"session-{next(self._ids)}"
        self._job(request).sessions.add(session_id)
        return self._reply(types.CreateSessionResponse(session_id=session_id))

    async def _heartbeat(self, request: web.Request) -> web.Response:
        self._parse(types.SessionHeartbeatRequest, await self._body(request))
        return web.json_response({"type": "session_heartbeat"})

    async def _telemetry(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "accepted"})

    async def _create_model(self, request: web.Request) -> web.Response:
        job = self._job(request)
        req = self._parse(types.CreateModelRequest, await self._body(request))
        if req.session_id not in job.sessions:
            raise ContractError(f"create_model in unknown session {req.session_id!r}")
        if req.base_model != job.body["trainingConfig"]["baseModel"]:
            raise ContractError(f"base_model {req.base_model!r} is not this trainer's base model")
        rank = req.lora_config.rank if req.lora_config else 0
        seed = (req.lora_config.seed if req.lora_config else None) or 0
        model_id = f"{job.job_id}-model-{next(self._ids)}"
        model = ft.FireworksModel.new(model_id, req.base_model, rank, seed, self.vocab_size)
        model.job_id, model.run_id = job.job_id, f"run-{uuid.uuid4().hex}"
        self.models[model_id] = model
        future = self._new_future(model_id)
        future.result = types.CreateModelResponse(model_id=model_id).model_dump(mode="json")
        return self._future_json(future)

    async def _get_info(self, request: web.Request) -> web.Response:
        model = self._model((await self._body(request)).get("model_id"))
        info = types.GetInfoResponse(
            model_id=model.model_id,
            model_data=types.ModelData(model_name=model.base_model),
        )
        return self._reply(info)

    def _model(self, model_id: Any) -> ft.FireworksModel:
        model = self.models.get(str(model_id))
        if model is None:
            raise ContractError(f"unknown model_id {model_id!r}")
        return model

    def _new_future(self, model_id: str | None) -> Future:
        future = Future(request_id=f"req-{next(self._ids)}", model_id=model_id)
        self._futures[future.request_id] = future
        return future

    @staticmethod
    def _future_json(future: Future) -> web.Response:
        untyped = types.UntypedAPIFuture(request_id=future.request_id, model_id=future.model_id)
        return web.json_response(untyped.model_dump(mode="json"))

    def _run(self, model: ft.FireworksModel, seq_id: Any, op: Any) -> web.Response:
        """Run ``op`` as the next request of ``model``. seq_ids must increase; a gap is a request
        the service never accepted (e.g. one answered with an HTTP error)."""
        if seq_id is not None and seq_id < model.next_seq:
            raise ContractError(f"seq_id {seq_id!r} is stale or repeated (next is {model.next_seq})")
        if seq_id is not None:
            model.next_seq = seq_id + 1
        future = self._new_future(model.model_id)
        try:
            future.result = op()
        except ContractError as exc:  # a user error found while running: a failed future
            self.violations.append(str(exc))
            future.error = str(exc)
        return self._future_json(future)

    async def _forward(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        model = self._model(body.get("model_id"))
        fwd = body.get("forward_input") or {}
        return self._run(
            model, body.get("seq_id"), lambda: ft.forward(model, fwd["data"], fwd["loss_fn"], self.vocab_size)
        )

    async def _forward_backward(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        model = self._model(body.get("model_id"))
        fb = body.get("forward_backward_input") or {}
        return self._run(
            model,
            body.get("seq_id"),
            lambda: ft.forward_backward(model, fb["data"], fb["loss_fn"], self.vocab_size),
        )

    async def _optim_step(self, request: web.Request) -> web.Response:
        req = self._parse(types.OptimStepRequest, await self._body(request))
        model = self._model(req.model_id)
        params = req.adam_params.model_dump()
        return self._run(model, req.seq_id, lambda: ft.optim_step(model, params))

    @staticmethod
    def _checkpoint_path(model: ft.FireworksModel, name: str | None) -> str:
        """``<account>/run-<32 hex>/<name>``: the form the SDK accepts back in load_state."""
        if not name or "/" in name:
            raise ContractError(f"checkpoint name {name!r} must be a non-empty name without '/'")
        return f"{ACCOUNT}/{model.run_id}/{name}"

    async def _save_for_sampler(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        # Fireworks' extension fields ride beside the Tinker request (the SDK's extra_body).
        checkpoint_type = body.pop("checkpoint_type", None)
        body.pop("export_precision", None)
        body.pop("metadata", None)
        req = self._parse(types.SaveWeightsForSamplerRequest, body)
        model = self._model(req.model_id)
        if model.lora_rank > 0 and checkpoint_type not in (None, "base"):
            raise ContractError(f"a LoRA sampler checkpoint must be 'base', got {checkpoint_type!r}")

        def run() -> dict[str, Any]:
            path = self._checkpoint_path(model, req.path)
            # The snapshot identity the deployment hot-loads is the checkpoint's name.
            self.sampler_snapshots[str(req.path)] = ft.snapshot(model, with_optimizer=False)
            return {"path": path, "type": "save_weights_for_sampler"}

        return self._run(model, req.seq_id, run)

    async def _save_state(self, request: web.Request) -> web.Response:
        req = self._parse(types.SaveWeightsRequest, await self._body(request))
        model = self._model(req.model_id)

        def run() -> dict[str, Any]:
            path = self._checkpoint_path(model, req.path)
            if path in self.states:
                raise ContractError(f"checkpoint {path} already exists")
            state = {**ft.snapshot(model, with_optimizer=True), "base_model": model.base_model}
            self.states[path] = self.states[f"cross_job://{model.job_id}/{req.path}"] = state
            return types.SaveWeightsResponse(path=path, type="save_weights").model_dump(mode="json")

        return self._run(model, req.seq_id, run)

    async def _load_weights(self, request: web.Request) -> web.Response:
        req = self._parse(types.LoadWeightsRequest, await self._body(request))
        model = self._model(req.model_id)

        def run() -> dict[str, Any]:
            state = self.states.get(req.path)
            if state is None:
                raise ContractError(f"no checkpoint at {req.path!r}")
            if state["base_model"] != model.base_model:
                raise ContractError("checkpoint was saved from another base model")
            ft.restore(model, state, with_optimizer=req.optimizer)
            return {"path": req.path, "type": "load_weights"}

        return self._run(model, req.seq_id, run)

    async def _retrieve_future(self, request: web.Request) -> web.Response:
        req = self._parse(types.FutureRetrieveRequest, await self._body(request))
        future = self._futures.get(req.request_id)
        if future is None:
            raise ContractError(f"retrieve_future of unknown request_id {req.request_id!r}")
        if future.polls < self.try_again_polls:
            future.polls += 1
            again = TryAgainResponse(request_id=future.request_id, queue_state="active")
            return web.json_response(again.model_dump(mode="json"))
        if future.error is not None:
            failed = RequestFailedResponse(error=future.error, category=RequestErrorCategory.User)
            return web.json_response(failed.model_dump(mode="json"))
        return web.json_response(future.result)
