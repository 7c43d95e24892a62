"""Load and wire-cost measurement of a verifier on loopback.

Each session decodes greedily through the tree protocol: every round it extends `depth`
nodes (the target's predicted next token, then filler drafts) and commits the first, so
its committed text must equal cloud-only greedy `Generate` — that is the correctness check.
Traffic goes through a byte-counting TCP proxy, so wire bytes include HTTP/2 and gRPC
framing. Reports nodes/s, per-round latency p50/p99, bytes per scored node, peak RSS.
"""

from __future__ import annotations

import asyncio
import resource
import time
from dataclasses import dataclass

import numpy as np

from acespec.cloud.serving.server import ServerConfig, create_server, load_engine
from acespec.cloud.verify.batcher import StepEmulation
from acespec.edge.client import CloudSession, channel, generate
from acespec.models import DEMO_TARGET
from acespec.shared.config import SamplingParams
from acespec.shared.served import ServeParams
from acespec.shared.tokenizer import Tokenizer
from acespec.sim.proxy import CountingProxy


@dataclass
class LoadResult:
    sessions: int
    rounds: int
    depth: int
    mode: str
    nodes_scored: int
    seconds: float
    latency_p50_ms: float
    latency_p99_ms: float
    wire_bytes_up: int
    wire_bytes_down: int
    correct_sessions: int
    peak_rss_mb: float

    @property
    def nodes_per_s(self) -> float:
        return self.nodes_scored / self.seconds

    def row(self) -> dict:
        n = max(1, self.nodes_scored)
        return {"mode": self.mode, "sessions": self.sessions, "depth": self.depth,
                "nodes_scored": self.nodes_scored, "nodes_per_s": round(self.nodes_per_s, 1),
                "round_p50_ms": round(self.latency_p50_ms, 2),
                "round_p99_ms": round(self.latency_p99_ms, 2),
                "wire_up_bytes_per_node": round(self.wire_bytes_up / n, 2),
                "wire_down_bytes_per_node": round(self.wire_bytes_down / n, 2),
                "correct": f"{self.correct_sessions}/{self.sessions}" if self.mode == "greedy" else "n/a",
                "peak_rss_mb": round(self.peak_rss_mb, 1)}


async def _session(addr, prompt, params, seed, vh, rounds, depth, filler, lat):
    async with channel(addr) as ch:
        s = CloudSession(ch)
        last = await s.open(prompt, params, seed, vh)
        out = []
        for _ in range(rounds):
            nxt = last.greedy_token if params.sampling.greedy else int(last.ids[np.argmax(last.units)])
            t0 = time.perf_counter()
            first = s.next_id  # the chain hangs under the last committed node, not the fillers
            await s.extend([nxt] + [filler] * (depth - 1),
                           [last.node_id] + [first + i for i in range(depth - 1)])
            scores = await s.recv()
            lat.append(time.perf_counter() - t0)
            await s.commit(first)
            out.append(nxt)
            last = scores[0]
        await s.close()
        return out


async def run_load(addr: str, prompts: list[list[int]], vh: str, sessions: int, rounds: int,
                   depth: int, params: ServeParams, filler: int = 5) -> LoadResult:
    """Run `sessions` concurrent sessions through a counting proxy in front of `addr`."""
    host, port = addr.rsplit(":", 1)
    proxy = CountingProxy(host, int(port))
    via = f"127.0.0.1:{await proxy.start()}"
    lat: list[float] = []
    t0 = time.perf_counter()
    outs = await asyncio.gather(*(
        _session(via, prompts[i % len(prompts)], params, i, vh, rounds, depth, filler, lat)
        for i in range(sessions)))
    seconds = time.perf_counter() - t0
    counts = proxy.counts
    await proxy.stop()
    correct = 0
    if params.sampling.greedy:
        async with channel(addr) as ch:
            refs = {}
            for i in range(min(sessions, len(prompts))):
                refs[i] = [t async for t in generate(ch, prompts[i], params, 0, rounds, vh)]
        correct = sum(outs[i] == refs[i % len(prompts)] for i in range(sessions))
    lat_ms = np.array(lat) * 1000
    return LoadResult(sessions, rounds, depth, "greedy" if params.sampling.greedy else "sampled",
                      sessions * rounds * depth, seconds, float(np.percentile(lat_ms, 50)),
                      float(np.percentile(lat_ms, 99)), counts.up, counts.down, correct,
                      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


SCENARIOS = [("greedy", 1), ("greedy", 8), ("greedy", 64), ("sampled", 1), ("sampled", 8)]
SAMPLED = ServeParams(sampling=SamplingParams(temperature=0.8, top_k=20))
PROMPTS = ["import os\nimport sys\n", "def main(argv):\n", "class Config:\n    def __init__(self",
           "    for key, value in", "# Copyright", "if __name__ == '__main__':\n"]


async def run_scenarios(model_dir: str, rounds: int, depth: int, scenarios=SCENARIOS,
                        emulate: str | None = None) -> list[dict]:
    """Start a verifier on loopback and run each (mode, sessions) scenario against it."""
    cfg = ServerConfig(model=model_dir, host="127.0.0.1", port=0,
                       emulation=StepEmulation.parse(emulate))
    engine = load_engine(cfg)
    server, port = await create_server(engine, cfg)
    tok = Tokenizer.load(model_dir or DEMO_TARGET)
    prompts = [tok.encode(p) for p in PROMPTS]
    rows = []
    try:
        for mode, sessions in scenarios:
            params = ServeParams() if mode == "greedy" else SAMPLED
            res = await run_load(f"127.0.0.1:{port}", prompts, engine.vocab_hash, sessions,
                                 rounds, depth, params)
            rows.append(res.row())
    finally:
        await server.stop(0)
        await engine.close_all()
    return rows


def measure(model_dir: str, rounds: int, depth: int, scenarios=SCENARIOS,
            emulate: str | None = None) -> list[dict]:
    """run_scenarios in a loop of its own: one row a scenario."""
    return asyncio.run(run_scenarios(model_dir, rounds, depth, scenarios, emulate))


def markdown(rows: list[dict]) -> str:
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)
