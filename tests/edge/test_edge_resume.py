"""Resumable sessions and the `acespec edge generate` command, against verifier processes.

The resume test kills the verifier process (SIGKILL) mid-generation and starts another on
the same port; the edge reconnects and re-opens with its committed tokens. The final text
must equal an uninterrupted run with the same seed (greedy and sampled)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys

import pytest

from conftest import free_port

torch = pytest.importorskip("torch")
pytest.importorskip("llama_cpp")

from acespec.edge.client import channel  # noqa: E402
from acespec.edge.drafting.llama import LlamaDrafter, LlamaDrafterConfig  # noqa: E402
from acespec.edge.session import EdgeEngine, EngineConfig  # noqa: E402
from acespec.shared.config import SamplingParams  # noqa: E402
from acespec.shared.served import ServeParams  # noqa: E402
from acespec.shared.tokenizer import Tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def hf_pair(tiny_pair, tiny_hf_dir):
    tok_dir, _, ggufs = tiny_pair
    return tiny_hf_dir, Tokenizer.load(tok_dir), ggufs



def start_verifier(model_dir, port: int, step_ms: str = "15") -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "acespec", "cloud", "serve", "--model",
                             str(model_dir), "--host", "127.0.0.1", "--port", str(port),
                             "--emulate-step-ms", step_ms],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    assert re.search(r"listening on", line), line
    return proc


@pytest.mark.parametrize("mode,temperature,coupled", [
    ("pipeline", 0.0, False), ("pipeline", 1.0, False), ("sd", 1.0, False), ("ar", 1.0, False),
    ("acespec", 0.0, False), ("acespec", 1.0, True)])  # acespec: decided by the verifier
@pytest.mark.slow
def test_verifier_killed_mid_generation(hf_pair, mode, temperature, coupled):
    model_dir, tok, ggufs = hf_pair
    port = free_port()
    addr = f"127.0.0.1:{port}"
    serve = ServeParams(SamplingParams(temperature=temperature, top_k=40, coupled=coupled),
                        send_mass=0.5)
    cfg = EngineConfig(mode=mode, depth=3, window=6, max_tokens=40, serve=serve, seed=5,
                       backoff_s=0.2, max_reconnects=10)
    drafter = LlamaDrafter(ggufs["q8_0"], LlamaDrafterConfig(n_ctx=512, n_seq_max=1))
    prompt = tok.encode("def handler(event):\n")
    procs = [start_verifier(model_dir, port)]

    async def go():
        engine = EdgeEngine(lambda: channel(addr), tok.vocab_hash(), drafter)
        killed = asyncio.Event()

        def on_tokens(ids, stats):
            if stats.tokens >= 12 and not killed.is_set():
                killed.set()
                procs[0].kill()  # the verifier dies mid-generation
                procs[0].wait()
                procs.append(subprocess.Popen(["true"]))  # placeholder, replaced below

        task = asyncio.create_task(engine.generate(prompt, cfg, on_tokens))
        await killed.wait()
        procs[-1] = await asyncio.to_thread(start_verifier, model_dir, port)
        interrupted, stats = await task
        clean, _ = await engine.generate(prompt, cfg)
        return interrupted, clean, stats

    try:
        interrupted, clean, stats = asyncio.run(asyncio.wait_for(go(), 180))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert stats.reconnects >= 1
    assert len(interrupted) == 40 and interrupted == clean


@pytest.mark.slow
def test_cli_edge_generate(hf_pair):
    model_dir, tok, ggufs = hf_pair
    port = free_port()
    proc = start_verifier(model_dir, port, "0")
    try:
        base = [sys.executable, "-m", "acespec", "edge", "generate", "import os\n",
                "--cloud", f"127.0.0.1:{port}", "--drafter", str(ggufs["q8_0"])]
        outs = {}
        for mode in ("ar", "sd", "pipeline"):
            r = subprocess.run(base + ["--mode", mode, "--max-tokens", "16", "--json"],
                               capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stderr
            outs[mode] = json.loads(r.stdout)
        assert len({tuple(o["token_ids"]) for o in outs.values()}) == 1  # greedy: same text
        for key in ("tokens_per_s", "mean_acceptance_length", "passes", "wire_bytes_up",
                    "wire_bytes_down", "rounds"):
            assert key in outs["pipeline"]["stats"], key
        text = subprocess.run(base + ["--max-tokens", "8"], capture_output=True, text=True,
                              timeout=120)
        assert text.returncode == 0 and "mean acceptance length" in text.stderr
        from acespec.edge.text import TextCodec

        first8 = TextCodec.from_tokenizer(model_dir).decode(outs["ar"]["token_ids"][:8])
        assert text.stdout == first8 + "\n"  # the streamed text is the greedy text
    finally:
        proc.kill()
    closed = subprocess.run(base + ["--max-tokens", "4"], capture_output=True, text=True,
                            timeout=120)
    assert closed.returncode == 3 and "cannot reach the verifier" in closed.stderr
    assert "Traceback" not in closed.stderr
