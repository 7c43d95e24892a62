"""The edge's gRPC channel connects at the first try over a long-RTT link (3G, satellite):
gRPC's connect timeout is its "min reconnect backoff", which must not be the 100 ms of the
edge's first retry (the HTTP/2 handshake alone takes an RTT)."""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from acespec.edge.client import channel
from acespec.sim.proxy import LinkProxy
from acespec.sim.stages import LinkSpec


async def _check_through(rtt_s: float) -> None:
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    proxy = LinkProxy("127.0.0.1", port, spec=LinkSpec(1e6, 1e6, rtt_s))
    ch = channel(f"127.0.0.1:{await proxy.start()}")
    try:  # no wait_for_ready: the first connection attempt must succeed
        await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=20)
    finally:
        await ch.close()
        await proxy.stop()
        await server.stop(0)


def test_the_first_connection_succeeds_over_a_400_ms_rtt_link():
    asyncio.run(_check_through(0.4))
