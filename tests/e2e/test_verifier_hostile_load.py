"""`cloud serve` from the command line under a hostile client: two sessions churn Grow (one
in chains, one in fans of siblings), twice for 12 s, every node dead on arrival, while a
third decodes. The verifier's memory stays bounded (peak RSS <= 1.5 x idle + 200 MB; a
second flood leaves it no bigger than the first did). The honest session's latency is
printed beside its idle figure; the assert on it is loose (5x: the hostile client may share
the verifier's cores, and wall-clock ratios belong in benchmarks), but it catches the stall
this guards against: a verifier that kept dead nodes would answer the honest session orders
of magnitude slower."""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time

import grpc
import pytest

pytest.importorskip("torch")

from acespec.models import DEMO_TARGET  # noqa: E402
from acespec.proto import PROTOCOL_VERSION  # noqa: E402
from acespec.proto import acespec_pb2 as pb  # noqa: E402
from acespec.shared.tokenizer import Tokenizer  # noqa: E402

from cli_harness import verifier  # noqa: E402

pytestmark = pytest.mark.slow
FLOOD_S = 12.0  # each of two floods


def _rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _call(ch):
    return ch.stream_stream("/acespec.v1.Verifier/Session",
                            request_serializer=pb.Uplink.SerializeToString,
                            response_deserializer=pb.Downlink.FromString)()


def _open(vh: str, prompt: list[int], max_tokens: int) -> pb.Uplink:
    return pb.Uplink(open=pb.Open(protocol_version=PROTOCOL_VERSION, vocab_hash=vh,
                                  prompt_tokens=prompt, decide=pb.Decide(max_tokens=max_tokens)))


async def _honest(ch, vh: str, prompt: list[int]) -> float:
    """Seconds for a 16-token decided session (no drafts: the verifier decodes)."""
    t0 = time.perf_counter()
    call = _call(ch)
    await call.write(_open(vh, prompt, 16))
    async for msg in call:
        if msg.HasField("decided") and msg.decided.done:
            break
    await call.done_writing()
    return time.perf_counter() - t0


# The hostile client, in its own process (its loop must not slow the honest client's): two
# sessions send 500-node Grow messages at a decided position (dead at once) as fast as the
# verifier takes them, one a chain, the other 499 siblings under its first node; prints how
# many nodes it sent.
FLOOD = """
import asyncio, sys, time
import grpc
from acespec.proto import PROTOCOL_VERSION
from acespec.proto import acespec_pb2 as pb
addr, vh, secs = sys.argv[1], sys.argv[2], float(sys.argv[3])
prompt = [int(x) for x in sys.argv[4].split(",")]

async def flood(ch, fan):
    call = ch.stream_stream("/acespec.v1.Verifier/Session",
                            request_serializer=pb.Uplink.SerializeToString,
                            response_deserializer=pb.Downlink.FromString)()
    await call.write(pb.Uplink(open=pb.Open(protocol_version=PROTOCOL_VERSION, vocab_hash=vh,
        prompt_tokens=prompt, decide=pb.Decide(max_tokens=3000))))
    async def drain():
        async for _ in call:
            pass
    reader = asyncio.ensure_future(drain())
    n, wrong, sent, end = len(prompt), (prompt[-1] + 7) % 4096, 0, time.monotonic() + secs
    while time.monotonic() < end:
        fans = list(range(1, 500)) if fan else []
        msg = pb.Uplink(grow=pb.Grow(anchor=n, tokens=[wrong] * 500, branch_index=fans,
                                     branch_parent=fans))
        try:
            await call.write(msg)
        except grpc.aio.AioRpcError:
            break
        sent += 500
    reader.cancel()
    call.cancel()
    return sent

async def main():
    async with grpc.aio.insecure_channel(addr) as ch:
        print(sum(await asyncio.gather(flood(ch, False), flood(ch, True))), flush=True)

asyncio.run(main())
"""


async def _flood(ch, proc, addr: str, vh: str, prompt: list[int]) -> tuple[list, float, float, int]:
    """One hostile flood of FLOOD_S seconds while the honest client decodes: (its session
    times, the verifier's peak RSS, its RSS 3 s after, nodes the flood sent)."""
    hostile = subprocess.Popen([sys.executable, "-c", FLOOD, addr, vh, str(FLOOD_S),
                                ",".join(map(str, prompt))], stdout=subprocess.PIPE, text=True)
    await asyncio.sleep(1.0)  # the flood is under way
    busy, peak, t_end = [], 0.0, time.monotonic() + FLOOD_S - 2
    while time.monotonic() < t_end:
        busy.append(await _honest(ch, vh, prompt))
        peak = max(peak, _rss_mb(proc.p.pid))
    out, _ = await asyncio.to_thread(hostile.communicate, timeout=60)
    await asyncio.sleep(3)
    return busy, peak, _rss_mb(proc.p.pid), int(out.strip())


@pytest.mark.slow
def test_a_hostile_client_costs_others_little(tmp_path):
    """Two floods back to back. What the first leaves in the verifier's RSS is the allocator's
    (freed memory it keeps for reuse); a verifier that kept dead nodes would grow again by
    the second flood's millions of nodes, one that frees them stays where the first left it."""
    tok = Tokenizer.load(DEMO_TARGET)
    vh, prompt = tok.vocab_hash(), tok.encode("def main():\n")
    proc, addr = verifier("--emulate-step-ms", "5")
    with proc:
        async def go():
            async with grpc.aio.insecure_channel(addr) as ch:
                for _ in range(3):
                    await _honest(ch, vh, prompt)  # warm up
                idle_rss = _rss_mb(proc.p.pid)
                idle = [await _honest(ch, vh, prompt) for _ in range(8)]
                first = await _flood(ch, proc, addr, vh, prompt)
                second = await _flood(ch, proc, addr, vh, prompt)
                return idle_rss, idle, first, second

        idle_rss, idle, (busy, peak1, after1, sent1), (busy2, peak2, after2, sent2) = \
            asyncio.run(go())
        proc.stop()
    report = (f"idle RSS {idle_rss:.0f} MB; flood 1: peak {peak1:.0f} MB, after {after1:.0f} MB, "
              f"{sent1:,} dead nodes; flood 2: peak {peak2:.0f} MB, after {after2:.0f} MB, "
              f"{sent2:,} dead nodes; honest 16-token session median "
              f"{statistics.median(idle) * 1000:.0f} ms idle, "
              f"{statistics.median(busy + busy2) * 1000:.0f} ms under flood "
              f"({len(busy) + len(busy2)} sessions)")
    print(report)
    (tmp_path / "report.txt").write_text(report)
    assert min(sent1, sent2) > 1_000_000, report  # the floods really ran
    assert max(peak1, peak2) <= 1.5 * idle_rss + 200, report
    assert after1 <= 1.25 * idle_rss, report  # what the allocator keeps is bounded
    assert after2 <= after1 + 0.05 * idle_rss, report  # and the second flood adds nothing
    assert statistics.median(busy + busy2) <= 5 * statistics.median(idle), report
