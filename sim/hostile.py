"""What other clients cost an honest one: `acespec bench hostile`.

One verifier (started here with a big model's step profile, or --cloud), an honest `edge
generate` run on the same prompts in every scenario, and beside it, in processes of their
own (their loops must not slow the honest client's):

- `peer`: another honest client, generating greedily in a loop: what sharing costs;
- `wasteN`: N clients that extend `WASTE_NODES` random nodes in an edge-decided session, commit
  one, and repeat: speculation that is never taken (docs/design.md §3 bounds its share);
- `longN`: N clients that open decided sessions on `LONG_PROMPT`-token repetitive prompts,
  decide a few tokens, and open again: prefill after prefill (chunked, docs/design.md §3);
- `schemaN`: N clients that open decided sessions constrained by a JSON schema of
  `SCHEMA_PROPS` optional string properties, decide `SCHEMA_DECIDE` tokens, and open again:
  grammar builds and masks (off the loop and the passes, charged to the share);
- `echoN`: N clients that score `ECHO_PROMPT`-token prompts for their logprobs (20
  alternatives, nothing generated) in a loop: echo with logprobs (a chunked prefill);
- `streamsN`: one client (one edge id) with N sessions decoding at once, opening again as
  each ends: share bought with sessions (a share per client, docs/design.md §3).

Each scenario's honest tokens/s is reported beside the alone figure of the same run, with
the verifier's resident memory after it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import grpc

from acespec.edge.client import CloudSession, channel, prompt_logprobs
from acespec.procs import python_module
from acespec.proto import CLIENT_KEY, PROTOCOL_VERSION
from acespec.proto import acespec_pb2 as pb
from acespec.proto.codec import encode_serve_params
from acespec.shared.config import SamplingParams
from acespec.shared.grammar import json_grammar
from acespec.shared.served import ServeParams

WASTE_NODES = 256
LONG_PROMPT = 4000
LONG_DECIDE = 16
SCHEMA_PROPS = 3000
SCHEMA_DECIDE = 16
ECHO_PROMPT = 2000
ECHO_TOP = 20
STREAM_DECIDE = 64
KINDS = ("peer", "waste", "long", "schema", "echo", "streams")
SCENARIOS = ("alone", "peer", "waste1", "waste4", "long2")
HONEST_PROMPTS = ("def fibonacci(n):\n", "import os\nimport sys\n\n\ndef main(",
                  "class Config:\n    def __init__(self", "for i in range(10):\n",
                  "# Read a CSV file and print the sum of each column\n")


@dataclass(frozen=True)
class Scenario:
    name: str
    kind: str  # "" (alone) | one of KINDS
    clients: int  # of `streams`: the one client's sessions

    @property
    def processes(self) -> int:
        """Attacker processes: one per client (`streams`: one client, many sessions)."""
        return 1 if self.kind == "streams" else self.clients

    @classmethod
    def parse(cls, name: str) -> Scenario:
        for kind in KINDS:
            if name.startswith(kind):
                count = name[len(kind):] or "1"
                if not count.isdigit() or int(count) < 1:
                    break
                return cls(name, kind, int(count))
        if name == "alone":
            return cls(name, "", 0)
        raise ValueError(f"unknown scenario {name!r}: alone, peerN, wasteN, longN, schemaN, "
                         "echoN (N clients, default 1) or streamsN (one client, N sessions)")


# -- the attackers (each in its own process: `python -m acespec.sim.hostile KIND ...`) ------

async def waste(addr: str, vh: str, seconds: float, nodes: int = WASTE_NODES,
                seed: int = 0) -> int:
    """An edge-decided session extending `nodes` random nodes, committing the first, until `seconds`
    pass. Returns the nodes it had scored."""
    rng, sent = random.Random(seed), 0
    async with channel(addr) as ch:
        s = CloudSession(ch)
        root = await s.open([1, 2, 3, 4], ServeParams(), seed, vh)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            first = s.next_id
            # the first under the root, the rest in a random tree beside it (so committing
            # the first frees them all)
            parents = [root.node_id] + [root.node_id if i == 1 or rng.random() < 0.25
                                        else first + rng.randrange(1, i)
                                        for i in range(1, nodes)]
            await s.extend([rng.randrange(4096) for _ in range(nodes)], parents)
            root = (await s.recv())[0]
            await s.commit(first)
            sent += nodes
        await s.close()
    return sent


async def _decided(ch: grpc.aio.Channel, vh: str, prompt: list[int], max_tokens: int,
                   params: ServeParams | None = None, client: str = "") -> None:
    """One decided session, from its Open until the verifier is done deciding."""
    call = ch.stream_stream("/acespec.v1.Verifier/Session",
                            request_serializer=pb.Uplink.SerializeToString,
                            response_deserializer=pb.Downlink.FromString)(
        metadata=((CLIENT_KEY, client),) if client else None)
    opened = pb.Open(protocol_version=PROTOCOL_VERSION, vocab_hash=vh, prompt_tokens=prompt,
                     decide=pb.Decide(max_tokens=max_tokens))
    if params is not None:
        opened.sampling.CopyFrom(encode_serve_params(params))
    await call.write(pb.Uplink(open=opened))
    async for msg in call:
        if msg.HasField("decided") and msg.decided.done:
            break
    await call.done_writing()
    call.cancel()


async def long_prompts(addr: str, vh: str, seconds: float, length: int = LONG_PROMPT,
                       seed: int = 0) -> int:
    """Decided sessions on a repetitive prompt of `length` tokens, LONG_DECIDE tokens each,
    one after another until `seconds` pass. Returns the sessions opened."""
    rng, opened = random.Random(seed), 0
    unit = [rng.randrange(4096) for _ in range(50)]
    async with grpc.aio.insecure_channel(addr) as ch:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            prompt = [rng.randrange(4096)] + (unit * (length // len(unit) + 1))[:length - 1]
            await _decided(ch, vh, prompt, LONG_DECIDE)
            opened += 1
    return opened


def big_schema(props: int = SCHEMA_PROPS) -> dict:
    """A JSON schema of `props` optional string properties (a large grammar to build)."""
    return {"type": "object", "properties": {f"field_{i}": {"type": "string"}
                                             for i in range(props)}}


async def schemas(addr: str, vh: str, seconds: float, props: int = SCHEMA_PROPS,
                  seed: int = 0) -> int:
    """Decided sessions constrained by big_schema(props), SCHEMA_DECIDE tokens each, one
    after another until `seconds` pass. Returns the sessions opened."""
    rng, opened = random.Random(seed), 0
    grammar = json_grammar(big_schema(props), check=False)
    async with grpc.aio.insecure_channel(addr) as ch:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            prompt = [rng.randrange(4096) for _ in range(16)]
            params = ServeParams(SamplingParams(grammar=grammar, output_from=len(prompt)))
            await _decided(ch, vh, prompt, SCHEMA_DECIDE, params)
            opened += 1
    return opened


async def echoes(addr: str, vh: str, seconds: float, length: int = ECHO_PROMPT,
                 seed: int = 0) -> int:
    """Prompts of `length` tokens scored for their logprobs (ECHO_TOP alternatives each,
    nothing generated), one after another until `seconds` pass. Returns the prompts."""
    rng, scored = random.Random(seed), 0
    async with grpc.aio.insecure_channel(addr) as ch:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            await prompt_logprobs(ch, [rng.randrange(4096) for _ in range(length)], ECHO_TOP, vh)
            scored += 1
    return scored


async def streams(addr: str, vh: str, seconds: float, count: int, seed: int = 0) -> int:
    """One client (one edge id) keeping `count` decided sessions of STREAM_DECIDE tokens
    decoding at once, each opening again as it ends, until `seconds` pass. Returns the
    sessions opened."""
    rng, opened = random.Random(seed), 0
    client = f"streams-{seed}"
    async with grpc.aio.insecure_channel(addr) as ch:
        end = time.monotonic() + seconds

        async def one() -> None:
            nonlocal opened
            while time.monotonic() < end:
                await _decided(ch, vh, [rng.randrange(4096) for _ in range(16)],
                               STREAM_DECIDE, client=client)
                opened += 1

        await asyncio.gather(*(one() for _ in range(count)))
    return opened


def peer(addr: str, seconds: float, max_tokens: int, pair_args: list[str]) -> int:
    """Honest `edge generate` runs, one after another, until `seconds` pass."""
    runs, end, i = 0, time.monotonic() + seconds, 0
    while time.monotonic() < end:
        honest(addr, HONEST_PROMPTS[i % len(HONEST_PROMPTS)], max_tokens, pair_args,
               timeout=max(5.0, end - time.monotonic() + 30))
        runs, i = runs + 1, i + 1
    return runs


def honest(addr: str, prompt: str, max_tokens: int, pair_args: list[str],
           timeout: float = 300) -> dict:
    """One `acespec edge generate --json` run from the command line: its stats."""
    out = subprocess.run(python_module("acespec") + [
        "edge", "generate", "--cloud", addr, "--max-tokens", str(max_tokens), "--json",
        *pair_args, prompt], capture_output=True, text=True, timeout=timeout, check=False)
    if out.returncode:
        raise RuntimeError(f"edge generate failed ({out.returncode}): {out.stderr[-2000:]}")
    return json.loads(out.stdout)["stats"]


# -- the runner --------------------------------------------------------------------------

def attackers(scenario: Scenario, addr: str, vh: str, seconds: float, max_tokens: int,
              pair_args: list[str]) -> list[subprocess.Popen]:
    return [subprocess.Popen(python_module("acespec.sim.hostile") + [
        "--count", str(scenario.clients),  # (before the positionals: pair_args ends the line)
        scenario.kind, addr, vh, str(seconds), str(i), str(max_tokens), *pair_args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(scenario.processes)]


def run_scenario(scenario: Scenario, addr: str, vh: str, prompts: list[str],
                 max_tokens: int, pair_args: list[str], warmup_s: float = 2.0,
                 rss=None) -> dict:
    """The honest client's tokens/s on every prompt, beside the scenario's attackers; rss():
    the verifier's resident bytes, read once they are stopped."""
    procs = attackers(scenario, addr, vh, 3600, max_tokens, pair_args)
    try:
        if procs:
            time.sleep(warmup_s)  # the attackers are connected and busy
            for p in procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{scenario.name} attacker exited early: "
                                       f"{p.stderr.read()[-2000:]}")
        runs = [honest(addr, p, max_tokens, pair_args) for p in prompts]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    row = {"scenario": scenario.name,
           "honest_tok_s": round(statistics.fmean(r["tokens_per_s"] for r in runs), 2),
           "ttft_s_max": round(max(r.get("ttft_s") or 0.0 for r in runs), 3),
           "longest_gap_s": round(max(r.get("longest_gap_s", 0.0) for r in runs), 3),
           "runs": len(runs)}
    if rss is not None:
        time.sleep(1.0)  # the attackers' sessions are closed and their memory freed
        row["verifier_rss_mb"] = round(rss() / 2**20)
    return row


def run(scenarios: list[Scenario], addr: str, vh: str, prompts: list[str], max_tokens: int,
        pair_args: list[str], progress=print, rss=None) -> list[dict]:
    """Every scenario in turn on one verifier; ratios against this run's `alone`."""
    rows = []
    for sc in scenarios:
        progress(f"scenario {sc.name}: {len(prompts)} honest runs ...")
        rows.append(run_scenario(sc, addr, vh, prompts, max_tokens, pair_args, rss=rss))
        progress(f"  {rows[-1]['honest_tok_s']} tok/s")
    alone = next((r["honest_tok_s"] for r in rows if r["scenario"] == "alone"), None)
    for r in rows:
        r["vs_alone"] = round(r["honest_tok_s"] / alone, 2) if alone else None
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| scenario | honest tok/s | vs alone | honest TTFT max s | honest longest gap s | "
             "verifier RSS MB after |", "|---|---|---|---|---|---|"]
    for r in rows:
        ratio = "" if r["vs_alone"] is None else f"{r['vs_alone']:.2f}x"
        lines.append(f"| {r['scenario']} | {r['honest_tok_s']} | {ratio} | "
                     f"{r['ttft_s_max']} | {r['longest_gap_s']} | "
                     f"{r.get('verifier_rss_mb', '')} |")
    return "\n".join(lines)


def _attack_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m acespec.sim.hostile",
                                description="one attacker of `acespec bench hostile`")
    p.add_argument("kind", choices=KINDS)
    p.add_argument("cloud")
    p.add_argument("vocab_hash")
    p.add_argument("seconds", type=float)
    p.add_argument("seed", type=int)
    p.add_argument("max_tokens", type=int)
    p.add_argument("--count", type=int, default=1, help="streams: the client's sessions")
    p.add_argument("pair_args", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    if a.kind == "waste":
        n = asyncio.run(waste(a.cloud, a.vocab_hash, a.seconds, seed=a.seed))
    elif a.kind == "long":
        n = asyncio.run(long_prompts(a.cloud, a.vocab_hash, a.seconds, seed=a.seed))
    elif a.kind == "schema":
        n = asyncio.run(schemas(a.cloud, a.vocab_hash, a.seconds, seed=a.seed))
    elif a.kind == "echo":
        n = asyncio.run(echoes(a.cloud, a.vocab_hash, a.seconds, seed=a.seed))
    elif a.kind == "streams":
        n = asyncio.run(streams(a.cloud, a.vocab_hash, a.seconds, a.count, seed=a.seed))
    else:
        n = peer(a.cloud, a.seconds, a.max_tokens, a.pair_args)
    print(n, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_attack_main(sys.argv[1:]))
