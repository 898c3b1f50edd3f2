"""A FAKE of the remote, paid Tinker training service, for contract tests.

The real service cannot run here (it is a hosted GPU service behind an API key), so this module
stands in for it: a real aiohttp HTTP server on 127.0.0.1 that speaks the wire protocol the
official ``tinker`` SDK uses (learned by reading the installed SDK, version 0.38):

- JSON POSTs under ``/api/v1``: client/config, auth/token (API key -> short-lived JWT, sent back
  as ``X-API-Key`` on every later request), client/dynamic_config, create_session,
  session_heartbeat, sessions/{id}/finish, telemetry, create_model, get_info, optim_step,
  save_weights, save_weights_for_sampler, load_weights, retrieve_future.
- ``forward_backward`` bodies are protobuf (the SDK's published ``tinker_public.proto``),
  zstd-compressed when the client config asks for it; ForwardBackwardOutput results go back
  as protobuf too.
- Training calls answer at once with a future (``request_id``); the SDK polls
  ``retrieve_future`` until the result is ready (this fake answers ``try_again`` first, so
  the polling path runs). Requests of one model run in ``seq_id`` order, as the service does.

It validates what the SDK sends (this is the contract under test): loss names, loss_fn_config
keys, each datum's loss_fn_inputs (names, dtypes, lengths aligned with the model input), Adam
parameters, checkpoint names and paths. A violation answers HTTP 400 naming the problem and is
kept in ``violations``.

Where the service computes, the fake computes too, deterministically: each training model is a
bigram language model (a [vocab, vocab] logit table, seeded from the LoRA seed) trained with the
documented built-in losses and torch's AdamW, so logprobs, losses and updates are real numbers
that move when our backend trains. The wire contract is in :mod:`rllm.testing.tinker.contract`,
the computing half in :mod:`rllm.testing.tinker.training`, credentials and sessions in
:mod:`rllm.testing.tinker.sessions`, futures and seq_id order in
:mod:`rllm.testing.tinker.futures`; the SDK and HTTP are real.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import torch
import zstandard
from aiohttp import web
from tinker.proto import tinker_public_pb2 as pb

from rllm.testing.service import ContractError, LoopbackFake, ServiceThread
from rllm.testing.tinker.contract import ADAM_KEYS, API, FAKE_API_KEY, parse_forward_backward
from rllm.testing.tinker.futures import FakeFutures, future_json
from rllm.testing.tinker.sessions import FakeTinkerSessions
from rllm.testing.tinker.training import RecordedRequest, TinkerModel, run_forward_backward, run_optim_step


class FakeTinkerServer(FakeTinkerSessions, LoopbackFake):
    """The fake service, run on its own thread and event loop (the SDK blocks its caller while
    it creates a session, so the server must not share the test's loop).

    ``client_config`` overrides the feature flags sent to the SDK from /client/config.
    """

    def __init__(
        self,
        api_key: str = FAKE_API_KEY,
        vocab_size: int = 128,
        client_config: dict[str, Any] | None = None,
        try_again_polls: int = 1,
        seq_gap_timeout_s: float = 3.0,
    ) -> None:
        self.api_key = api_key
        self.vocab_size = vocab_size
        self.client_config = {
            "pjwt_auth_enabled": True,
            "proto_compress_fwdbwd": True,
            "use_pyqwest_transport": True,
            "custom_loss_server_side": False,
            **(client_config or {}),
        }
        self.requests: list[RecordedRequest] = []
        self.violations: list[str] = []
        self.sessions: dict[str, dict[str, Any]] = {}
        self.models: dict[str, TinkerModel] = {}
        self.sampler_checkpoints: dict[str, torch.Tensor] = {}
        self.state_checkpoints: dict[str, dict[str, Any]] = {}
        self._jwts: set[str] = set()
        self._ids = itertools.count(1)  # sessions' and futures' numbers
        self._futures = FakeFutures(self._ids, self.violations, try_again_polls, seq_gap_timeout_s)
        # The fake decodes Content-Encoding itself: the SDK's zstd bodies are part of the contract.
        self._service = ServiceThread("fake-tinker-server", self._app, auto_decompress=False)

    # ---- the app (start, stop and `with` come from LoopbackFake) ------------------------------
    def _app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth_and_record], client_max_size=64 * 1024 * 1024)
        app.add_routes([web.post(f"{API}/{name}", handler) for name, handler in self._routes().items()])
        app.add_routes([web.post(API + "/sessions/{session_id}/finish", self._finish_session)])
        return app

    # ---- what tests look at ------------------------------------------------------------------
    def bodies(self, name: str) -> list[Any]:
        """Recorded bodies of one endpoint (``name`` as after /api/v1/)."""
        return [r.body for r in self.requests if r.path == f"{API}/{name}"]

    def model_logprobs(self, model_id: str, tokens: list[int]) -> list[float]:
        """log p(tokens[i] | tokens[i-1]) for i >= 1 under a model's current weights."""
        model = self.models[model_id]
        t = torch.tensor(tokens)
        with torch.no_grad():
            return model.token_logprobs(t[:-1], t[1:]).tolist()

    # ---- HTTP plumbing -----------------------------------------------------------------------
    def _routes(self) -> dict[str, Any]:
        return {
            "client/config": self._client_config,
            "auth/token": self._auth_token,
            "client/dynamic_config": self._dynamic_config,
            "create_session": self._create_session,
            "session_heartbeat": self._heartbeat,
            "telemetry": self._telemetry,
            "create_model": self._create_model,
            "get_info": self._get_info,
            "forward_backward": self._forward_backward,
            "optim_step": self._optim_step,
            "save_weights_for_sampler": self._save_for_sampler,
            "save_weights": self._save_state,
            "load_weights": self._load_weights,
            "retrieve_future": self._retrieve_future,
        }

    def _model(self, body: dict[str, Any]) -> TinkerModel:
        model = self.models.get(str(body.get("model_id")))
        if model is None:
            raise ContractError(f"unknown model_id {body.get('model_id')!r}")
        return model

    # ---- models --------------------------------------------------------------------------------
    async def _create_model(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        session_id, seq = body.get("session_id"), body.get("model_seq_id")
        if session_id not in self.sessions or not isinstance(seq, int):
            raise ContractError(f"create_model needs a known session_id and model_seq_id, got {body!r}")
        lora = body.get("lora_config") or {}
        if not isinstance(lora.get("rank"), int) or lora["rank"] < 1:
            raise ContractError(f"lora_config.rank must be a positive int, got {lora.get('rank')!r}")
        if (body.get("optimizer_config") or {}).get("type") != "adamw":
            raise ContractError(f"optimizer_config {body.get('optimizer_config')!r} is not adamw")
        if not body.get("base_model"):
            raise ContractError("create_model without base_model")
        model_id = f"{session_id}:train:{seq}"
        seed = lora.get("seed") or 0
        self.models[model_id] = TinkerModel.new(
            model_id, body["base_model"], lora["rank"], seed, self.vocab_size
        )
        future = self._futures.new(model_id)
        future.result = {"model_id": model_id, "type": "create_model"}
        future.done.set()
        return future_json(future)

    async def _get_info(self, request: web.Request) -> web.Response:
        model = self._model(await self._json(request))
        return web.json_response(
            {
                "type": "get_info",
                "model_id": model.model_id,
                "model_data": {
                    "arch": "fake-bigram",
                    "model_name": model.base_model,
                    "tokenizer_id": model.base_model,
                },
                "is_lora": True,
                "lora_rank": model.lora_rank,
                "model_name": model.base_model,
            }
        )

    # ---- training ------------------------------------------------------------------------------
    async def _forward_backward(self, request: web.Request) -> web.Response:
        if request.content_type != "application/x-protobuf":
            raise ContractError(f"forward_backward body must be protobuf, got {request.content_type}")
        raw = await request.read()
        encoding = request.headers.get("Content-Encoding", "")
        if encoding == "zstd":
            raw = zstandard.ZstdDecompressor().decompress(raw)
        elif encoding:
            raise ContractError(f"unexpected Content-Encoding {encoding!r}")
        msg = pb.ForwardBackwardRequest()
        msg.ParseFromString(raw)
        parsed = parse_forward_backward(msg, self.vocab_size)
        parsed["content_encoding"] = encoding
        self.requests.append(RecordedRequest(request.path, parsed))
        model = self._model({"model_id": msg.model_id})
        future = self._futures.enqueue(model, msg.seq_id, lambda: run_forward_backward(model, parsed))
        return future_json(future)

    async def _optim_step(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        params = body.get("adam_params")
        if not isinstance(params, dict) or set(params) != ADAM_KEYS:
            raise ContractError(f"optim_step needs adam_params with keys {sorted(ADAM_KEYS)}, got {params!r}")
        if params["learning_rate"] <= 0 or not 0 <= params["beta1"] < 1 or not 0 <= params["beta2"] < 1:
            raise ContractError(f"optim_step: invalid adam_params {params}")
        model = self._model(body)
        future = self._futures.enqueue(model, body.get("seq_id"), lambda: run_optim_step(model, params))
        return future_json(future)

    # ---- checkpoints ---------------------------------------------------------------------------
    def _checkpoint_path(self, model: TinkerModel, kind: str, name: Any) -> str:
        if not isinstance(name, str) or not name or "/" in name:
            raise ContractError(f"checkpoint name {name!r} must be a non-empty string without '/'")
        if (kind, name) in model.checkpoint_names:
            raise ContractError(f"a {kind} checkpoint named {name!r} already exists in {model.model_id}")
        model.checkpoint_names.add((kind, name))
        return f"tinker://{model.model_id}/{kind}/{name}"

    async def _save_for_sampler(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        model = self._model(body)

        def run() -> dict[str, Any]:
            path = self._checkpoint_path(model, "sampler_weights", body.get("path"))
            self.sampler_checkpoints[path] = model.logits.detach().clone()
            return {"path": path, "type": "save_weights_for_sampler"}

        return future_json(self._futures.enqueue(model, body.get("seq_id"), run))

    async def _save_state(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        model = self._model(body)

        def run() -> dict[str, Any]:
            path = self._checkpoint_path(model, "weights", body.get("path"))
            self.state_checkpoints[path] = {
                "base_model": model.base_model,
                "lora_rank": model.lora_rank,
                "logits": model.logits.detach().clone(),
                "optimizer": copy.deepcopy(model.optimizer.state_dict()),
            }
            return {"path": path, "type": "save_weights"}

        return future_json(self._futures.enqueue(model, body.get("seq_id"), run))

    async def _load_weights(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        session_id, seq = body.get("session_id"), body.get("model_seq_id")
        if session_id not in self.sessions or not isinstance(seq, int) or body.get("model_id"):
            raise ContractError(f"load_weights: only create-via-load addressing is faked, got {body!r}")
        model_id = f"{session_id}:train:{seq}"
        future = self._futures.new(model_id)
        state = self.state_checkpoints.get(str(body.get("path")))
        if state is None:
            future.error = f"no training checkpoint at {body.get('path')!r}"
        else:
            model = TinkerModel.new(
                model_id, body.get("base_model") or state["base_model"], state["lora_rank"], 0, 1
            )
            model.logits = torch.nn.Parameter(state["logits"].clone())
            model.optimizer = torch.optim.AdamW([model.logits])
            if body.get("optimizer"):
                model.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
            self.models[model_id] = model
            future.result = {"path": body["path"], "model_id": model_id, "type": "load_weights"}
        future.done.set()
        return future_json(future)

    # ---- futures ---------------------------------------------------------------------------
    async def _retrieve_future(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        return await self._futures.retrieve(body, request.headers.get("Accept", ""))
