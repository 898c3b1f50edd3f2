"""Training memory of the local tinker trainer: peak resident memory and step time, the behaviour
before issue #48 against the new default, LoRA and full weights, with the trainer's pre-step
estimate (local/memory.py) printed beside each measured peak.

Model: SmolLM2-135M-Instruct's shape (Llama, 30 layers, hidden 576, 9 heads / 3 KV heads, MLP
1536, vocabulary 49,152, tied embeddings; 134.5M parameters), randomly initialised here: the
memory profile is the real model's (``--model DIR`` takes a real one). Batch: a learning-benchmark
step, ``--sequences`` sequences (default 64 = 8 tasks x 8 samples) of a ``--prompt``-token prompt
(40) and a ``--completion``-token completion (64) trained with ``ppo_clip`` on random advantages.
The process holds what ``rllm train`` holds: the trainer's model and the sampler's copy of it
(``sampler_weights = "copy"``), float32 on CPU.

Each configuration runs in a fresh process: LocalTrainer.train_step ``--steps`` times; the peak of
each step is ``VmHWM`` after the kernel's high-water mark is reset at the step's start
(``/proc/self/clear_refs``), so a peak that grows from step to step shows.

- ``new-lora`` / ``new-full``: the defaults (micro-batch, checkpointing and logits chunk from the
  estimate; chunked logprobs; freed heap memory handed back after each step; a LoRA sampler copy
  sharing the frozen base weights).
- ``old-lora`` / ``old-full``: the behaviour before #48, rebuilt here: ``micro_batch_tokens = 0``
  (the whole batch at once), no checkpointing, the full-vocabulary float32 logits and their
  log-softmax for every position, no heap trim, a full deep copy for the sampler. At 64 sequences
  this was OOM-killed at 24 GB, so ``--old-sequences`` (default 8 and 16) are measured and the
  peak extrapolated linearly in the sequences.

``--gpu-estimate`` prints the estimate alone for Qwen3-0.6B's shape on a GPU (bf16, full-weight
AdamW, 16,384 tokens a step), to set beside prime-rl's published 12.5 GiB peak at 16k.

    uv run --no-sync python benchmarks/train_memory.py                         # everything
    uv run --no-sync python benchmarks/train_memory.py --configs new-lora --steps 20
    uv run --no-sync python benchmarks/train_memory.py --gpu-estimate
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIGS = ("new-lora", "new-full", "old-lora", "old-full")
SMOLLM2 = {
    "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
    "intermediate_size": 1536, "vocab_size": 49152, "head_dim": 64, "tie_word_embeddings": True,
    "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "max_position_embeddings": 8192,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
}  # fmt: skip


def build_model(path: Path) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2))
    model.to(torch.bfloat16).save_pretrained(path)  # loaded back in float32, as on CPU by default
    return path


def status_gb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) * 1024 / 1e9
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS


def batch(sequences: int, prompt: int, completion: int, vocab: int, step: int) -> list:
    import numpy as np

    from rllm.types import FloatArray, TokenArray, TrainSequence

    rng = np.random.default_rng(step)
    out = []
    for _ in range(sequences):
        n = prompt + completion
        advantage = float(rng.normal())
        out.append(
            TrainSequence(
                input_ids=TokenArray(rng.integers(3, vocab, n).tolist()),
                loss_mask=FloatArray([0.0] * prompt + [1.0] * completion),
                advantages=FloatArray([advantage] * n),
                sampler_logprobs=FloatArray([0.0] * prompt + (-5 * rng.random(completion)).tolist()),
            )
        )
    return out


def install_old_behaviour() -> None:
    """The trainer as it was before #48 (see the module docstring)."""
    import torch

    from rllm.backends.tinker.local import trainer
    from rllm.backends.tinker.local.logprobs import TokenStats

    def full_logits_stats(
        model, head, batch, *, chunk, with_entropy=False, entropy_grad=False, teacher_ids=None
    ):
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits
        logits = logits[:, :-1, :].float()
        log_norm = torch.logsumexp(logits, dim=-1)
        logprobs = logits.gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1) - log_norm
        entropy = None
        if with_entropy or entropy_grad:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                probs = torch.softmax(logits, dim=-1)
                entropy = log_norm - (probs * logits).sum(-1)
        return TokenStats(logprobs, entropy)

    trainer.token_stats = full_logits_stats
    trainer.release_free_memory = lambda: None


def child(args: argparse.Namespace) -> dict:
    import torch

    from rllm.algos.config import AlgorithmConfig
    from rllm.backends.tinker.config import parse_config
    from rllm.backends.tinker.local.model import load_policy
    from rllm.backends.tinker.local.service import sampler_copy
    from rllm.backends.tinker.local.trainer import LocalTrainer

    name, sequences = args.child, args.sequences
    old = name.startswith("old")
    options = {
        "model": str(args.model),
        "dtype": "float32",
        "torch_threads": args.threads,
        "learning_rate": 1e-5,
    }
    options["lora"] = {"rank": 16 if name.endswith("lora") else 0}
    if old:
        install_old_behaviour()
        # The whole batch at once: a limit high enough that the planner never lowers it.
        options |= {"micro_batch_tokens": 0, "gradient_checkpointing": False, "memory_limit_gb": 1000.0}
    config = parse_config(options)
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    model = load_policy(config, device, torch.float32)
    sampler = copy.deepcopy(model).eval() if old else sampler_copy(model)  # held, as the service does
    local = LocalTrainer(model, config, device, 2)
    loaded = status_gb("VmRSS")
    vocab = local.vocab_size
    algo = AlgorithmConfig()
    first = batch(sequences, args.prompt, args.completion, vocab, 0)
    plan = local.plan_memory(first, [list(range(len(first)))], algo)
    steps = []
    for step in range(args.steps):
        sequences_now = first if step == 0 else batch(sequences, args.prompt, args.completion, vocab, step)
        reset_peak()
        started = time.perf_counter()
        metrics = local.train_step(sequences_now, algo)
        steps.append(
            {"peak_gb": status_gb("VmHWM"), "after_gb": status_gb("VmRSS"), "s": time.perf_counter() - started,
             "loss": metrics["loss"]}
        )  # fmt: skip
        print(json.dumps({"step": step, **steps[-1]}), file=sys.stderr, flush=True)
    del sampler
    return {
        "config": name,
        "sequences": sequences,
        "tokens": sequences * (args.prompt + args.completion),
        "loaded_gb": loaded,
        "estimate_gb": plan.estimate.total / 1e9,
        "micro_batch_tokens": plan.micro_batch_tokens,
        "checkpointing": plan.checkpointing,
        "steps": steps,
    }


def run(args: argparse.Namespace, name: str, sequences: int) -> dict:
    command = [
        sys.executable, __file__, "--child", name, "--model", str(args.model), "--sequences", str(sequences),
        "--steps", str(args.steps if name.startswith("new") else args.old_steps), "--prompt", str(args.prompt),
        "--completion", str(args.completion), "--threads", str(args.threads),
    ]  # fmt: skip
    # Each step's line goes on to stderr as it comes (a 20-step run takes a while on a busy CPU).
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stderr is not None
    last = ""
    for line in child.stderr:
        print(f"  {name}: {line.rstrip()}", file=sys.stderr, flush=True)
        last = line.strip() or last
    out = child.stdout.read()
    if child.wait() != 0:
        return {"config": name, "sequences": sequences, "failed": f"exit {child.returncode}: {last}"}
    return json.loads(out.strip().splitlines()[-1])


def report(result: dict) -> str:
    if "failed" in result:
        return f"{result['config']:9} {result['sequences']:3} seqs  FAILED {result['failed']}"
    peaks = [s["peak_gb"] for s in result["steps"]]
    times = [s["s"] for s in result["steps"]]
    later = times[1:] or times
    return (
        f"{result['config']:9} {result['sequences']:3} seqs ({result['tokens']} tokens)  micro_batch_tokens="
        f"{result['micro_batch_tokens']} ckpt={str(result['checkpointing']).lower()}  loaded {result['loaded_gb']:.2f} GB  "
        f"estimate {result['estimate_gb']:.2f} GB  measured peak {max(peaks):.2f} GB (step 1 {peaks[0]:.2f}, "
        f"last {peaks[-1]:.2f}, {len(peaks)} steps)  step {sorted(later)[len(later) // 2]:.0f} s (median)"
    )


def gpu_estimate() -> list[str]:
    """Qwen3-0.6B on a GPU, the local trainer's estimate at 16k tokens a step."""
    from rllm.backends.tinker.local.memory import (
        GIB,
        ModelShape,
        StepRequest,
        estimate_step,
        fresh_resident,
        plan_step,
    )

    shape = ModelShape.llama_like(
        layers=28, hidden=1024, intermediate=3072, heads=16, kv_heads=8, head_dim=128, vocab=151_936,
        param_bytes=2, tied=True, qk_norm=True,
    )  # fmt: skip
    lines = [
        f"Qwen3-0.6B shape: {shape.params / 1e6:.0f}M parameters, bf16, full-weight AdamW, 16384 tokens a step"
    ]
    resident = fresh_resident(shape)  # the trainer's weights; torch's allocator holds nothing else
    for tokens, ckpt, chunk in ((16384, True, 883), (16384, False, 883), (8192, True, 883)):
        est = estimate_step(
            shape, tokens, checkpointing=ckpt, chunk=chunk, resident=resident, device_type="cuda"
        )
        lines.append(f"  micro-batch {tokens} tokens, checkpointing={str(ckpt).lower()}: {est.describe()}")
    request = StepRequest(
        micro_batch_tokens="auto",
        checkpointing="auto",
        logits_chunk="auto",
        batch_tokens=16384,
        longest=16384,
    )
    for budget in (80, 24, 16):
        try:
            plan = plan_step(
                shape,
                request,
                resident=resident,
                budget=int(0.9 * budget * GIB),
                device_type="cuda",
                can_checkpoint=True,
            )
            lines.append(f"  auto plan on a {budget} GiB GPU (90% usable): {plan.line()}")
        except Exception as refused:
            lines.append(f"  auto plan on a {budget} GiB GPU: refused: {refused}")
    lines.append("  (the sampler's copy, sampler_weights='copy', adds the weights again: "
                 f"{shape.params * 2 / GIB:.2f} GiB; prime-rl serves with vLLM on other GPUs)")  # fmt: skip
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument(
        "--model", type=Path, default=None, help="a Hugging Face folder (default: random SmolLM2 shape)"
    )
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument(
        "--old-sequences", default="8,16", help="batch sizes the old behaviour is measured at"
    )
    parser.add_argument("--prompt", type=int, default=40)
    parser.add_argument("--completion", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--old-steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--gpu-estimate", action="store_true", help="print the GPU estimate only")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    if args.gpu_estimate:
        print("\n".join(gpu_estimate()))
        return
    with tempfile.TemporaryDirectory() as scratch:
        if args.model is None:
            args.model = build_model(Path(scratch) / "smollm2-shape")
        for name in args.configs.split(","):
            sizes = (
                [args.sequences]
                if name.startswith("new")
                else [int(n) for n in args.old_sequences.split(",")]
            )
            results = [run(args, name, n) for n in sizes]
            for result in results:
                print(report(result), flush=True)
            ok = [r for r in results if "failed" not in r]
            if name.startswith("old") and len(ok) >= 2:
                (a, b) = ok[:2]
                pa, pb = max(s["peak_gb"] for s in a["steps"]), max(s["peak_gb"] for s in b["steps"])
                slope = (pb - pa) / (b["sequences"] - a["sequences"])
                print(f"{name:9} extrapolated to {args.sequences} seqs: {pb + slope * (args.sequences - b['sequences']):.1f} GB "
                      f"({slope:.3f} GB per sequence)", flush=True)  # fmt: skip
    print("\n".join(gpu_estimate()))


if __name__ == "__main__":
    main()
