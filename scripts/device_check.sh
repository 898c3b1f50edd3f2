#!/usr/bin/env bash
# One-shot GPU check on a lent device machine (one H200, no network, python3 = 3.12 with torch).
# Why: CI has no GPU; this shows the tinker backend tests, the end-to-end training tests and the
# README's main job (`rllm train say`) working on CUDA (bf16), with GPU memory and steps/s.
#
#   here:   bash scripts/device_check.sh --prepare   # (re)build .whl/: our wheels + cp312 deps from uv.lock
#   there:  bash scripts/device_check.sh             # device `run` with carry [".whl"]
#
# Nothing is fetched there: .whl carries our packages' dist-info (entry points) and the dependencies
# the image lacks; the image's torch/transformers/peft/numpy are the ones used, and the tree's own
# source replaces our wheels' code. Logs and summary.txt go to $OUT (at most 8 files come back).
# Env knobs: DEVCHK_BUDGET (seconds for the whole script, default 420); DEVCHK_PARTS (default
# a,b,e,c,d: a tinker tests, b e2e tests, e engine benchmark, c train say, d throughput; run in
# the order a b e d c);
# DEVCHK_A_COMBOS (engine benchmark (a) runs as "workers:upstreams" pairs, default "12:4 11:4 10:5")
# and DEVCHK_A_ROLLOUTS (rollouts per (a) run, default 20000);
# DEVCHK_SAY_S (time limit of the `rllm train say` run, default 150); DEVCHK_WORK (scratch, /tmp).
set -uo pipefail
cd "$(dirname "$0")/.."

# Third-party runtime dependencies the device image lacks (versions come from uv.lock), and
# fallbacks installed there only if the image's own copy is too old for a carried wheel.
CARRY="msgspec httptools openai httpx2 httpcore2 truststore jiter pydantic pydantic-core typing-inspection
annotated-types sniffio distro tinker orjson pyqwest opentelemetry-api zstandard h2 hpack hyperframe pytest-asyncio"
FALLBACK="typing-extensions anyio idna h11 pytest pluggy iniconfig"

if [ "${1:-}" = "--prepare" ]; then
    set -e
    rm -rf .whl && mkdir -p .whl/fallback
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
    uv build -q --all-packages --wheel -o .whl
    pins() { python3 -c 'import sys, tomllib
lock = {p["name"]: p["version"] for p in tomllib.load(open("uv.lock", "rb"))["package"]}
print(" ".join(f"{n}=={lock[n]}" for n in sys.argv[1:]))' "$@"; }
    download() {
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            --platform manylinux1_x86_64 --platform any "$@" 2>&1 | grep -v 'is ignored' || true
    }
    # shellcheck disable=SC2046,SC2086
    download -d .whl $(pins $CARRY)
    # shellcheck disable=SC2046,SC2086
    download -d .whl/fallback $(pins $FALLBACK)
    n=$(ls .whl/*.whl | wc -l)
    echo "prepared .whl: $n wheels (+ $(ls .whl/fallback | wc -l) fallbacks), $(du -sh .whl | cut -f1)"
    exit 0
fi

OUT=${OUT:-/tmp/device_check_out}
mkdir -p "$OUT"
WORK=${DEVCHK_WORK:-/tmp}  # /tmp/site gets the wheels, /tmp/runs the training runs
SITE=$WORK/site
mkdir -p "$WORK"
BUDGET=${DEVCHK_BUDGET:-420}
PARTS=${DEVCHK_PARTS:-a,b,e,c,d}
DEADLINE=$((SECONDS + BUDGET))
TAG="devchk-$$"
ENVLOG="$OUT/env.log"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1

note() { echo "$*" | tee -a "$SUMMARY"; }

# ---- install the carried wheels beside the image's packages ---------------------------------
{
    echo "== install $(ls .whl/*.whl | wc -l) wheels into $SITE"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
} >"$ENVLOG" 2>&1 || { cat "$ENVLOG"; note "install: FAIL (see env.log)"; exit 1; }
export PYTHONPATH=$SITE PATH=$SITE/bin:$PATH
# Our wheels bring the dist-info (entry points, console scripts); the code that travelled with the
# tree replaces theirs, so a wheel built before the latest edit cannot hide it (rebuild the wheels
# with --prepare when a pyproject.toml changes).
stale=0
for src in packages/*/src cookbooks/*/src; do
    n=$(diff -rq -x __pycache__ "$src" "$SITE" 2>/dev/null | grep -c -e '^Files ' -e "^Only in $src")
    stale=$((stale + n))
    cp -r "$src"/. "$SITE"/
done
note "source overlay: $stale file(s) of the tree differed from the carried wheels"

# Every Requires-Dist of what we installed must be met by /tmp/site or the image; a too-old image
# package is replaced from .whl/fallback. Prints the fallback wheels still needed (--need) or a report.
cat >"$WORK/devchk_deps.py" <<'PY'
import glob, os, sys, zipfile
from email.parser import Parser
from importlib import metadata
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as cn

site = sys.argv[2]
def dist_meta(path):
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return Parser().parsestr(z.read(name).decode())
fallback = {cn(dist_meta(p)["Name"]): p for p in glob.glob(".whl/fallback/*.whl")}
wheels = glob.glob(".whl/*.whl") + [p for n, p in fallback.items()
                                    if glob.glob(os.path.join(site, n.replace("-", "_") + "-*.dist-info"))]
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
need, problems, lines = set(), [], []
for path in sorted(wheels):
    meta = dist_meta(path)
    for text in meta.get_all("Requires-Dist") or []:
        req = Requirement(text)
        if req.marker and "extra" in str(req.marker) or req.marker and not req.marker.evaluate():
            continue
        wanted = [(req.name, req.specifier)]
        for extra in req.extras if version(req.name) else ():  # e.g. httpx[http2] -> h2
            for sub in metadata.requires(req.name) or []:
                sreq = Requirement(sub)
                if sreq.marker and sreq.marker.evaluate({"extra": extra}) and "extra" in str(sreq.marker):
                    wanted.append((sreq.name, sreq.specifier))
        for name, spec in wanted:
            have = version(name)
            ok = have is not None and spec.contains(have, prereleases=True)
            lines.append(f"{meta['Name']:22} needs {name}{spec or ''}: {have or 'MISSING'} {'ok' if ok else 'BAD'}")
            if not ok:
                (need.add(fallback[cn(name)]) if cn(name) in fallback else problems.append(lines[-1]))
if sys.argv[1] == "--need":
    print(" ".join(sorted(need)))
else:
    print("\n".join(sorted(set(lines))))
    print("dependency problems:", len(problems) + len(need))
    print("\n".join(sorted(set(problems)) + [f"unmet even after fallback: {p}" for p in sorted(need)]))
PY
for _ in 1 2 3; do
    need=$(python3 "$WORK/devchk_deps.py" --need "$SITE" 2>>"$ENVLOG") || break
    [ -z "$need" ] && break
    echo "== fallback wheels (image copy too old): $need" >>"$ENVLOG"
    # shellcheck disable=SC2086
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" $need >>"$ENVLOG" 2>&1
done
python3 "$WORK/devchk_deps.py" --report "$SITE" >>"$ENVLOG" 2>&1
grep -E "^dependency problems" "$ENVLOG" | tee -a "$SUMMARY"

# ---- machine, torch, CUDA ------------------------------------------------------------------
nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv -l 1 >"$OUT/gpu_monitor.csv" 2>&1 &
MONITOR=$!
trap 'kill "$MONITOR" 2>/dev/null' EXIT
{
    echo "== nvidia-smi -L"; nvidia-smi -L
    echo "== python"; command -v python3; python3 --version; command -v rllm
    python3 - <<'PY'
from importlib import metadata
import torch
print("torch", torch.__version__, "cuda available", torch.cuda.is_available(), "built for cuda", torch.version.cuda)
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0), "bf16 supported", torch.cuda.is_bf16_supported())
for name in ["transformers", "tokenizers", "peft", "safetensors", "numpy", "aiohttp", "uvloop", "pytest",
             "pytest-asyncio", "pytest-timeout", "typing-extensions", "anyio", "protobuf", "openai", "tinker",
             "msgspec", "pydantic", "rich", "pyyaml", "tensorboard", "matplotlib"]:
    try:
        print(f"  {name} {metadata.version(name)}")
    except metadata.PackageNotFoundError:
        print(f"  {name} MISSING")
PY
    echo "== imports and plugins"
    python3 -c "import rllm.backends.tinker, rllm.cli.main, rllm.gateway.server, rllm_cookbook_say, tinker, openai, zstandard; print('imports ok')"
    echo "cookbooks: $(rllm cookbooks | tr '\n' ' ')  backends: $(rllm backends | tr '\n' ' ')"
} >>"$ENVLOG" 2>&1
sed -n '/^== nvidia-smi/,$p' "$ENVLOG"  # the dependency lines above it stay in env.log
note "cuda: $(python3 -c 'import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NOT AVAILABLE", "| torch", torch.__version__, "| bf16", torch.cuda.is_available() and torch.cuda.is_bf16_supported())' 2>&1 | tail -1)"

# ---- parts ---------------------------------------------------------------------------------
reap() {  # kill what a part left behind (the e2e test starts the CLI in its own session)
    local f pid
    for f in /proc/[0-9]*/environ; do
        pid=${f#/proc/}; pid=${pid%/environ}
        if { tr '\0' '\n' <"$f"; } 2>/dev/null | grep -qx "DEVCHK_TAG=$TAG"; then kill -9 "$pid" 2>/dev/null; fi
    done
}
# part LABEL CAP_S LOG CMD...: runs CMD with min(CAP_S, time left), appends to LOG; sets RC.
part() {
    local label=$1 cap=$2 log=$3; shift 3
    local left=$((DEADLINE - SECONDS - 5)) limit
    limit=$((cap < left ? cap : left))
    if [ "$limit" -lt 20 ]; then note "$label: SKIPPED (budget spent)"; RC=125; return; fi
    echo "== $label (limit ${limit}s): $*" | tee -a "$log"
    local t0=$SECONDS
    timeout -k 10 "$limit" env DEVCHK_TAG="$TAG" "$@" 2>&1 | tee -a "$log"
    RC=${PIPESTATUS[0]}
    reap
    local verdict=PASS
    [ "$RC" -ne 0 ] && verdict="FAIL rc=$RC"
    [ "$RC" -eq 124 ] || [ "$RC" -eq 137 ] && verdict="TIMEOUT after ${limit}s"
    note "$label: $verdict in $((SECONDS - t0))s $(grep -E '(passed|failed|error)' "$log" | tail -1)"
}
want() { [[ ",$PARTS," == *",$1,"* ]]; }
PYTEST=(python3 -m pytest -q --tb=short -p no:cacheprovider)

curve() {  # reward curve of a run directory: every row of metrics.jsonl that trains, plus validation
    python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl") if l.strip()]
train = [r for r in rows if "reward/mean" in r]
print(f"{'step':>5} {'reward':>7} {'val':>6} {'rollout_s':>9} {'train_s':>7}")
for r in rows:
    val = r.get("val/reward/mean")
    if "reward/mean" not in r and val is None:
        continue
    rew = r.get("reward/mean")
    print(f"{r.get('step', 0):>5} {'' if rew is None else f'{rew:7.3f}':>7} "
          f"{'' if val is None else f'{val:6.3f}':>6} {r.get('time/rollout_s', 0):9.2f} {r.get('time/train_s', 0):7.2f}")
if train:
    secs = [r.get("time/rollout_s", 0) + r.get("time/train_s", 0) for r in train]
    warm = secs[1:] or secs
    print(f"steps {len(train)}; reward first {train[0]['reward/mean']:.3f} -> last-10 mean "
          f"{sum(r['reward/mean'] for r in train[-10:]) / len(train[-10:]):.3f}; "
          f"{len(warm) / max(sum(warm), 1e-9):.2f} steps/s after the first step "
          f"({sum(warm) / len(warm):.2f} s/step; {sum(r.get('episodes', 0) for r in train[1:]) / max(sum(warm), 1e-9):.0f} episodes/s)")
PY
}
gpu_peak() {  # peak GPU memory and mean utilisation between two line numbers of gpu_monitor.csv
    sed -n "$1,$2p" "$OUT/gpu_monitor.csv" | awk -F', ' '$2 ~ /MiB/ {m=($2+0>m)?$2+0:m; u+=$3+0; n++}
        END {if (n) printf "GPU memory peak %d MiB, mean utilisation %.0f%% over %d samples\n", m, u/n, n}'
}

# Order: tests first, then the short throughput run, then the main job with whatever time is left.
if want a; then
    part "a tinker backend tests (GPU)" 150 "$OUT/a_tinker.log" "${PYTEST[@]}" packages/rllm-backend-tinker/tests
    if [ "$RC" -ne 0 ]; then  # same tests with CUDA hidden: GPU-only failures vs. image/version failures
        part "a2 tinker backend tests, CUDA hidden (control)" 90 "$OUT/a_tinker.log" \
            env CUDA_VISIBLE_DEVICES= "${PYTEST[@]}" packages/rllm-backend-tinker/tests
    fi
fi
if want b; then
    part "b end-to-end training tests" 200 "$OUT/b_e2e.log" "${PYTEST[@]}" tests/test_train_e2e.py
fi
if want e; then  # issue 5's engine benchmark on 16 cores: (a) per "workers:upstreams" combo, then (b)
    for combo in ${DEVCHK_A_COMBOS:-12:4 11:4 10:5}; do
        part "e engine throughput (a): 1000 concurrent, 50 ms upstream, ${combo%:*} workers, ${combo#*:} upstreams" 60 \
            "$OUT/e_engine.log" python3 benchmarks/engine_throughput.py --skip-b --workers "${combo%:*}" \
            --upstreams "${combo#*:}" --rollouts "${DEVCHK_A_ROLLOUTS:-20000}"
        grep -E '^\(a\)|^    cpu:|^    per rollout:|direct \(no rLLM' "$OUT/e_engine.log" | tail -4 | sed 's/^/  /' | tee -a "$SUMMARY"
    done
    part "e3 engine throughput (b): zero latency, engine+gateway vs direct" 60 "$OUT/e_engine.log" \
        python3 benchmarks/engine_throughput.py --skip-a --overhead-rollouts 4000
    grep -E '^\(b\)' "$OUT/e_engine.log" | tail -1 | sed 's/^/  /' | tee -a "$SUMMARY"
fi
FAST=(val_every=0 ckpt_every=0 tensorboard=false plot=false)
if want d; then
    rm -rf "$WORK/runs/tp"
    from=$(wc -l <"$OUT/gpu_monitor.csv")
    part "d throughput: 20 say steps, no validation/checkpoints" 60 "$OUT/d_throughput.log" \
        rllm train say --overwrite --out "$WORK/runs/tp" total_steps=20 "${FAST[@]}"
    to=$(wc -l <"$OUT/gpu_monitor.csv")
    if [ -s "$WORK/runs/tp/metrics.jsonl" ]; then
        { curve "$WORK/runs/tp" | tail -1; gpu_peak "$from" "$to"; } | tee -a "$OUT/d_throughput.log" | sed 's/^/  /' | tee -a "$SUMMARY"
    fi
fi
if want c; then
    rm -rf "$WORK/runs/say"
    from=$(wc -l <"$OUT/gpu_monitor.csv")
    part "c rllm train say (main job, README defaults)" "${DEVCHK_SAY_S:-150}" "$OUT/c_train_say.log" \
        rllm train say --overwrite --out "$WORK/runs/say"
    to=$(wc -l <"$OUT/gpu_monitor.csv")
    if [ -s "$WORK/runs/say/metrics.jsonl" ]; then
        { echo "== reward curve"; curve "$WORK/runs/say"; } 2>&1 | tee -a "$OUT/c_train_say.log" | tail -1 | sed 's/^/  /' | tee -a "$SUMMARY"
        gpu_peak "$from" "$to" | tee -a "$OUT/c_train_say.log" | sed 's/^/  /' | tee -a "$SUMMARY"
        rllm view "$WORK/runs/say" >>"$OUT/c_train_say.log" 2>&1
        cp "$WORK/runs/say/reward.png" "$OUT/" 2>/dev/null
    fi
fi
if want d && [ $((DEADLINE - SECONDS)) -gt 60 ]; then  # the same 20 steps on the 16 CPU cores, for the ratio
    rm -rf "$WORK/runs/tp-cpu"
    part "d2 throughput on CPU (CUDA hidden)" 50 "$OUT/d_throughput.log" \
        env CUDA_VISIBLE_DEVICES= rllm train say --overwrite --out "$WORK/runs/tp-cpu" total_steps=20 "${FAST[@]}"
    if [ -s "$WORK/runs/tp-cpu/metrics.jsonl" ]; then
        curve "$WORK/runs/tp-cpu" | tail -1 | tee -a "$OUT/d_throughput.log" | sed 's/^/  /' | tee -a "$SUMMARY"
    fi
fi
note "total ${SECONDS}s"
echo "== summary"; cat "$SUMMARY"
