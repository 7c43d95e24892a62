"""`acespec cloud serve`: load the target, start the gRPC verifier (with health, auth, TLS,
metrics) and shut down gracefully on SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from acespec.cloud.errors import Unavailable
from acespec.cloud.serving.metrics import Metrics
from acespec.cloud.serving.servicer import VerifierServicer
from acespec.cloud.target.attention import select_kernels
from acespec.cloud.target.loader import load_model, set_threads
from acespec.cloud.target.packed import select_linear
from acespec.cloud.target.tp_launch import check_kernels, start_leader, topology
from acespec.cloud.verify.batcher import StepEmulation
from acespec.cloud.verify.engine import Engine, Limits
from acespec.cloud.verify.gap import DraftEmulation, GapDrafter
from acespec.models import DEMO_TARGET
from acespec.proto import acespec_pb2_grpc as pb_grpc
from acespec.shared.served import ServeParams
from acespec.shared.tokenizer import Tokenizer

log = logging.getLogger(__name__)

DRAIN_FRACTION = 0.8  # of the grace period: then what is still open ends with UNAVAILABLE
LOST_LINGER_S = 1.0  # after a lost rank, calls get UNAVAILABLE naming it this long, then exit
LOST_EXIT_S = 15.0  # ... and the process leaves by then even if a pass is stuck in a collective


@dataclass(frozen=True)
class ServerConfig:
    model: str = ""  # HF checkpoint folder ('' = the demo target)
    host: str = "0.0.0.0"
    port: int = 50051
    dtype: str = "float32"
    device: str = "cpu"
    threads: int = 0  # torch CPU threads; 0 = auto (1 for models under 50M parameters)
    limits: Limits = field(default_factory=Limits)
    idle_timeout_s: float = 300.0
    write_timeout_s: float = 30.0  # longest a session may wait for its client to read
    auth_tokens: frozenset[str] = frozenset()
    tls_cert: str | None = None
    tls_key: str | None = None
    metrics_port: int | None = None
    emulation: StepEmulation = field(default_factory=StepEmulation)
    grace_s: float = 10.0
    default_params: ServeParams = field(default_factory=ServeParams)
    kernels: str = "auto"  # verifier kernels: auto (Triton on CUDA), triton, torch
    linear: str = "auto"  # linear layers: auto (oneDNN prepacked on the CPU), onednn, torch
    tp: int | None = None  # tensor-parallel ranks; None: 1, or torchrun's WORLD_SIZE
    tp_heartbeat_s: float = 5.0  # a tensor-parallel rank silent this long is lost
    gap_drafter: str = ""  # a small drafter (.gguf or HF folder) for lone passes; '' = none
    cloud_draft: DraftEmulation = field(default_factory=DraftEmulation)  # its step (TESTBED)


class ServeFailed(RuntimeError):
    """The verifier stopped because it could not go on (a tensor-parallel rank was lost)."""


def load_engine(cfg: ServerConfig, metrics=None, on_failure=None) -> Engine:
    """The target loaded (on this process's tensor-parallel rank 0 with its group started,
    under --tp/torchrun) and wrapped in an Engine. on_failure(reason): a rank was lost."""
    path = Path(cfg.model or DEMO_TARGET)
    topo = topology(cfg.tp)
    if topo is None:
        model = load_model(path, dtype=cfg.dtype, device=cfg.device)
        set_threads(model, cfg.threads)
        log.info("linear layers: %s", select_linear(cfg.linear, model))
        model.kernels = select_kernels(cfg.kernels, model.device)
    else:
        model = _load_sharded(cfg, path, topo, metrics, on_failure)
    tokenizer = Tokenizer.load(path)
    vocab_hash = tokenizer.vocab_hash()
    model_id = f"{path.resolve().name}:{model.args.arch}"
    if cfg.emulation.base_ms or cfg.emulation.per_node_ms:
        log.warning("TESTBED: every forward pass is padded by %.1f ms + %.2f ms/node%s "
                    "(--emulate-step-ms) to emulate a big target model",
                    cfg.emulation.base_ms, cfg.emulation.per_node_ms,
                    f" beyond {cfg.emulation.knee}" if cfg.emulation.knee else "")
    if cfg.emulation.dilate != 1:
        log.warning("TESTBED: the scheduler's wall-clock windows are x%g (--emulate-dilate): "
                    "a time-dilated run", cfg.emulation.dilate)
    gap = None
    if cfg.gap_drafter:
        gap = GapDrafter.load(cfg.gap_drafter, vocab_hash, model.args.vocab_size,
                              dtype=cfg.dtype, device=str(model.device), linear=cfg.linear,
                              emulation=cfg.cloud_draft)
        if cfg.cloud_draft.base_ms or cfg.cloud_draft.per_seq_ms:
            log.warning("TESTBED: every batched gap-drafter step is padded to %.1f ms + "
                        "%.2f ms/session (--emulate-cloud-draft-ms)",
                        cfg.cloud_draft.base_ms, cfg.cloud_draft.per_seq_ms)
    return Engine(model, vocab_hash, model_id, cfg.limits, cfg.emulation, metrics, gap,
                  (str(tokenizer.path), tokenizer.eos_id))


def _load_sharded(cfg: ServerConfig, path: Path, topo, metrics, on_failure):
    """Rank 0 of a group (its ranks spawned here unless torchrun started them)."""
    check_kernels(cfg.kernels, topo.world)
    model = start_leader(path, topo, cfg.dtype, cfg.device, cfg.threads, on_failure,
                         cfg.linear, cfg.tp_heartbeat_s)
    log.warning("tensor parallelism: %d ranks (%s), torch attention path; rank 0 serves",
                topo.world, "gloo" if model.device.type == "cpu" else "nccl")
    if metrics:
        metrics.allreduce_bytes.set_function(lambda: model.tp.reduce.bytes)
        metrics.tp_ranks.set(topo.world)
    return model


async def create_server(engine: Engine, cfg: ServerConfig) -> tuple[grpc.aio.Server, int]:
    """A started server bound to cfg.host:cfg.port (0 = any free port); returns (server, port)."""
    creds = _tls_credentials(cfg)
    server = grpc.aio.server(options=[
        ("grpc.max_receive_message_length", 16 << 20),
        ("grpc.http2.bdp_probe", 0),  # see edge CHANNEL_OPTIONS
        # Edges ping every 20 s (keepalive) through sessions that may be quiet for longer on
        # the uplink; by default the server counts those as abuse and ends the connection
        # after two (GOAWAY too_many_pings: every session on it fails with INTERNAL).
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 10000),
        ("grpc.http2.max_ping_strikes", 0),
        # gRPC sets SO_REUSEPORT by default: a second verifier on a busy port would bind
        # too and silently take a share of the connections.
        ("grpc.so_reuseport", 0)])
    servicer = VerifierServicer(engine, cfg.auth_tokens, cfg.idle_timeout_s, cfg.default_params,
                                cfg.write_timeout_s)
    pb_grpc.add_VerifierServicer_to_server(servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = _bind(server, f"{cfg.host}:{cfg.port}", creds)
    await server.start()
    for name in ("", "acespec.v1.Verifier"):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    server.health_servicer = health_servicer  # so shutdown can flip it to NOT_SERVING
    server.verifier = servicer  # so a lost rank can end its sessions
    return server, port


def _tls_credentials(cfg: ServerConfig) -> grpc.ServerCredentials | None:
    """Server credentials from the PEM files, None for plaintext; ValueError naming the
    file when one is missing or holds the wrong kind of PEM (e.g. cert and key swapped)."""
    if not (cfg.tls_cert or cfg.tls_key):
        return None
    if not (cfg.tls_cert and cfg.tls_key):
        raise ValueError("TLS needs both --tls-cert and --tls-key")
    cert, key = Path(cfg.tls_cert).read_bytes(), Path(cfg.tls_key).read_bytes()
    if b"-----BEGIN CERTIFICATE-----" not in cert:
        hint = " (--tls-cert and --tls-key swapped?)" if b"PRIVATE KEY-----" in cert else ""
        raise ValueError(f"--tls-cert {cfg.tls_cert} holds no PEM certificate{hint}")
    if not re.search(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----", key):
        hint = " (--tls-cert and --tls-key swapped?)" if b"CERTIFICATE-----" in key else ""
        raise ValueError(f"--tls-key {cfg.tls_key} holds no PEM private key{hint}")
    return grpc.ssl_server_credentials([(key, cert)])


def _bind(server: grpc.aio.Server, address: str, creds) -> int:
    """Bind address (TLS when creds); the port. OSError with a one-line reason on failure
    (gRPC raises RuntimeError 'Failed to bind' or returns 0, depending on the version)."""
    try:
        port = server.add_secure_port(address, creds) if creds else \
            server.add_insecure_port(address)
    except RuntimeError:
        port = 0
    if port == 0:
        why = "the key does not match the certificate, " if creds else ""
        raise OSError(f"could not listen on {address}: {why}the port is in use, or the host is "
                      "not an address of this machine (--host, --port)")
    return port


async def serve(cfg: ServerConfig, ready: asyncio.Event | None = None) -> None:
    """Run until SIGINT/SIGTERM, then drain: refuse new sessions, give open ones grace_s."""
    _tls_credentials(cfg)  # a bad cert or key fails now, not after loading the model
    metrics = Metrics.create()
    loop = asyncio.get_running_loop()
    stop, failed = asyncio.Event(), []

    def lost(reason: str) -> None:  # from the tensor-parallel heartbeat or a pass
        loop.call_soon_threadsafe(lambda: (failed.append(reason), stop.set()))

    engine = load_engine(cfg, metrics, lost)
    exporter = None
    if cfg.metrics_port is not None:  # first: whoever finds the sessions' port open (a
        # bench, a probe) can read the metrics at once
        try:
            exporter, mport = metrics.serve(cfg.metrics_port, cfg.host)
        except OSError as e:
            _stop_ranks(engine)
            raise OSError(f"metrics: could not listen on {cfg.host}:{cfg.metrics_port}: "
                          f"{e.strerror or e}") from None
        log.info("metrics on http://%s:%d/metrics", cfg.host, mport)
    try:
        server, port = await create_server(engine, cfg)
    except BaseException:
        if exporter is not None:
            exporter.shutdown()
        _stop_ranks(engine)
        raise
    log.warning("verifier %s serving on %s:%d (%s%s)", engine.model_id, cfg.host, port,
                "TLS" if cfg.tls_cert else "plaintext",
                ", bearer auth" if cfg.auth_tokens else ", no auth")
    # Handlers first: whoever reads the line below may signal at once (and the metrics
    # thread may hold the GIL between the print and the next statement).
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"acespec verifier listening on {cfg.host}:{port}", flush=True)
    if ready:
        ready.set()
    await stop.wait()
    for name in ("", "acespec.v1.Verifier"):
        await server.health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    if failed:  # no pass can run: end every session now (their edges resume elsewhere)
        _leave_by(LOST_EXIT_S)
        server.verifier.fail_all(f"tensor parallelism lost: {failed[0]}")
        log.error("stopping: health NOT_SERVING, sessions end with UNAVAILABLE")
        await asyncio.sleep(LOST_LINGER_S)  # calls meanwhile learn why, not just 'refused'
        await server.stop(1.0)
    else:
        log.warning("shutting down: draining %d sessions (grace %.0f s)", engine.active,
                    cfg.grace_s)
        server.verifier.draining = True
        await _drain(server, engine, cfg.grace_s)
    await engine.close_all()
    _stop_ranks(engine)
    if failed:
        raise ServeFailed(f"tensor parallelism lost: {failed[0]}; the verifier stopped")
    log.warning("verifier stopped")


async def _drain(server, engine: Engine, grace_s: float) -> None:
    """Stop taking calls and give the open ones grace_s. Those still open near its end are
    ended with UNAVAILABLE (their edges resume elsewhere) rather than cut by the stop."""
    stopping = asyncio.create_task(server.stop(grace_s))
    end = asyncio.get_running_loop().time() + grace_s * DRAIN_FRACTION
    while engine.active and asyncio.get_running_loop().time() < end:
        await asyncio.sleep(0.05)
    if engine.active:
        reason = "the verifier is shutting down (its grace period ended)"
        log.warning("ending %d sessions with UNAVAILABLE: %s", engine.active, reason)
        server.verifier.fail_all(reason)
        engine.batcher.fail_pending(Unavailable(reason))
    await stopping


def _stop_ranks(engine: Engine) -> None:
    if engine.model.tp is not None:
        engine.model.tp.stop()


def _leave_by(seconds: float) -> None:
    """Exit code 1 in `seconds` unless the process has left by then: a pass stuck in a
    collective with a rank this process cannot kill (torchrun's) would otherwise hold the
    interpreter's exit until the backend's timeout."""
    def leave() -> None:
        log.error("a tensor-parallel pass is still stuck in a collective; exiting now")
        os._exit(1)

    timer = threading.Timer(seconds, leave)
    timer.daemon = True
    timer.start()
