#!/usr/bin/env bash
# GPU smoke run of the verl backend (one H200-class GPU, about 8 minutes at most):
#   1. build a tiny model locally (2 layers, head_dim 64, a word-level tokenizer);
#   2. `rllm train say --backend verl` for SMOKE_STEPS (>= 3) steps: verl's FSDP2 actor and an
#      async vLLM rollout server on 1 GPU, agents reaching vLLM through the rLLM gateway;
#   3. print step time, tokens/s, reward and peak GPU memory (from the run's metrics.jsonl);
#   4. with SMOKE_PLAIN=1 (default), the same model and batch sizes with plain verl
#      (`verl.trainer.main_ppo`, its own PPO trainer) and the ratio of the two step times.
#
# Needs a Python with this workspace, verl and vLLM installed (PYTHON, default: .venv/bin/python
# after `uv sync --extra verl --package rllm-backend-verl` plus `uv pip install vllm`).
# Status: written without a GPU; it has not run yet (benchmarks/RESULTS.md, "verl GPU smoke run").
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
STEPS=${SMOKE_STEPS:-3}
TASKS=${SMOKE_TASKS:-32}
GROUP=${SMOKE_GROUP:-4}
WORK=${SMOKE_WORK:-$(mktemp -d)}
OUT_DIR=${OUT:-$WORK}
[ "$STEPS" -ge 3 ] || { echo "SMOKE_STEPS must be >= 3" >&2; exit 2; }

"$PYTHON" - "$WORK/model" <<'PY'
import sys
from rllm.tiny import init_tiny_model
from rllm.engine.training.launch import task_vocabulary
from rllm.engine.plugins import load_cookbook
init_tiny_model(sys.argv[1], vocab_words=task_vocabulary(load_cookbook("say")), seed=0)
PY

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
start=$(date +%s)
timeout 360 "$PYTHON" -m rllm.cli.main train say --backend verl --overwrite --out "$WORK/rllm" \
    total_steps="$STEPS" tasks_per_step="$TASKS" group_size="$GROUP" val_every=0 ckpt_every=0 \
    backend.options.model="$WORK/model" backend.options.learning_rate=5e-4 \
    backend.options.cluster.gpus_per_node=1 backend.options.strategy=fsdp2 \
    backend.options.rollout.engine=vllm backend.options.rollout.tensor_model_parallel_size=1 \
    backend.options.rollout.gpu_memory_utilization=0.3 backend.options.rollout.max_model_len=512 \
    backend.options.micro_batch_size_per_gpu=64 2>&1 | tee "$OUT_DIR/rllm_verl_train.log" | tail -20
echo "rllm+verl wall time: $(( $(date +%s) - start )) s"

summary() {  # metrics.jsonl -> one line: mean step time after the first (warm-up) step, tokens/s, reward, peak GPU memory
    "$PYTHON" - "$1" "$2" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
steady = rows[1:] or rows
step_s = sum(r.get("time/rollout_s", 0) + r.get("time/train_s", 0) for r in steady) / len(steady)
tokens = sum(r.get("tokens/response_mean", 0) * r.get("episodes", 0) for r in steady) / len(steady)
memory = max(r.get("perf/max_memory_allocated_gb", 0.0) for r in rows)
print(f"{sys.argv[2]}: step {step_s:.2f} s, {tokens / step_s:.0f} response tokens/s, "
      f"reward {rows[0].get('reward/mean', 0):.3f} -> {rows[-1].get('reward/mean', 0):.3f}, peak GPU memory {memory:.2f} GiB")
print(f"STEP_S={step_s}")
PY
}
summary "$WORK/rllm/metrics.jsonl" "rllm+verl" | tee "$OUT_DIR/summary.txt"

if [ "${SMOKE_PLAIN:-1}" = "1" ]; then
    # Plain verl on the same tiny model and batch: the say prompts as a parquet dataset and the
    # same reward (the reply starts with the word), verl's own agent loop and PPO trainer.
    "$PYTHON" - "$WORK" <<'PY'
import sys, pandas as pd
from rllm.engine.plugins import load_cookbook
tasks = load_cookbook("say").load_tasks("train")
rows = [{"data_source": "say", "prompt": [{"role": "user", "content": t.instruction if isinstance(t.instruction, str) else str(t.instruction)}],
         "reward_model": {"style": "rule", "ground_truth": t.metadata["words"][0]}, "extra_info": {"index": i}} for i, t in enumerate(tasks)]
pd.DataFrame(rows).to_parquet(f"{sys.argv[1]}/say.parquet")
open(f"{sys.argv[1]}/say_reward.py", "w").write(
    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
    "    words = solution_str.strip().split()\n"
    "    return float(bool(words) and words[0] == ground_truth)\n")
PY
    start=$(date +%s)
    timeout 300 "$PYTHON" -m verl.trainer.main_ppo \
        data.train_files="$WORK/say.parquet" data.val_files="$WORK/say.parquet" \
        data.train_batch_size="$TASKS" data.max_prompt_length=64 data.max_response_length=2 \
        actor_rollout_ref.model.path="$WORK/model" actor_rollout_ref.actor.optim.lr=5e-4 \
        actor_rollout_ref.actor.ppo_mini_batch_size="$TASKS" actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64 \
        actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n="$GROUP" \
        actor_rollout_ref.rollout.tensor_model_parallel_size=1 actor_rollout_ref.rollout.gpu_memory_utilization=0.3 \
        actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64 \
        actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=64 \
        algorithm.adv_estimator=grpo custom_reward_function.path="$WORK/say_reward.py" \
        trainer.n_gpus_per_node=1 trainer.nnodes=1 trainer.total_training_steps="$STEPS" \
        trainer.logger='["console"]' trainer.val_before_train=False trainer.test_freq=-1 trainer.save_freq=-1 \
        2>&1 | tee "$OUT_DIR/plain_verl_train.log" | grep -E "step:|timing_s/step" | tail -5
    echo "plain verl wall time: $(( $(date +%s) - start )) s"
    "$PYTHON" - "$OUT_DIR/plain_verl_train.log" "$OUT_DIR/summary.txt" <<'PY'
import re, sys
steps = [float(m) for m in re.findall(r"timing_s/step:([0-9.]+)", open(sys.argv[1]).read())]
ours = float(re.search(r"STEP_S=([0-9.]+)", open(sys.argv[2]).read()).group(1))
if steps:
    plain = sum(steps[1:] or steps) / len(steps[1:] or steps)
    line = f"plain verl: step {plain:.2f} s; rllm+verl / plain verl = {ours / plain:.2f}x (target <= 1.05x)"
else:
    line = "plain verl: no step timings found (see plain_verl_train.log)"
print(line)
open(sys.argv[2], "a").write(line + "\n")
PY
fi
