"""The edge under hostile and careless use, tested where a user reaches it: the
`acespec edge generate` command as a subprocess, the `edge serve` HTTP server over real
HTTP, and real gRPC verifiers (in-process on loopback, or `acespec cloud serve` processes).

Covered: a verifier that ends a stream while the edge writes; drafter-context admission
control and per-request branch sequences; the verifier's max_live_nodes grant; clear
one-line errors for bad flags and files; `ar` stopping the verifier's stream, early failure
for an unreachable verifier, multi-token auth files, and the HTTP server's handling of deep
JSON, non-boolean `stream`, over-long prompts, disconnecting non-streaming clients and
streams that fail."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("llama_cpp")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")
grpc = pytest.importorskip("grpc")

from acespec.cli import build_parser  # noqa: E402
from acespec.cloud.serving.server import ServerConfig  # noqa: E402
from acespec.cloud.serving.servicer import VerifierServicer  # noqa: E402
from acespec.cloud.verify.batcher import StepEmulation  # noqa: E402
from acespec.cloud.verify.engine import Engine, Limits  # noqa: E402
from acespec.edge import cli as edge_cli  # noqa: E402
from acespec.edge.api.app import create_app  # noqa: E402
from acespec.edge.commands import build_service  # noqa: E402
from acespec.edge.session import config as engine_config  # noqa: E402
from acespec.proto import acespec_pb2 as pb  # noqa: E402
from acespec.proto import acespec_pb2_grpc as pb_grpc  # noqa: E402
from acespec.proto.codec import decode_extend, decode_serve_params, encode_scores  # noqa: E402
from acespec.shared.tokenizer import Tokenizer  # noqa: E402

from conftest import free_port, plain_greedy  # noqa: E402
from verifier_harness import run, running_verifier  # noqa: E402


@pytest.fixture(scope="module")
def stack(tiny_pair):
    """(torch target, tokenizer, drafter GGUF equal to the target, its vocab hash)."""
    tok_dir, model, ggufs = tiny_pair
    tok = Tokenizer.load(tok_dir)
    return model, tok, ggufs["f32"], tok.vocab_hash()


# -- harness -------------------------------------------------------------------------


async def acespec(*args: str, timeout: float = 90.0) -> tuple[int, str, str]:
    """Run `python -m acespec ARGS` without blocking the loop (in-process verifiers keep
    serving); returns (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "acespec", *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"acespec {' '.join(args)} ran past {timeout} s") from None
    return proc.returncode, out.decode(), err.decode()


def one_error_line(stderr: str, flag: str) -> None:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and flag in lines[0] and "error" in lines[0], stderr
    assert "Traceback" not in stderr


@contextlib.asynccontextmanager
async def edge_http(cloud: str, gguf, *flags: str):
    """`acespec edge serve` as its CLI builds it, on a real socket; yields (httpx client, svc)."""
    args = build_parser().parse_args(["edge", "serve", "--drafter", str(gguf), "--cloud", cloud,
                                      "--served-model-name", "tiny", *flags])
    svc = build_service(args)
    server = uvicorn.Server(uvicorn.Config(create_app(svc), host="127.0.0.1", port=free_port(),
                                           log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.02)
        assert not task.done(), "the edge server did not start"
    url = f"http://127.0.0.1:{server.config.port}"
    try:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            yield http, svc
    finally:
        server.should_exit = True
        await task
        await svc.aclose()


@contextlib.asynccontextmanager
async def serving(servicer):
    """A gRPC server on loopback around `servicer`; yields 'host:port'."""
    server = grpc.aio.server()
    pb_grpc.add_VerifierServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


async def poll(cond, timeout: float = 10.0, step: float = 0.02) -> bool:
    """Wait until cond() holds (True) or the timeout passes (False)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        await asyncio.sleep(step)
    return cond()


def passes(engine: Engine) -> float:
    return engine.metrics.registry.get_sample_value("acespec_passes_total") or 0.0


def no_eos_prompt(model, tok: Tokenizer, n: int) -> tuple[str, list[int]]:
    """A prompt whose greedy continuation runs n tokens without end of sequence (the tiny
    random target ends some texts early), and that continuation."""
    for p in ("import os\n", "def parse(text):\n", "x = 1\n", "class Stack:\n", "for i in"):
        ids = plain_greedy(model, tok.encode(p), n)
        if tok.eos_id not in ids:
            return p, ids
    raise AssertionError("every candidate prompt ends early")


def text_of_tokens(tok: Tokenizer, n: int, seed_text: str = "def f(x):\n    return x\n") -> str:
    """A prompt of about n tokens."""
    text = seed_text * (4 * n // len(tok.encode(seed_text)) + 1)
    return tok.decode(tok.encode(text, add_bos=False)[:n])


# -- 2: the verifier ends a stream while the edge writes ------------------------------


class EndsStreams(VerifierServicer):
    """A verifier replica that ends every other session right after answering its first
    Extend (a restart, a load balancer draining it): the Scores and the stream's end reach
    the edge together, while the edge keeps drafting and writing its next Extend."""

    def __init__(self, engine: Engine):
        super().__init__(engine)
        self.sessions = 0

    async def Session(self, request_iterator, context):  # noqa: N802 - gRPC name
        self.sessions += 1
        if self.sessions % 2 == 0:
            return await super().Session(request_iterator, context)
        first = (await context.read()).open
        params = decode_serve_params(first.sampling)
        res = await self.engine.open(list(first.prompt_tokens), params, first.seed,
                                     first.limits.max_live_nodes)
        try:
            await context.write(pb.Downlink(opened=pb.Opened(
                session_id=res.session_id, model_id="ends", vocab_hash=self.engine.vocab_hash,
                max_live_nodes=res.max_live_nodes, k_max=params.k_max,
                root=encode_scores([res.root], params.sampling.greedy))))
            nodes = decode_extend((await context.read()).extend, 1)
            scores = await self.engine.extend(res.session, nodes.first_id, nodes.tokens,
                                              nodes.parents)
            await context.write(pb.Downlink(scores=encode_scores(scores,
                                                                 params.sampling.greedy)))
        finally:
            self.engine.close(res.session_id)
        await context.abort(grpc.StatusCode.UNAVAILABLE, "replica going away")


@pytest.mark.slow
def test_stream_ended_while_the_edge_writes_is_a_lost_connection_http(stack):
    """Before the fix, one request in ~8 died with asyncio.InvalidStateError ('RPC already
    finished') from the edge's write: HTTP 500. Now each resumes on a new session."""
    model, tok, gguf, vh = stack
    prompt = "def parse(text):\n"
    expected = tok.decode(plain_greedy(model, tok.encode(prompt), 12))

    async def go():
        engine = Engine(model, vh, "ends")
        fake = EndsStreams(engine)
        async with serving(fake) as addr, \
                edge_http(addr, gguf, "--depth", "3", "--window", "8") as (http, svc):
            out = []
            for _ in range(40):
                r = await http.post("/v1/completions", json={
                    "model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0})
                out.append((r.status_code, r.json()))
            return out, fake.sessions

    out, sessions = run(go())
    assert [s for s, _ in out] == [200] * 40, [b for s, b in out if s != 200][:2]
    assert all(b["choices"][0]["text"] == expected for _, b in out)
    assert all(b["usage"]["cloud_reconnects"] == 1 for _, b in out)
    assert sessions == 80


def test_stream_ended_while_the_edge_writes_cli_resumes(stack):
    model, tok, gguf, vh = stack
    prompt = "class Stack:\n"
    expected = plain_greedy(model, tok.encode(prompt), 20)

    async def go():
        async with serving(EndsStreams(Engine(model, vh, "ends"))) as addr:
            return [await acespec("edge", "generate", prompt, "--cloud", addr, "--drafter",
                                  str(gguf), "--mode", mode, "--max-tokens", "20", "--json")
                    for mode in ("sd", "pipeline", "acespec")]

    for rc, out, err in run(go()):
        assert rc == 0 and "Traceback" not in err, err
        res = json.loads(out)
        assert res["token_ids"] == expected and res["stats"]["reconnects"] == 1


# -- 6: admission control and branch sequences ------------------------------------------


def test_concurrent_long_prompts_queue_instead_of_overrunning_the_drafter(stack):
    """24 concurrent requests with ~300-token prompts against `edge serve` with its default
    capacity flags: before, 13 of them got 500 'llama_decode failed (KV full?)'."""
    model, tok, gguf, vh = stack
    prompts = [text_of_tokens(tok, 300, f"x{i} = [{i}, {i + 1}]\n") for i in range(24)]

    async def go():
        async with running_verifier(model, vh) as (_, addr), \
                edge_http(addr, gguf, "--mode", "acespec") as (http, svc):
            rs = await asyncio.gather(*(http.post("/v1/completions", json={
                "model": "tiny", "prompt": p, "max_tokens": 16, "temperature": 0})
                for p in prompts))
            return rs, svc

    rs, svc = run(go())
    assert [r.status_code for r in rs] == [200] * 24, [r.text for r in rs if r.status_code != 200]
    assert all(r.json()["choices"][0]["finish_reason"] in ("length", "stop") for r in rs)
    assert svc.free_seqs.qsize() == svc.max_concurrent and svc.waiting == svc.admitted == 0


def test_full_queue_is_503_with_retry_after(stack):
    """One generation runs, one waits (--max-concurrent 1 --max-queue 1): a third request
    is refused at once with 503 and Retry-After; the two admitted ones complete."""
    model, tok, gguf, vh = stack
    slow = ServerConfig(emulation=StepEmulation(20))

    async def go():
        async with running_verifier(model, vh, slow) as (_, addr), \
                edge_http(addr, gguf, "--max-concurrent", "1", "--max-queue", "1") as (http, svc):
            req = {"model": "tiny", "prompt": "import os\n", "max_tokens": 24, "temperature": 0}
            running = asyncio.create_task(http.post("/v1/completions", json=req))
            assert await poll(lambda: svc.free_seqs.empty())
            queued = asyncio.create_task(http.post("/v1/completions", json=req))
            assert await poll(lambda: svc.waiting == 1)
            refused = await http.post("/v1/completions", json=req)
            return await running, await queued, refused, svc.admitted

    running, queued, refused, admitted = run(go())
    assert running.status_code == 200 and queued.status_code == 200
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert "--max-queue" in refused.json()["error"]["message"]
    assert admitted == 0


def test_over_long_request_is_400_naming_the_limit(stack):
    model, tok, gguf, vh = stack
    long_prompt = text_of_tokens(tok, 200)

    async def go():
        async with running_verifier(model, vh) as (_, addr), \
                edge_http(addr, gguf, "--ctx-per-request", "128") as (http, _):
            too_long = await http.post("/v1/completions", json={
                "model": "tiny", "prompt": long_prompt, "max_tokens": 4})
            too_many = await http.post("/v1/completions", json={
                "model": "tiny", "prompt": "x", "max_tokens": 500, "stream": True})
            return too_long, too_many

    too_long, too_many = run(go())
    assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "prompt"
    assert "128" in too_long.json()["error"]["message"]
    assert "--ctx-per-request" in too_long.json()["error"]["message"]
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "max_tokens"


def test_prompt_past_the_verifier_limit_is_400_not_502(stack):
    """The edge's own context allows it, the verifier's max_prompt_tokens does not: the
    client asked for too much (400), the deployment is fine."""
    model, tok, gguf, vh = stack
    small = ServerConfig(limits=Limits(max_prompt_tokens=64))

    async def go():
        async with running_verifier(model, vh, small) as (_, addr), \
                edge_http(addr, gguf) as (http, _):
            return await http.post("/v1/completions", json={
                "model": "tiny", "prompt": text_of_tokens(tok, 100), "max_tokens": 4})

    r = run(go())
    assert r.status_code == 400, r.text
    assert "max_prompt_tokens" in r.json()["error"]["message"]


class SeqSpy:
    """Wraps the drafter: records which sequences drafts and forks write to."""

    def __init__(self, inner):
        self.inner, self.main, self.forked = inner, set(), set()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def draft(self, context, n, sampling, rng, seq=0):
        return self.inner.draft(context, n, sampling, rng, seq=seq)

    def fork(self, src, dst, n_tokens=None):
        self.main.add(src)
        self.forked.add(dst)
        return self.inner.fork(src, dst, n_tokens)


def test_branches_use_their_own_sequences(stack, noisy_gguf):
    """acespec mode built request `seq`'s branches on seq + 1: another request's sequence."""
    model, tok, _, vh = stack
    prompts = ["import sys\n", "class A:\n", "def g(x):\n", "for i in", "while True:\n"]

    async def go():
        async with running_verifier(model, vh) as (_, addr), \
                edge_http(addr, noisy_gguf, "--mode", "acespec", "--depth", "4",
                          "--window", "8", "--branch-cloud-nodes", "16",
                          # generous budgets: this tests where branches go, not how many
                          "--branch-draft-ms", "200", "--branch-uplink-bytes", "10000",
                          "--branch-downlink-bytes", "100000") as (http, svc):
            pool = [svc.free_seqs.get_nowait() for _ in range(svc.free_seqs.qsize())]
            for seq in pool:  # the sequences requests are given, put back in order
                svc.free_seqs.put_nowait(seq)
            spy = svc.engine.drafter = SeqSpy(svc.drafter)
            rs = await asyncio.gather(*(http.post("/v1/completions", json={
                "model": "tiny", "prompt": p, "max_tokens": 24, "temperature": 0,
                "sampling": "exact"})  # the edge decides: the tree protocol's branches
                for p in prompts))
            return rs, spy, set(pool)

    rs, spy, pool = run(go())
    assert all(r.status_code == 200 for r in rs)
    assert spy.forked, "no branch was built: the test shows nothing"
    assert spy.main <= pool and spy.forked.isdisjoint(pool)


# -- 8: the verifier's max_live_nodes grant ---------------------------------------------


def start_verifier(model_dir, *flags: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "acespec", "cloud", "serve", "--model",
                             str(model_dir), "--host", "127.0.0.1", "--port", str(port),
                             *flags], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    line = proc.stdout.readline()
    assert re.search(r"listening on", line), line
    return proc, f"127.0.0.1:{port}"


@pytest.mark.parametrize("shape", [[], ["--depth", "4", "--window", "16"]],
                         ids=["adaptive", "depth4-window16"])
@pytest.mark.slow
def test_modes_fit_the_granted_live_nodes(stack, tiny_hf_dir, noisy_gguf, shape):
    """Against `cloud serve --max-live-nodes 16` every mode fits its window to the grant
    rather than exiting with '21 live nodes would exceed max_live_nodes=16'."""
    model, tok, _, _ = stack
    proc, addr = start_verifier(tiny_hf_dir, "--max-live-nodes", "16")
    prompt = "def handler(event):\n"
    try:
        outs = {}
        for mode in ("ar", "sd", "pipeline", "acespec"):
            for temperature in ("0", "1"):
                r = subprocess.run([sys.executable, "-m", "acespec", "edge", "generate", prompt,
                                    "--cloud", addr, "--drafter", str(noisy_gguf), "--mode",
                                    mode, "--max-tokens", "48", "--temperature", temperature,
                                    "--seed", "3", "--json", *shape],
                                   capture_output=True, text=True, timeout=120)
                assert r.returncode == 0, (mode, r.stderr)
                outs[mode, temperature] = json.loads(r.stdout)["token_ids"]
    finally:
        proc.kill()
        proc.wait()
    greedy = {tuple(v) for (m, t), v in outs.items() if t == "0"}
    assert greedy == {tuple(plain_greedy(model, tok.encode(prompt), 48))}
    assert all(len(v) == 48 for v in outs.values())


@pytest.mark.parametrize("grant", [3, 5, 9])
def test_small_grants_in_every_mode_and_sampling(stack, noisy_gguf, grant):
    """Tiny grants with a drafter that is often wrong (rejections leave dead nodes the
    verifier frees one Extend late): the output is unchanged, nothing is refused."""
    from acespec.edge.client import channel
    from acespec.edge.drafting.llama import LlamaDrafter, LlamaDrafterConfig
    from acespec.edge.session import EdgeEngine, EngineConfig
    from acespec.edge.speculation.branches import CacheConfig
    from acespec.shared.config import SamplingParams
    from acespec.shared.served import ServeParams

    model, tok, _, vh = stack
    prompt = tok.encode("def parse(text):\n    ")
    drafter = LlamaDrafter(noisy_gguf, LlamaDrafterConfig(n_ctx=512, n_seq_max=2))
    wide = CacheConfig(guesses=4, draft_ms=200.0, uplink_bytes=1e4, downlink_bytes=1e5,
                       cloud_nodes=32, node_s=0.0)
    cfg = ServerConfig(limits=Limits(max_live_nodes=grant))

    async def go():
        async with running_verifier(model, vh, cfg) as (_, addr):
            engine = EdgeEngine(lambda: channel(addr), vh, drafter)
            out = {}
            for mode in ("sd", "pipeline", "acespec"):
                for t in (0.0, 1.0):
                    serve = ServeParams(SamplingParams(temperature=t))
                    ec = EngineConfig(mode=mode, depth=4, window=12, max_tokens=40, seed=5,
                                      serve=serve, cache=wide, max_reconnects=0)
                    out[mode, t] = (await engine.generate(prompt, ec))[0]
                    again = (await engine.generate(prompt, ec))[0]
                    assert again == out[mode, t]  # a seed fixes a mode's text
            return out

    out = run(go())
    assert {tuple(v) for (m, t), v in out.items() if t == 0.0} == \
        {tuple(plain_greedy(model, prompt, 40))}
    assert all(len(v) == 40 for v in out.values())


# -- 9: clear errors instead of tracebacks ----------------------------------------------


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    (d / "text.gguf").write_text("not a model\n")
    (d / "empty.gguf").write_bytes(b"")
    (d / "tokenizer.json").write_text("{not json")
    return d


@pytest.mark.parametrize("flags,flag", [
    (["--seed", "-1"], "--seed"),
    (["--seed", str(2**64)], "--seed"),
    (["--top-k", str(2**32)], "--top-k"),
    (["--max-tokens", "-1", "--mode", "ar"], "--max-tokens"),
    (["--max-tokens", "0", "--mode", "ar"], "--max-tokens"),
    (["--max-tokens", "0"], "--max-tokens"),
    (["--depth", "0"], "--depth"),
    (["--window", "0"], "--window"),
    (["--depth", "8", "--window", "4"], "--window"),
    (["--branch-kv-mb", "-5"], "--branch-kv-mb"),
    (["--temperature", "nan"], "--temperature"),
    (["--top-p", "0"], "--top-p"),
    (["--drafter", "{bad}/text.gguf"], "--drafter"),
    (["--drafter", "{bad}/empty.gguf"], "--drafter"),
    (["--drafter", "{bad}/missing.gguf"], "--drafter"),
    (["--drafter", "ngram", "--tokenizer", "{bad}/tokenizer.json"], "--tokenizer"),
    (["--drafter", "ngram", "--tokenizer", "{bad}/empty.gguf"], "--tokenizer"),
    (["--auth-token-file", "{bad}/empty.gguf"], "--auth-token-file"),
    (["--max-tokens", "100000"], "--max-tokens"),
])
def test_bad_flags_are_one_clear_line_and_exit_2(bad_files, flags, flag):
    flags = [f.replace("{bad}", str(bad_files)) for f in flags]
    r = subprocess.run([sys.executable, "-m", "acespec", "edge", "generate", "x", "--cloud",
                        f"127.0.0.1:{free_port()}", *flags], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr)
    one_error_line(r.stderr, flag)


@pytest.mark.parametrize("flags,flag", [
    (["--max-concurrent", "0"], "--max-concurrent"),
    (["--ctx-per-request", "-1"], "--ctx-per-request"),
    (["--port", "70000"], "--port"),
    (["--drafter", "{bad}/text.gguf"], "--drafter"),
])
def test_serve_bad_flags_are_one_clear_line_and_exit_2(bad_files, flags, flag):
    flags = [f.replace("{bad}", str(bad_files)) for f in flags]
    r = subprocess.run([sys.executable, "-m", "acespec", "edge", "serve", *flags],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr)
    one_error_line(r.stderr, flag)


def test_serve_help_documents_capacity_flags():
    r = subprocess.run([sys.executable, "-m", "acespec", "edge", "serve", "--help"],
                       capture_output=True, text=True, timeout=60)
    for flag in ("--max-concurrent", "--ctx-per-request", "--max-queue"):
        assert flag in r.stdout


def test_the_parsers_limits_are_the_engines():
    """The parser restates the engine's largest --depth and --window (it imports no engine)."""
    assert (edge_cli.MAX_DEPTH, edge_cli.MAX_WINDOW) == (engine_config.MAX_DEPTH,
                                                         engine_config.MAX_WINDOW)


# -- 10: ar, unreachable and authenticated verifiers from the CLI -------------------------


def test_ar_stops_the_verifier_when_it_has_enough(stack):
    """`ar` read the verifier's stream to its end even after the edge was done (here a stop
    string): the verifier kept running passes, and the response waited for all of them."""
    model, tok, gguf, vh = stack
    n = 200
    prompt, ids = no_eos_prompt(model, tok, n)
    stop = tok.decode(ids[:12])[4:7]  # the text stops early; the stream would not
    slow = ServerConfig(emulation=StepEmulation(10))

    async def go():
        async with running_verifier(model, vh, slow) as (engine, addr), \
                edge_http(addr, gguf, "--mode", "ar") as (http, _):
            r = await http.post("/v1/completions", json={
                "model": "tiny", "prompt": prompt, "max_tokens": n, "temperature": 0,
                "stop": [stop]})
            return r, passes(engine)

    r, n_passes = run(go())
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "stop"
    assert n_passes < 50  # not the stream's 200 passes


@pytest.mark.slow
def test_unreachable_verifier_fails_fast_with_one_clear_line(stack):
    _, _, gguf, _ = stack
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "acespec", "edge", "generate", "x", "--cloud",
                        f"127.0.0.1:{free_port()}", "--drafter", str(gguf)],
                       capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    assert r.returncode == 3 and took < 15, (took, r.stderr)  # not after every retry
    one_error_line(r.stderr, "cannot reach the verifier")
    assert "debug_error_string" not in r.stderr


def test_auth_token_file_in_the_verifiers_format(stack, tmp_path):
    """The verifier's --auth-token-file holds one token per line; the edge sends the first
    token, not the whole file as one header (which gRPC refuses as 'Invalid metadata')."""
    model, tok, gguf, vh = stack
    tokens = tmp_path / "tokens"
    tokens.write_text("\n  secret-one  \nsecret-two\n")
    wrong = tmp_path / "wrong"
    wrong.write_text("nope\n")
    cfg = ServerConfig(auth_tokens=frozenset({"secret-one", "secret-two"}))

    async def go():
        async with running_verifier(model, vh, cfg) as (_, addr):
            base = ["edge", "generate", "import os\n", "--cloud", addr, "--drafter", str(gguf),
                    "--max-tokens", "6", "--json"]
            ok = await acespec(*base, "--auth-token-file", str(tokens))
            t0 = time.monotonic()
            refused = await acespec(*base, "--auth-token-file", str(wrong))
            return ok, refused, time.monotonic() - t0

    (rc, out, err), (rc2, _, err2), took = run(go())
    assert rc == 0, err
    assert json.loads(out)["token_ids"] == plain_greedy(model, tok.encode("import os\n"), 6)
    assert rc2 == 4 and "UNAUTHENTICATED" in err2 and took < 15, err2  # never retried
    one_error_line(err2, "UNAUTHENTICATED")


# -- 10: the HTTP server -----------------------------------------------------------------


def test_hostile_bodies_are_400(stack):
    model, _, gguf, vh = stack

    async def go():
        async with running_verifier(model, vh) as (_, addr), edge_http(addr, gguf) as (http, _):
            deep = await http.post("/v1/completions", content=b"[" * 100_000 + b"]" * 100_000,
                                   headers={"content-type": "application/json"})
            string_false = await http.post("/v1/completions", json={
                "model": "tiny", "prompt": "x", "max_tokens": 2, "stream": "false"})
            usage_str = await http.post("/v1/completions", json={
                "model": "tiny", "prompt": "x", "max_tokens": 2, "stream": True,
                "stream_options": {"include_usage": "yes"}})
            deep_call = {"id": "c", "type": "function",
                         "function": {"name": "f", "arguments": "[" * 100_000}}
            deep_args = await http.post("/v1/chat/completions", json={
                "model": "tiny", "max_tokens": 2, "messages": [
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "content": None, "tool_calls": [deep_call]}]})
            return deep, string_false, usage_str, deep_args

    deep, string_false, usage_str, deep_args = run(go())
    assert deep.status_code == 400
    assert deep.json()["error"]["message"] == (
        "request body is not valid JSON: nested deeper than 128 levels")
    assert string_false.status_code == 400 and string_false.json()["error"]["param"] == "stream"
    assert "boolean" in string_false.json()["error"]["message"]
    assert usage_str.status_code == 400
    assert deep_args.status_code == 400
    assert deep_args.json()["error"]["param"] == "messages[1].tool_calls[0].function.arguments"


def test_disconnected_non_streaming_client_cancels_its_generation(stack):
    model, tok, gguf, vh = stack
    prompt, _ = no_eos_prompt(model, tok, 100)
    slow = ServerConfig(emulation=StepEmulation(400))  # 100 tokens take >= 10 s

    async def go():
        async with running_verifier(model, vh, slow) as (engine, addr), \
                edge_http(addr, gguf, "--depth", "3", "--window", "8") as (http, svc):
            idle = svc.free_seqs.qsize()
            req = http.post("/v1/completions", json={
                "model": "tiny", "prompt": prompt, "max_tokens": 100, "temperature": 0})
            client = asyncio.create_task(req)
            started = await poll(lambda: bool(engine.sessions))
            client.cancel()  # the client gives up: httpx closes the connection
            with contextlib.suppress(asyncio.CancelledError):
                await client
            freed = await poll(lambda: not engine.sessions and svc.free_seqs.qsize() == idle,
                               timeout=5)
            return started, freed

    started, freed = run(go())
    assert started and freed  # before: the generation ran on to its 100th token


@pytest.mark.slow
def test_failed_stream_sends_only_the_error_event(stack):
    """A stream whose verifier goes away for good: an error event then [DONE], and no
    finish chunk claiming the text ended normally ('length')."""
    model, _, gguf, vh = stack
    slow = ServerConfig(emulation=StepEmulation(20))

    async def go():
        verifier = running_verifier(model, vh, slow)
        engine, addr = await verifier.__aenter__()
        stopped = False
        async with edge_http(addr, gguf) as (http, _):
            events = []
            async with http.stream("POST", "/v1/completions", json={
                    "model": "tiny", "prompt": "import", "max_tokens": 300,
                    "temperature": 0, "stream": True}) as r:
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    events.append(line[6:])
                    if not stopped:  # the verifier goes away after the first chunk
                        stopped = True
                        await verifier.__aexit__(None, None, None)
            return events

    events = run(go())
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert "error" in last and last["error"]["type"] == "service_unavailable"
    finishes = [c["finish_reason"] for e in events[:-2] for c in json.loads(e)["choices"]]
    assert finishes and all(f is None for f in finishes)
