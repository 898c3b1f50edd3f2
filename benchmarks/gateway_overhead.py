"""Gateway overhead: direct vs rllm-gateway vs LiteLLM proxy vs FastAPI + httpx, in one run.

One mock upstream (rllm.testing.MockUpstream: vLLM-style token ids and logprobs) in its
own process. Each contender runs in its own process in front of it; this process is the load
generator (aiohttp on uvloop). For 1, 64 and 256 concurrent clients it measures latency p50/p99
and requests/s, then prints the ratios the issue sets as targets. Finally it drives 1,000
concurrent sessions x 5 turns through rllm-gateway and counts lost or misattributed traces
against the gateway's store.

How to run (2 cores are enough; close other CPU-heavy work for stable figures):

    # peers, in a throwaway venv (they are not rLLM dependencies)
    uv venv /tmp/benchenv -p 3.11
    VIRTUAL_ENV=/tmp/benchenv uv pip install 'litellm[proxy]' fastapi uvicorn httpx uvloop httptools
    cd /work/main && uv run --no-sync python benchmarks/gateway_overhead.py --peer-python /tmp/benchenv/bin/python

Options: --duration S (per level, default 3), --levels 1,64,256, --skip-peers, --store sqlite:/tmp/b.db.
Without --peer-python (or if the peers are not installed) the peer rows are skipped and said so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HOST = "127.0.0.1"
AUTH: dict[str, dict[str, str]] = {}  # extra headers per target URL
BODY = {"model": "mock-model", "messages": [{"role": "user", "content": "What is 2 + 2? Answer briefly."}]}


# --------------------------------------------------------------------------- server roles
def _run_mock() -> None:
    import uvloop

    from rllm.testing import MockUpstream

    async def main() -> None:
        mock = await MockUpstream().start()
        print(f"READY {mock.url}", flush=True)
        await asyncio.Event().wait()

    uvloop.run(main())


def _run_gateway(upstream: str, store: str, fast_http: bool = True) -> None:
    import uvloop

    from rllm.gateway import GatewayConfig, GatewayServer
    from rllm.gateway.command import prepare_process

    config = GatewayConfig(upstreams=[upstream], store=store, health_interval_s=0, fast_http=fast_http)
    prepare_process(config)  # as `rllm-gateway serve` does: GC threshold (and uvloop)

    async def main() -> None:
        gw = await GatewayServer(config).start()
        print(f"READY {gw.url}", flush=True)
        await asyncio.Event().wait()

    uvloop.run(main())


# Runs under the peer venv's python: no rllm imports here.
_FASTAPI_APP = """
import sys, time, uvicorn, httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
upstream, port = sys.argv[1], int(sys.argv[2])
app = FastAPI()
client = httpx.AsyncClient(base_url=upstream, timeout=60,
                           limits=httpx.Limits(max_connections=1024, max_keepalive_connections=1024))
traces = {}

@app.post("/v1/chat/completions")
async def chat(request: Request):
    body = await request.json()
    sid = request.headers.get("x-rllm-session", "default")
    body["logprobs"] = True
    body["return_token_ids"] = True
    t0 = time.perf_counter()
    r = await client.post("/chat/completions", json=body)
    data = r.json()
    choice = data["choices"][0]
    traces.setdefault(sid, []).append({"messages": body["messages"], "prompt_ids": data.get("prompt_token_ids"),
        "completion_ids": choice.get("token_ids"),
        "logprobs": [e["logprob"] for e in (choice.get("logprobs") or {}).get("content", [])],
        "latency_s": time.perf_counter() - t0})
    data.pop("prompt_token_ids", None); choice.pop("token_ids", None); choice["logprobs"] = None
    return JSONResponse(data)

print(f"READY http://127.0.0.1:{port}/v1", flush=True)
uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", log_level="warning", access_log=False)
"""


def _run_bare(upstream: str) -> None:
    """Floor reference: a bare aiohttp pass-through that captures into a list (no sessions, no checks)."""
    import aiohttp
    import msgspec
    import uvloop
    from aiohttp import web

    dec, enc = msgspec.json.Decoder().decode, msgspec.json.Encoder().encode
    captured: list = []

    async def main() -> None:
        http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

        async def chat(request: web.Request) -> web.Response:
            body = dec(await request.read())
            body["logprobs"] = True
            body["return_token_ids"] = True
            async with http.post(
                f"{upstream}/chat/completions", data=enc(body), headers={"Content-Type": "application/json"}
            ) as r:
                data = dec(await r.read())
            choice = data["choices"][0]
            captured.append(
                (data.pop("prompt_token_ids", None), choice.pop("token_ids", None), choice["logprobs"])
            )
            choice["logprobs"] = None
            return web.Response(body=enc(data), content_type="application/json")

        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        port = _free_port()
        await web.TCPSite(runner, HOST, port).start()
        print(f"READY http://{HOST}:{port}/v1", flush=True)
        await asyncio.Event().wait()

    uvloop.run(main())


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process (Linux), to report CPU per request independent of contention."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _spawn(
    cmd: list[str], env: dict | None = None, ready_timeout: float = 120.0
) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    deadline = time.time() + ready_timeout
    lines = []
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("READY "):
            return proc, line.split()[1]
    proc.kill()
    raise RuntimeError(f"{cmd[:3]} did not start:\n{''.join(lines[-20:])}")


async def _wait_http(url: str, timeout: float = 180.0) -> None:
    import aiohttp

    deadline = time.time() + timeout
    last = ""
    async with aiohttp.ClientSession() as s:
        while time.time() < deadline:
            try:
                async with s.post(f"{url}/chat/completions", json=BODY, headers=AUTH.get(url, {})) as r:
                    if r.status == 200:
                        return
                    last = f"{r.status}: {(await r.text())[:300]}"
            except aiohttp.ClientError as exc:
                last = repr(exc)
            await asyncio.sleep(0.5)
    raise RuntimeError(f"{url} never answered 200; last: {last}")


# --------------------------------------------------------------------------- load generator
async def _level(url: str, clients: int, duration: float, max_wait: float = 120.0) -> dict:
    """``clients`` closed-loop clients; measure completions in a window that opens once every
    client has finished about one request (steady state, even for slow peers) and lasts ``duration``."""
    import aiohttp

    data = json.dumps(BODY).encode()
    headers = {"Content-Type": "application/json", **AUTH.get(url, {})}
    lat: list[float] = []
    errors = 0
    done = 0
    window: list[float] = []  # [start, end] once open
    opened = asyncio.Event()
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    give_up = time.perf_counter() + max_wait
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=max_wait)) as s:

        async def worker() -> None:
            nonlocal errors, done
            target = f"{url}/chat/completions"
            while True:
                t0 = time.perf_counter()
                if (window and t0 >= window[1]) or t0 >= give_up:
                    return
                try:
                    async with s.post(target, data=data, headers=headers) as r:
                        await r.read()
                        ok = r.status == 200
                except (TimeoutError, aiohttp.ClientError):
                    ok = False
                t1 = time.perf_counter()
                done += 1
                if not window and done >= max(clients, 20):
                    window.extend((t1, t1 + duration))
                    opened.set()
                    continue
                if window and window[0] <= t1 <= window[1]:
                    if ok:
                        lat.append(t1 - t0)
                    else:
                        errors += 1

        await asyncio.gather(*(worker() for _ in range(clients)))
    lat.sort()
    n = len(lat)
    return {
        "clients": clients,
        "total": done,
        "requests": n,
        "errors": errors,
        "rps": n / duration,
        "p50_ms": lat[n // 2] * 1e3 if n else float("nan"),
        "p99_ms": lat[min(n - 1, int(n * 0.99))] * 1e3 if n else float("nan"),
        "mean_ms": statistics.fmean(lat) * 1e3 if n else float("nan"),
    }


async def _trace_integrity(gw_url: str, sessions: int = 1000, turns: int = 5, concurrency: int = 256) -> dict:
    """Drive sessions x turns of multi-turn chat, then check every trace against the store."""
    import aiohttp

    from rllm.gateway import GatewayClient

    sem = asyncio.Semaphore(concurrency)
    failures = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:

        async def session(k: int) -> None:
            nonlocal failures
            sid = f"bench-{k}"
            msgs: list[dict] = []
            for t in range(turns):
                msgs.append({"role": "user", "content": f"{sid} turn {t}"})
                async with (
                    sem,
                    s.post(
                        f"{gw_url}/sessions/{sid}/v1/chat/completions", json={"model": "m", "messages": msgs}
                    ) as r,
                ):
                    if r.status != 200:
                        failures += 1
                        return
                    reply = (await r.json())["choices"][0]["message"]["content"]
                msgs.append({"role": "assistant", "content": reply})

        await asyncio.gather(*(session(k) for k in range(sessions)))
    lost = misattributed = 0
    async with GatewayClient(gw_url) as c:
        await c.flush()
        for k in range(sessions):
            sid = f"bench-{k}"
            traces = await c.get_traces(sid)
            lost += max(0, turns - len(traces))
            for t in traces:
                expect = f"{sid} turn {t.seq}"
                if (
                    t.session_id != sid
                    or t.messages[-1].content != expect
                    or t.response.content != f"echo: {expect}"
                    or not t.completion_ids
                    or len(t.completion_logprobs) != len(t.completion_ids)
                ):
                    misattributed += 1
    return {
        "sessions": sessions,
        "turns": turns,
        "request_failures": failures,
        "lost": lost,
        "misattributed": misattributed,
    }


def _fmt(row: dict) -> str:
    return (
        f"{row['clients']:>4} clients  {row['rps']:>9.0f} req/s  p50 {row['p50_ms']:7.3f} ms  "
        f"p99 {row['p99_ms']:7.3f} ms  ({row['requests']} ok, {row['errors']} errors)"
    )


async def _bench(args: argparse.Namespace) -> None:
    me = str(Path(__file__).resolve())
    procs: list[subprocess.Popen] = []
    try:
        mock, mock_url = _spawn([sys.executable, me, "--role", "mock"])
        procs.append(mock)
        gw, gw_url = _spawn(
            [sys.executable, me, "--role", "gateway", "--upstream", mock_url, "--store", args.store]
        )
        procs.append(gw)
        bare, bare_url = _spawn([sys.executable, me, "--role", "bare", "--upstream", mock_url])
        procs.append(bare)
        targets = {
            "direct": mock_url,
            "rllm-gateway": f"{gw_url}/sessions/bench/v1",
            "bare-aiohttp": bare_url,
        }
        pids = {"direct": None, "rllm-gateway": gw.pid, "bare-aiohttp": bare.pid}

        peer = args.peer_python
        if not args.skip_peers and peer and Path(peer).exists():
            tmp = Path(tempfile.mkdtemp(prefix="gwbench-"))
            (tmp / "fastapi_app.py").write_text(_FASTAPI_APP)
            fa, fa_url = _spawn([peer, str(tmp / "fastapi_app.py"), mock_url, str(_free_port())])
            procs.append(fa)
            targets["fastapi+httpx"] = fa_url
            pids["fastapi+httpx"] = fa.pid
            litellm_bin = Path(peer).parent / "litellm"
            if litellm_bin.exists():
                cfg = tmp / "litellm.yaml"
                cfg.write_text(
                    "model_list:\n  - model_name: mock-model\n    litellm_params:\n"
                    f"      model: openai/mock-model\n      api_base: {mock_url}\n      api_key: sk-none\n"
                    "litellm_settings:\n  drop_params: true\n  set_verbose: false\n"
                )
                port = _free_port()
                LOG = open(tmp.parent / "gwbench-litellm.log", "w")  # noqa: SIM115 - lives as long as the proxy
                master = "sk-" + secrets.token_hex(32)  # the proxy refuses to start without one
                env = {
                    **os.environ,
                    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                    "LITELLM_LOG": "ERROR",
                    "LITELLM_MASTER_KEY": master,
                }
                AUTH[f"http://{HOST}:{port}/v1"] = {"Authorization": f"Bearer {master}"}
                lp = subprocess.Popen(
                    [str(litellm_bin), "--config", str(cfg), "--port", str(port), "--host", HOST],
                    stdout=LOG,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
                procs.append(lp)
                targets["litellm-proxy"] = f"http://{HOST}:{port}/v1"
                pids["litellm-proxy"] = lp.pid
        elif not args.skip_peers:
            print("peers skipped: pass --peer-python /tmp/benchenv/bin/python (see the docstring)")

        for url in targets.values():
            await _wait_http(url)
        levels = [int(x) for x in args.levels.split(",")]
        results: dict[str, dict[int, dict]] = {name: {} for name in targets}
        for level in levels:
            for name, url in targets.items():
                # LiteLLM completes a few requests per second at high concurrency: a longer window.
                dur = max(args.duration, 10.0) if name == "litellm-proxy" else args.duration
                pid = pids.get(name)
                cpu0, mock0, me0 = (
                    (_cpu_seconds(pid) if pid else 0.0),
                    _cpu_seconds(mock.pid),
                    time.process_time(),
                )
                row = await _level(url, level, dur)
                n = max(1, row["total"])  # CPU is summed over warm-up too
                row["proxy_cpu_us"] = ((_cpu_seconds(pid) - cpu0) / n * 1e6) if pid else 0.0
                row["mock_cpu_us"] = (_cpu_seconds(mock.pid) - mock0) / n * 1e6
                row["loadgen_cpu_us"] = (time.process_time() - me0) / n * 1e6
                results[name][level] = row
                print(
                    f"{name:>14}: {_fmt(row)}  cpu/req: proxy {row['proxy_cpu_us']:.0f} us, "
                    f"upstream {row['mock_cpu_us']:.0f} us, load generator {row['loadgen_cpu_us']:.0f} us",
                    flush=True,
                )

        print("\n== ratios (rllm-gateway with trace capture on) ==")
        if 1 in levels:
            d, g = results["direct"][1], results["rllm-gateway"][1]
            print(
                f"added latency at 1 client: p50 {g['p50_ms'] - d['p50_ms']:.3f} ms (target <= 0.75), "
                f"p99 {g['p99_ms'] - d['p99_ms']:.3f} ms (target <= 2)"
            )
            for peer_name in ("litellm-proxy", "fastapi+httpx"):
                if peer_name in results:
                    p = results[peer_name][1]
                    print(
                        f"  {peer_name} added at 1 client: p50 {p['p50_ms'] - d['p50_ms']:.3f} ms, "
                        f"p99 {p['p99_ms'] - d['p99_ms']:.3f} ms"
                    )
        for level in levels:
            if level == 1:
                continue
            g = results["rllm-gateway"][level]["rps"]
            line = (
                f"{level} clients: gateway/direct {g / results['direct'][level]['rps']:.2f} (target >= 0.35)"
            )
            line += f", gateway/bare-aiohttp {g / results['bare-aiohttp'][level]['rps']:.2f}"
            if "litellm-proxy" in results and results["litellm-proxy"][level]["rps"]:
                line += f", gateway/litellm {g / results['litellm-proxy'][level]['rps']:.1f}x (target >= 25)"
            if "fastapi+httpx" in results and results["fastapi+httpx"][level]["rps"]:
                line += (
                    f", gateway/fastapi+httpx {g / results['fastapi+httpx'][level]['rps']:.1f}x (target >= 5)"
                )
            print(line)

        integrity = await _trace_integrity(gw_url, sessions=args.sessions, turns=5)
        print(f"\ntrace integrity: {integrity} (target: 0 lost, 0 misattributed)")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", choices=["bench", "mock", "gateway", "bare"], default="bench")
    ap.add_argument("--upstream")
    ap.add_argument("--store", default="memory")
    ap.add_argument("--peer-python", default="/tmp/benchenv/bin/python")
    ap.add_argument("--skip-peers", action="store_true")
    ap.add_argument(
        "--aiohttp-client", action="store_true", help="gateway uses aiohttp's client (fast_http off)"
    )
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--levels", default="1,64,256")
    ap.add_argument("--sessions", type=int, default=1000)
    args = ap.parse_args()
    if args.role == "mock":
        _run_mock()
    elif args.role == "gateway":
        _run_gateway(args.upstream, args.store, fast_http=not args.aiohttp_client)
    elif args.role == "bare":
        _run_bare(args.upstream)
    else:
        import uvloop

        uvloop.run(_bench(args))


if __name__ == "__main__":
    main()
