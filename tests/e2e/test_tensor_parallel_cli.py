"""A tensor-parallel verifier as an operator starts it: `acespec cloud serve --tp N` (and
torchrun), used by `acespec edge generate`, a rank killed under a live session, bad --tp."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_harness import Proc, acespec, scrape, verifier
from conftest import free_port
from process_guard import alive, children

pytest.importorskip("torch")
pytest.importorskip("llama_cpp")

from acespec.models import DEMO_TARGET  # noqa: E402

PROMPT = "def parse_args(argv):\n"
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


def generate(addr: str, *extra: str) -> list[int]:
    out = acespec("edge", "generate", "--cloud", addr, "--max-tokens", "40", "--temperature",
                  "0", "--json", *extra, PROMPT, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)["token_ids"]


@pytest.fixture(scope="module")
def reference() -> dict[str, list[int]]:
    """Greedy tokens through an unsharded verifier, per edge mode."""
    proc, addr = verifier()
    with proc:
        ref = {mode: generate(addr, "--mode", mode) for mode in ("acespec", "ar")}
        assert proc.stop()[0] == 0
    return ref


@pytest.mark.slow
def test_greedy_generate_through_tp2_equals_tp1(reference):
    import httpx

    port = free_port()
    proc, addr = verifier("--tp", "2", "--metrics-port", str(port))
    with proc:
        assert re.search(r"started ranks 1\.\.1 \(pids \d+\)", proc.stderr)
        assert "tensor parallelism: 2 ranks (gloo)" in proc.stderr
        for mode, want in reference.items():  # decided and edge-decided sessions, and Generate
            assert generate(addr, "--mode", mode) == want, mode
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        moved = float(re.search(r"^acespec_tp_allreduce_bytes (\S+)", metrics, re.M).group(1))
        assert moved > 0
        assert re.search(r"^acespec_tp_ranks 2\.0$", metrics, re.M)
        code, took = proc.stop()
        assert code == 0 and "verifier stopped" in proc.stderr
        assert not _ranks_alive(proc)  # rank 0 waited for its ranks


@pytest.mark.slow
def test_a_killed_rank_stops_the_server_and_the_edge_resumes_elsewhere(reference):
    port, mport = free_port(), free_port()
    addr = f"127.0.0.1:{port}"
    cloud = Proc("cloud", "serve", "--host", "127.0.0.1", "--port", str(port), "--tp", "2",
                 "--metrics-port", str(mport), "--emulate-step-ms", "200")  # slow passes
    with cloud:
        cloud.wait_for("listening on")
        worker = int(cloud.wait_for(r"started ranks 1\.\.1 \(pids (\d+)\)").group(1))
        statuses = watch_health(addr)
        with Proc("edge", "generate", "--cloud", addr, "--max-tokens", "40", "--temperature",
                  "0", "--json", "--mode", "acespec", PROMPT) as edge:
            _wait_for_the_first_token(mport, edge)  # the session is live when its rank dies
            os.kill(worker, signal.SIGKILL)
            t0 = time.monotonic()
            code = cloud.p.wait(20)
            took = time.monotonic() - t0
            assert code == 1, cloud.stderr[-2000:]
            assert took < 10, took
            assert statuses()[-2:] == ["SERVING", "NOT_SERVING"], statuses()
            err = cloud.stderr.strip().splitlines()
            assert err[-1] == ("acespec cloud serve: error: tensor parallelism lost: rank 1 "
                               "exited (signal 9); the verifier stopped"), err[-3:]
            with Proc("cloud", "serve", "--host", "127.0.0.1", "--port", str(port)) as healthy:
                healthy.wait_for("listening on")
                assert edge.p.wait(120) == 0, edge.stderr[-2000:]
                result = json.loads(edge.stdout)
                healthy.stop()
    assert result["token_ids"] == reference["acespec"]
    assert result["stats"]["reconnects"] >= 1


@pytest.mark.parametrize("flags,says", [
    (["--tp", "0"], "--tp: must be an integer in [1, 1024]"),
    (["--tp", "two"], "--tp: must be an integer"),
    (["--tp", "3"], "--tp 3 must divide the model's 2 KV heads and 8 query heads"),
    (["--tp", "4"], "--tp 4 must divide the model's 2 KV heads (target: 8 query / 2 KV heads"),
    (["--tp", "2", "--kernels", "triton"], "--tp 2 with --kernels triton: tensor-parallel"),
])
def test_bad_tp_is_one_line_and_exit_2(flags, says):
    out = acespec("cloud", "serve", "--port", "0", *flags, timeout=60)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], lines


@pytest.mark.slow
def test_tp_against_torchruns_world_size_is_one_line():
    env = {**os.environ, "WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}
    out = acespec("cloud", "serve", "--port", "0", "--tp", "3", env=env, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip() == ("acespec cloud serve: error: --tp 3, but this process is "
                                  "one of WORLD_SIZE=2 ranks (torchrun --nproc-per-node): give "
                                  "the same number or leave --tp out")


@pytest.mark.slow
def test_ranks_that_see_different_checkpoints_stop_with_one_line(tmp_path):
    other = tmp_path / "other"
    shutil.copytree(DEMO_TARGET, other)
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, "rms_norm_eps": 1e-6}))
    base = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port())}
    procs = [subprocess.Popen([sys.executable, "-m", "acespec.cloud", "serve", "--port", "0",
                               "--model", str(model)], env={**base, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r, model in enumerate([DEMO_TARGET, other])]
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [2, 2]
    errors = [line for line in outs[0][1].splitlines() if "error" in line]
    assert len(errors) == 1 and "the tensor-parallel ranks see different checkpoints" in \
        errors[0] and "rank 1: " + str(other) in errors[0], outs[0][1][-2000:]


@pytest.mark.slow
def test_torchrun_starts_the_ranks_and_sigterm_stops_them_all(reference):
    port = free_port()
    with open(os.devnull, "w") as null:
        run = subprocess.Popen([TORCHRUN, "--nproc-per-node", "2", "-m", "acespec.cloud",
                                "serve", "--host", "127.0.0.1", "--port", str(port)],
                               stdout=subprocess.PIPE, stderr=null, text=True)
    try:
        line = run.stdout.readline()
        assert "listening on" in line, line
        assert generate(f"127.0.0.1:{port}") == reference["acespec"]
        run.send_signal(signal.SIGTERM)  # torchrun forwards it; rank 0 drains, then stops all
        run.wait(30)
        deadline = time.monotonic() + 15
        while children(run.pid) and time.monotonic() < deadline:  # torchrun's ranks
            time.sleep(0.2)
        assert not children(run.pid)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()


def watch_health(addr: str):
    """Follow the verifier's health (a Watch stream, in a thread); returns a function
    giving the statuses seen so far once the stream ended."""
    import threading

    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    seen, done = [], threading.Event()
    ch = grpc.insecure_channel(addr)
    stream = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service=""))

    def follow():
        try:
            for msg in stream:
                seen.append(health_pb2.HealthCheckResponse.ServingStatus.Name(msg.status))
        except grpc.RpcError:
            pass
        finally:
            done.set()
            ch.close()

    threading.Thread(target=follow, daemon=True).start()

    def statuses() -> list[str]:
        done.wait(10)
        return seen

    return statuses


def _wait_for_the_first_token(mport: int, edge: Proc, timeout: float = 120) -> None:
    """Until the verifier's /metrics shows the edge's session has its first token and has
    not finished."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert edge.p.poll() is None, edge.stderr[-2000:]
        try:
            page = httpx.get(f"http://127.0.0.1:{mport}/metrics", timeout=5).text
        except httpx.TransportError:
            page = ""
        if scrape(page, "acespec_time_to_first_token_seconds_count", kind="decided"):
            assert not scrape(page, "acespec_request_latency_seconds_count", kind="decided")
            return
        time.sleep(0.02)
    raise AssertionError(f"no first token within {timeout} s:\n{edge.stderr[-2000:]}")


def _ranks_alive(proc: Proc) -> bool:
    m = re.search(r"pids ([\d, ]+)\)", proc.stderr)
    return any(alive(int(p)) for p in m.group(1).split(", ")) if m else False


@pytest.mark.slow
def test_profile_times_tp1_and_tp2_side_by_side_and_counts_the_all_reduces():
    out = acespec("cloud", "profile", "--tp", "1,2", "--nodes", "1,4", "--repeats", "2",
                  "--json", timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {(r["tp"], r["nodes"]): r for r in json.loads(out.stdout)}
    assert set(rows) == {(1, 1), (1, 4), (2, 1), (2, 4)}
    assert all(r["pass_ms"] > 0 for r in rows.values())
    # demo target: 4 layers x 2 all-reduces of [nodes, 256] float32 per pass
    assert [rows[(2, n)]["allreduce_bytes"] for n in (1, 4)] == [2 * 4 * n * 256 * 4
                                                                for n in (1, 4)]
    assert rows[(1, 4)]["allreduce_bytes"] == 0
    table = acespec("cloud", "profile", "--random", "tiny", "--tp", "1", "--nodes", "2",
                    "--repeats", "1", timeout=120)
    assert table.returncode == 0 and table.stdout.startswith("| nodes | TP=1 ms (p90) |")


@pytest.mark.parametrize("flags,says", [
    (["--random", "llama-9t"], "--random 'llama-9t': shapes are llama-1b, llama-8b, tiny"),
    (["--random", "tiny", "--tp", "1,2"], "--random runs on one device"),
    (["--tp", "1,3"], "--tp 3 must divide"),
    (["--nodes", "0"], "--nodes: '0' is not a comma-separated list of positive integers"),
])
def test_bad_profile_flags_are_one_line(flags, says):
    out = acespec("cloud", "profile", *flags, timeout=60)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], lines
