"""WAN emulation without Docker: a veth into a network namespace shaped by tc tbf. Runs
where namespaces can be made (root, iproute2); elsewhere these tests skip and say why (the
asyncio proxy tests cover the same link model everywhere)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from acespec.sim.netns import NetnsLink, available

WHY = available()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"network namespaces: {WHY}")

SINK = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5001)); s.listen(1); c, _ = s.accept()
mode, n = sys.argv[2], int(sys.argv[3])
if mode == "recv":
    got = 0
    while got < n:
        got += len(c.recv(65536))
    c.sendall(b"k")
else:
    c.sendall(b"x" * n)
c.close()
"""


def _transfer(ns: NetnsLink, mode: str, n: int) -> float:
    """Seconds to move n bytes edge->cloud ('recv' in the namespace) or cloud->edge."""
    proc = subprocess.Popen(ns.argv_in_ns([sys.executable, "-c", SINK, ns.cloud_ip, mode, str(n)]))
    try:
        for _ in range(100):
            try:
                c = socket.create_connection((ns.cloud_ip, 5001), 1)
                c.settimeout(30)
                break
            except OSError:
                time.sleep(0.05)
        t0 = time.perf_counter()
        if mode == "recv":
            c.sendall(b"x" * n)
            c.recv(1)
        else:
            got = 0
            while got < n:
                got += len(c.recv(65536))
        dt = time.perf_counter() - t0
        c.close()
        return dt
    finally:
        proc.wait(10)


@pytest.mark.slow
def test_tbf_rates_each_way():
    """200 kbit/s up and 400 kbit/s down: 40 KB each way take n*8/rate within 25 %
    (TCP slow start and the tbf burst make the short transfer a little faster or slower)."""
    with NetnsLink(200e3, 400e3) as ns:
        up = _transfer(ns, "recv", 40_000)
        down = _transfer(ns, "send", 40_000)
    print(f"40 KB up {up:.2f} s (ideal 1.60), down {down:.2f} s (ideal 0.80)")
    assert abs(up / (40_000 * 8 / 200e3) - 1) < 0.25, up
    assert abs(down / (40_000 * 8 / 400e3) - 1) < 0.25, down


@pytest.mark.slow
def test_bench_through_a_namespace(tiny_hf_dir, tiny_pair):
    """The real benchmark with --netns: verifier inside the namespace, tbf shaping, the
    proxy adding the delay and counting bytes."""
    pytest.importorskip("torch")
    pytest.importorskip("llama_cpp")
    import asyncio

    from acespec.sim.bench import BenchConfig, load_prompts, parse_links, run_bench

    cfg = BenchConfig(links=parse_links("100kbit:20ms"), modes=("ar", "sd"), max_tokens=16,
                      emulate="0", netns=True)
    recs = asyncio.run(run_bench(cfg, str(tiny_hf_dir), str(tiny_pair[2]["q8_0"]),
                                 load_prompts(None, 1)[:2]))
    assert len(recs) == 4
    assert all(r["tokens"] == 16 and r["wire_bytes_up"] > 0 and r["wire_bytes_down"] > 0
               for r in recs)
    assert subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.find(
        "acespec-wan") < 0  # torn down


ECHO = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5002)); s.listen(1); c, _ = s.accept()
while data := c.recv(65536):
    c.sendall(data)
"""


def test_interface_down_stops_the_bytes_and_the_same_connection_resumes():
    """A TCP echo in the namespace, a client in the root one. The edge's veth goes down for
    2 s: nothing comes back meanwhile, though the client keeps sending; once it is up, the
    same connection delivers everything sent, in order (the kernel retransmits, after its
    backoff: allow 10 s)."""
    import threading

    with NetnsLink(10e6, 10e6, name="acespec-cut") as ns:
        proc = subprocess.Popen(ns.argv_in_ns([sys.executable, "-c", ECHO, ns.cloud_ip]))
        try:
            for _ in range(100):
                try:
                    c = socket.create_connection((ns.cloud_ip, 5002), 1)
                    break
                except OSError:
                    time.sleep(0.05)
            c.settimeout(20)
            arrivals: list[tuple[float, bytes]] = []  # (monotonic s, bytes)
            sent = [f"{i:05d};".encode() * 20 for i in range(40)]  # 120 bytes each
            total = sum(map(len, sent))

            def read_all():
                got = 0
                while got < total and (data := c.recv(65536)):
                    arrivals.append((time.monotonic(), data))
                    got += len(data)

            reader = threading.Thread(target=read_all, daemon=True)
            reader.start()
            for msg in sent[:10]:  # bytes flow
                c.sendall(msg)
                time.sleep(0.01)
            deadline = time.monotonic() + 5
            while sum(len(d) for _, d in arrivals) < 10 * 120 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert sum(len(d) for _, d in arrivals) == 10 * 120, "no echo before the outage"
            with ns.outage(2.0):
                down_at = time.monotonic()
                for msg in sent[10:30]:  # sent into a link that is down
                    c.sendall(msg)
                    time.sleep(0.05)
            up_at = time.monotonic()
            for msg in sent[30:]:
                c.sendall(msg)
            reader.join(20)
            c.close()
        finally:
            proc.kill()
            proc.wait(10)
    assert b"".join(d for _, d in arrivals) == b"".join(sent)  # same connection, in order
    assert not [t for t, _ in arrivals if down_at + 0.05 < t < up_at - 0.05]
    assert up_at - down_at >= 1.9  # down_at is taken just after the interface went down
    resumed = min(t for t, _ in arrivals if t > down_at + 0.05) - up_at
    print(f"outage {up_at - down_at:.2f} s; first echo {resumed:.2f} s after the link came up")
    assert max(t for t, _ in arrivals) - up_at < 10.0
