"""A tensor-parallel rank that stops answering without dying: `cloud serve --tp 2` with
rank 1 sent SIGSTOP while a Generate is in a pass and an edge-decided session waits for its client.
Rank 0 finds it by its heartbeat: health NOT_SERVING within 10 s, both calls end with
UNAVAILABLE naming rank 1, one log line says for how long it was silent, the stopped rank
is killed and the server exits 1 (a supervisor restarts it)."""

from __future__ import annotations

import os
import queue
import re
import signal
import threading
import time

import pytest

from cli_harness import Proc
from conftest import free_port
from process_guard import alive

pytest.importorskip("torch")
grpc = pytest.importorskip("grpc")

from acespec.models import DEMO_TARGET  # noqa: E402
from acespec.proto import PROTOCOL_VERSION  # noqa: E402
from acespec.proto import acespec_pb2 as pb  # noqa: E402
from acespec.proto import acespec_pb2_grpc as pb_grpc  # noqa: E402
from acespec.proto.codec import encode_serve_params  # noqa: E402
from acespec.shared.served import ServeParams  # noqa: E402
from acespec.shared.tokenizer import Tokenizer  # noqa: E402

HEALTH_BY_S = 10.0  # health NOT_SERVING this soon after the rank stops
EXIT_BY_S = 30.0  # the server gone this soon


class Health:
    """The verifier's health as a Watch stream reports it: (monotonic time, status)."""

    def __init__(self, addr: str):
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        self.seen: list[tuple[float, str]] = []
        self.changed = threading.Condition()
        self._ch = grpc.insecure_channel(addr)
        stream = health_pb2_grpc.HealthStub(self._ch).Watch(
            health_pb2.HealthCheckRequest(service="acespec.v1.Verifier"))
        name = health_pb2.HealthCheckResponse.ServingStatus.Name

        def follow() -> None:
            try:
                for msg in stream:
                    with self.changed:
                        self.seen.append((time.monotonic(), name(msg.status)))
                        self.changed.notify_all()
            except grpc.RpcError:
                pass

        threading.Thread(target=follow, daemon=True).start()

    def when(self, status: str, timeout: float) -> float | None:
        """When `status` was first reported, waiting up to `timeout` s for it."""
        with self.changed:
            self.changed.wait_for(lambda: any(s == status for _, s in self.seen), timeout)
            return next((t for t, s in self.seen if s == status), None)

    def close(self) -> None:
        self._ch.close()


class Call:
    """A call run in a thread: what it received, and the status it ended with."""

    def __init__(self, run):
        self.got: list[object] = []
        self.error: grpc.RpcError | None = None
        self.done = threading.Event()

        def go() -> None:
            try:
                for msg in run():
                    self.got.append(msg)
            except grpc.RpcError as e:
                self.error = e
            finally:
                self.done.set()

        threading.Thread(target=go, daemon=True).start()

    def status(self, timeout: float) -> tuple[str, str]:
        assert self.done.wait(timeout), "the call is still open"
        assert self.error is not None, f"the call ended without an error after {self.got}"
        return self.error.code().name, self.error.details()


def _generate(stub, vocab_hash: str, prompt: list[int], max_tokens: int):
    return stub.Generate(pb.GenerateRequest(
        protocol_version=PROTOCOL_VERSION, vocab_hash=vocab_hash, prompt_tokens=prompt,
        sampling=encode_serve_params(ServeParams()), seed=0, max_tokens=max_tokens))


def _idle_session(stub, vocab_hash: str, prompt: list[int], hold: queue.Queue):
    """An edge-decided session that opens, then sends nothing until `hold` gets an item."""
    def uplink():
        yield pb.Uplink(open=pb.Open(protocol_version=PROTOCOL_VERSION, vocab_hash=vocab_hash,
                                     prompt_tokens=prompt,
                                     sampling=encode_serve_params(ServeParams()), seed=0))
        hold.get()
    return stub.Session(uplink())


@pytest.mark.slow
def test_a_stopped_rank_is_found_by_its_heartbeat_and_the_server_exits_1():
    tok = Tokenizer.load(DEMO_TARGET)
    vocab_hash, prompt = tok.vocab_hash(), tok.encode("def parse_args(argv):\n")
    port = free_port()
    addr = f"127.0.0.1:{port}"
    hold: queue.Queue = queue.Queue()
    worker = None
    cloud = Proc("cloud", "serve", "--host", "127.0.0.1", "--port", str(port), "--tp", "2",
                 "--emulate-step-ms", "120")  # slow passes: the Generate is in one when it stops
    ch = None
    try:
        with cloud:
            worker = int(cloud.wait_for(r"started ranks 1\.\.1 \(pids (\d+)\)").group(1))
            cloud.wait_for("listening on")
            health = Health(addr)
            assert health.when("SERVING", 10) is not None
            ch = grpc.insecure_channel(addr)
            stub = pb_grpc.VerifierStub(ch)
            idle = Call(lambda: _idle_session(stub, vocab_hash, prompt, hold))
            gen = Call(lambda: _generate(stub, vocab_hash, prompt, 400))
            deadline = time.monotonic() + 60
            while (len(gen.got) < 3 or not idle.got) and time.monotonic() < deadline:
                assert not gen.done.is_set() and not idle.done.is_set(), (gen.error, idle.error)
                time.sleep(0.05)
            assert len(gen.got) >= 3 and idle.got[0].WhichOneof("msg") == "opened"

            os.kill(worker, signal.SIGSTOP)
            stopped = time.monotonic()
            unhealthy = health.when("NOT_SERVING", HEALTH_BY_S + 5)
            assert unhealthy is not None and unhealthy - stopped <= HEALTH_BY_S, \
                (health.seen, cloud.stderr[-3000:])
            late = Call(lambda: _generate(stub, vocab_hash, prompt, 4))  # a new call now
            code = cloud.p.wait(EXIT_BY_S)
            exited = time.monotonic()
            health.close()
            err = cloud.stderr

        assert code == 1, err[-3000:]
        for call in (gen, idle):  # in a pass, and waiting for its client
            code, details = call.status(10)
            assert code == "UNAVAILABLE", details
            assert details.startswith("tensor parallelism lost: rank 1 stopped answering (no "
                                      "heartbeat for "), details
        assert late.status(10)[0] == "UNAVAILABLE"
        said = re.findall(r"ERROR .*tensor parallelism lost: rank 1 stopped answering \(no "
                          r"heartbeat for ([\d.]+) s\)", err)
        assert len(said) == 1, err[-3000:]  # one log line: which rank, how long
        assert err.strip().splitlines()[-1] == (
            f"acespec cloud serve: error: tensor parallelism lost: rank 1 stopped answering "
            f"(no heartbeat for {said[0]} s); the verifier stopped")
        assert not alive(worker)  # rank 0 killed the stopped rank on its way out
        print(f"NOT_SERVING {unhealthy - stopped:.1f} s and exit {exited - stopped:.1f} s "
              f"after SIGSTOP; rank 1 silent {said[0]} s when found")
    finally:
        hold.put(None)
        if ch is not None:
            ch.close()
        if worker is not None and alive(worker):
            os.kill(worker, signal.SIGCONT)
            os.kill(worker, signal.SIGKILL)
