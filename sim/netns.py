"""A WAN link made of Linux network namespaces, without Docker: a veth pair between the
root namespace (the edge) and a namespace of its own (the cloud), each direction shaped by
`tc` tbf on its egress. Kernels without netem cannot delay packets in `tc`, so the
propagation delay is added by the asyncio proxy's Delay stage in the root namespace (the
proxy then shapes nothing, only delays and counts). Needs root and `ip`/`tc` (iproute2).

An outage here is a real one: `link_down` sets the edge's veth down, so the kernel's TCP
retransmits, backs off and resumes on `link_up` (the asyncio proxy only models that).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass


def available() -> str | None:
    """None if namespaces can be used here, else why not."""
    if os.geteuid() != 0:
        return "needs root"
    if not (shutil.which("ip") and shutil.which("tc")):
        return "needs iproute2 (ip, tc)"
    probe = "acespec-probe"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode:
        return f"cannot create a network namespace: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def burst(bps: float) -> int:
    """Token-bucket depth in bytes: ~10 ms of the rate, at least one MTU-sized packet."""
    return max(1600, int(bps / 8 / 100))


def _run(*argv: str) -> None:
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")


@dataclass
class NetnsLink:
    """Root namespace <-> `name`, tbf at `up_bps` edge->cloud and `down_bps` back. The cloud
    side's address is `cloud_ip`; run processes there with `argv_in_ns`."""

    up_bps: float
    down_bps: float
    name: str = "acespec-wan"
    edge_ip: str = "10.77.0.1"
    cloud_ip: str = "10.77.0.2"

    @property
    def veths(self) -> tuple[str, str]:
        tag = self.name[-6:]
        return f"ae-{tag}", f"ac-{tag}"

    def up(self) -> NetnsLink:
        edge, cloud = self.veths
        self.down()  # a leftover from a killed run
        _run("ip", "netns", "add", self.name)
        _run("ip", "link", "add", edge, "type", "veth", "peer", "name", cloud)
        _run("ip", "link", "set", cloud, "netns", self.name)
        _run("ip", "addr", "add", f"{self.edge_ip}/30", "dev", edge)
        _run("ip", "link", "set", edge, "up")
        ns = ("ip", "netns", "exec", self.name)
        _run(*ns, "ip", "addr", "add", f"{self.cloud_ip}/30", "dev", cloud)
        _run(*ns, "ip", "link", "set", cloud, "up")
        _run(*ns, "ip", "link", "set", "lo", "up")
        for dev, prefix, bps in ((edge, (), self.up_bps), (cloud, ns, self.down_bps)):
            _run(*prefix, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate",
                 f"{int(bps)}bit", "burst", str(burst(bps)), "latency", "2s")
        return self

    def link_down(self) -> None:
        """Set the edge's veth down: no packet crosses either way, connections stay open."""
        _run("ip", "link", "set", self.veths[0], "down")

    def link_up(self) -> None:
        """Set the edge's veth up again (its address and route come back with it)."""
        _run("ip", "link", "set", self.veths[0], "up")

    @contextlib.contextmanager
    def outage(self, seconds: float = 0.0) -> Iterator[None]:
        """The link is down inside the block, and for at least `seconds` (blocking)."""
        t0 = time.monotonic()
        self.link_down()
        try:
            yield
        finally:
            time.sleep(max(0.0, seconds - (time.monotonic() - t0)))
            self.link_up()

    def argv_in_ns(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *argv]

    def down(self) -> None:
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)
        subprocess.run(["ip", "link", "del", self.veths[0]], capture_output=True)

    def __enter__(self) -> NetnsLink:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()
