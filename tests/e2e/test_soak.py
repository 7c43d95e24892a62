"""Soak: `acespec cloud serve` and `acespec edge serve` as processes under mixed load for a
bounded time — short and long prompts, concurrent requests (streaming and not), clients that
disconnect mid-stream, `edge generate` processes killed mid-run, and one verifier restart.

Asserted: no INTERNAL error and no HTTP 500 anywhere; every completed greedy text equals
cloud-only decoding (`edge generate --mode ar`) of the same prompt; the verifier holds no
session afterwards; RSS of both servers ends within the stated tolerance of its warm value.
The figures are printed (run with -s to see them)."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import time

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("llama_cpp")
httpx = pytest.importorskip("httpx")

from cli_harness import ACESPEC, Proc, acespec, wait_http  # noqa: E402
from conftest import free_port  # noqa: E402

SOAK_S = 60.0  # load phase; the verifier restarts a third of the way in
WORKERS = 6
MAX_TOKENS = 40
# RSS may grow by allocator fragmentation, not by what sessions hold: end <= warm * 1.25 + 40 MB,
# besides (for the edge) what llama.cpp reserves at start for the drafter's KV cache and compute
# buffers: their pages become resident as the KV in use first reaches them (a high-water mark
# bounded by that size, not a leak).
RSS_FACTOR, RSS_SLACK_MB = 1.25, 40.0
RESERVED = re.compile(r"drafter reserves ([\d.]+) MiB")  # in edge serve's listening line


def _prompts() -> list[str]:
    short = ["import os\n", "def add(a, b):\n", "class Stack:\n", "for i in range(10):\n"]
    body = "".join(f"def f{i}(x):\n    return x * {i} + {i * i}\n\n" for i in range(40))
    return short + [body + "def main():\n", body[: len(body) // 2] + "class Config:\n"]


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kb / 1024


def _metric(text: str, name: str, label: str = "") -> float:
    pat = re.escape(name) + (r"\{[^}]*" + re.escape(label) + r"[^}]*\}" if label else "")
    vals = [float(m.group(1)) for m in re.finditer(rf"^{pat} ([\d.e+-]+)$", text, re.M)]
    return sum(vals)


class Stack:
    """The verifier (restartable on its port) and the edge server, as processes."""

    def __init__(self, hf_dir, gguf):
        self.hf_dir, self.gguf = hf_dir, gguf
        self.port, self.mport, self.http = free_port(), free_port(), free_port()
        self.cloud = self._start_cloud()
        self.edge = Proc("edge", "serve", "--cloud", f"127.0.0.1:{self.port}", "--port",
                         str(self.http), "--drafter", str(gguf), "--mode", "acespec")
        self.edge_banner = self.edge.wait_for(r"acespec edge listening.*").group(0)
        self.url = f"http://127.0.0.1:{self.http}"
        wait_http(f"{self.url}/health")
        self.old_clouds: list[Proc] = []

    def _start_cloud(self) -> Proc:
        proc = Proc("cloud", "serve", "--model", str(self.hf_dir), "--host", "127.0.0.1",
                    "--port", str(self.port), "--metrics-port", str(self.mport), "--grace", "1",
                    "--emulate-step-ms", "3,0.1")
        proc.wait_for(r"listening on")
        return proc

    def restart_cloud(self) -> None:
        code, _ = self.cloud.stop(signal.SIGTERM, timeout=20)
        assert code == 0, self.cloud.stderr[-2000:]
        self.old_clouds.append(self.cloud)
        self.cloud = self._start_cloud()

    def cloud_metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.mport}/metrics", timeout=5).text

    def close(self) -> list[str]:
        """Stop everything; returns each process's stderr."""
        logs = []
        for p in (self.edge, self.cloud, *self.old_clouds):
            if p.p.poll() is None:
                p.stop(timeout=20)
            logs.append(p.stderr)
            p.__exit__()
        return logs


async def _request(http, url: str, prompt: str, stream: bool, drop_after: int | None):
    """One completion: ('done', text) | ('dropped', None) | ('unavailable', None)."""
    body = {"model": "acespec", "prompt": prompt, "max_tokens": MAX_TOKENS, "stream": stream,
            "temperature": 0}
    if not stream:
        r = await http.post(f"{url}/v1/completions", json=body)
        if r.status_code == 503:
            return "unavailable", None
        assert r.status_code == 200, (r.status_code, r.text)
        return "done", r.json()["choices"][0]["text"]
    text, chunks = "", 0
    async with http.stream("POST", f"{url}/v1/completions", json=body) as r:
        assert r.status_code in (200, 503), r.status_code
        if r.status_code == 503:
            return "unavailable", None
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            ev = json.loads(line[6:])
            if "error" in ev:  # the verifier went away mid-stream: the one allowed error
                assert ev["error"]["code"] in (503, "service_unavailable") or \
                    ev["error"].get("type") == "service_unavailable", ev
                return "unavailable", None
            text += ev["choices"][0]["text"]
            chunks += 1
            if drop_after is not None and chunks >= drop_after:
                return "dropped", None  # leaving the block closes the connection
    return "done", text


async def _worker(i: int, stack: Stack, prompts, until: float, log: list) -> None:
    rng = np.random.default_rng([7, i])
    async with httpx.AsyncClient(timeout=120) as http:
        while time.monotonic() < until:
            k = int(rng.integers(len(prompts)))
            stream = bool(rng.random() < 0.5)
            drop = 3 if stream and rng.random() < 0.25 else None
            outcome, text = await _request(http, stack.url, prompts[k], stream, drop)
            log.append((k, outcome, text))


async def _killed_clients(stack: Stack, until: float, log: list) -> None:
    """`edge generate` processes killed (SIGKILL) a moment into their generation."""
    while time.monotonic() < until:
        p = subprocess.Popen([ACESPEC, "edge", "generate", "def kill_me():\n", "--cloud",
                              f"127.0.0.1:{stack.port}", "--drafter", str(stack.gguf),
                              "--max-tokens", "4000"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        await asyncio.sleep(2.5)
        p.kill()
        p.wait()
        log.append("killed")
        await asyncio.sleep(2.0)


async def _soak(stack: Stack, prompts) -> dict:
    log: list = []
    kills: list = []
    t0 = time.monotonic()
    until = t0 + SOAK_S
    tasks = [asyncio.create_task(_worker(i, stack, prompts, until, log)) for i in range(WORKERS)]
    tasks.append(asyncio.create_task(_killed_clients(stack, until, kills)))
    await asyncio.sleep(SOAK_S / 3)
    await asyncio.to_thread(stack.restart_cloud)
    await asyncio.gather(*tasks)
    return {"log": log, "kills": len(kills), "seconds": time.monotonic() - t0}


@pytest.mark.slow
def test_soak(tiny_pair, tiny_hf_dir):
    gguf = tiny_pair[2]["q8_0"]
    prompts = _prompts()
    stack = Stack(tiny_hf_dir, gguf)
    errors: list[str] = []
    try:
        ref = {}
        for k, prompt in enumerate(prompts):  # cloud-only decoding, as a user gets it
            p = acespec("edge", "generate", prompt, "--cloud", f"127.0.0.1:{stack.port}",
                        "--mode", "ar", "--max-tokens", str(MAX_TOKENS), "--json",
                        "--drafter", str(gguf))
            assert p.returncode == 0, p.stderr[-2000:]
            ref[k] = json.loads(p.stdout)["text"]
        warm = asyncio.run(_soak_warmup(stack, prompts))
        rss0 = {"edge": _rss_mb(stack.edge.p.pid)}
        res = asyncio.run(_soak(stack, prompts))
        rss0["cloud"] = _rss_mb(stack.cloud.p.pid)  # the restarted verifier, warm
        # A second, shorter round on the restarted verifier, then both must settle.
        res2 = asyncio.run(_soak_round(stack, prompts, 20.0))
        deadline = time.monotonic() + 30
        while _metric(stack.cloud_metrics(), "acespec_sessions_active") > 0:
            assert time.monotonic() < deadline, "verifier still holds sessions"
            time.sleep(0.2)
        rss1 = {"edge": _rss_mb(stack.edge.p.pid), "cloud": _rss_mb(stack.cloud.p.pid)}
        metrics = stack.cloud_metrics()
        edge_metrics = httpx.get(f"{stack.url}/metrics", timeout=5).text
    finally:
        errors = stack.close()
    log = warm + res["log"] + res2
    outcomes = {o: sum(1 for _, x, _ in log if x == o) for o in ("done", "dropped",
                                                                 "unavailable")}
    wrong = [(k, t) for k, o, t in log if o == "done" and t != ref[k]]
    print(f"\nsoak: {len(log)} requests in {res['seconds'] + 20:.0f} s + warm-up: {outcomes}, "
          f"{res['kills']} killed edge processes, 1 verifier restart; RSS MB warm -> end: "
          f"{ {k: (round(rss0[k]), round(rss1[k])) for k in rss1} }")
    assert not wrong, f"{len(wrong)} completed texts differ from cloud-only decoding: {wrong[:2]}"
    assert outcomes["done"] >= 20 and res["kills"] >= 3
    assert not any("Traceback" in e for e in errors), [e[-3000:] for e in errors if "Traceback" in e]
    assert _metric(metrics, "acespec_errors_total", 'code="INTERNAL"') == 0
    assert _metric(edge_metrics, "acespec_edge_requests_total", 'status="500"') == 0
    kv = {"edge": float(RESERVED.search(stack.edge_banner).group(1)), "cloud": 0.0}
    for side in ("edge", "cloud"):
        bound = rss0[side] * RSS_FACTOR + RSS_SLACK_MB + kv[side]
        assert rss1[side] <= bound, (side, rss0, rss1, kv)


async def _soak_warmup(stack: Stack, prompts) -> list:
    log: list = []
    async with httpx.AsyncClient(timeout=120) as http:
        for k, prompt in enumerate(prompts):
            outcome, text = await _request(http, stack.url, prompt, bool(k % 2), None)
            log.append((k, outcome, text))
    return log


async def _soak_round(stack: Stack, prompts, seconds: float) -> list:
    log: list = []
    until = time.monotonic() + seconds
    await asyncio.gather(*(_worker(100 + i, stack, prompts, until, log) for i in range(WORKERS)))
    return log
