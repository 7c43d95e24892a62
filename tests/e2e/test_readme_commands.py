"""Every command the README shows, run the way a user types it: the installed `acespec`
script in a child process, servers on real sockets, the official `openai` client over real
HTTP, SIGTERM to stop each server (also with a request in flight).

A server built in-process by a test can pass while `acespec edge serve` started from the
shell hangs on every request: these tests start every server from the shell."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("llama_cpp")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from cli_harness import Proc, acespec, edge_serve, generate_json, verifier, wait_http  # noqa: E402
from conftest import free_port  # noqa: E402

CHAT = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")
PROMPT = "def fibonacci(n):"


@pytest.fixture(scope="module")
def demo_verifier():
    """`acespec cloud serve` with its defaults (the shipped demo target)."""
    proc, addr = verifier()
    yield addr
    code, took = proc.stop()
    assert code == 0 and took < 15, proc.stderr[-2000:]


@pytest.mark.slow
def test_help_of_every_command():
    for cmd in ([], ["generate"], ["demo"], ["bench"], ["cloud", "serve"], ["cloud", "loadtest"],
                ["edge", "generate"], ["edge", "serve"], ["sim", "link"], ["models", "build-demo"]):
        p = acespec(*cmd, "--help", timeout=60)
        assert p.returncode == 0 and "usage: acespec" in p.stdout, (cmd, p.stderr)


@pytest.mark.slow
def test_local_generate_as_in_the_readme():
    p = acespec("generate", PROMPT, "--max-tokens", "96")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "mean acceptance length" in p.stdout + p.stderr and len(p.stdout) > 40


@pytest.mark.slow
def test_cloud_serve_then_edge_generate(demo_verifier):
    """README: `acespec cloud serve &` then `acespec edge generate ... --mode pipeline`; greedy
    text equals cloud-only decoding (ar)."""
    p = acespec("edge", "generate", PROMPT, "--cloud", demo_verifier, "--mode", "pipeline")
    assert p.returncode == 0, p.stderr[-2000:]
    assert len(p.stdout.strip()) > 0
    assert "[pipeline:" in p.stderr and "tok/s" in p.stderr and "RTT" in p.stderr
    q = acespec("edge", "generate", PROMPT, "--cloud", demo_verifier, "--max-tokens", "16")
    assert q.returncode == 0 and "[acespec-gap:" in q.stderr, q.stderr[-2000:]  # the default
    assert "RTT None" not in q.stderr  # the verifier decides: no round trip is timed
    runs = {mode: generate_json(demo_verifier, PROMPT, "--mode", mode, "--max-tokens", "48")
            for mode in ("ar", "acespec")}
    assert runs["ar"]["token_ids"] == runs["acespec"]["token_ids"]
    assert len(runs["ar"]["token_ids"]) == 48


def test_edge_generate_through_sim_link(demo_verifier):
    """README: `acespec sim link --listen ... --to ...` then `edge generate --cloud LINK`."""
    port = free_port()
    with Proc("sim", "link", "--listen", f"127.0.0.1:{port}", "--to", demo_verifier,
              "--up", "1mbit", "--down", "1mbit", "--rtt", "20ms") as link:
        link.wait_for(r"acespec link")
        answer = generate_json(f"127.0.0.1:{port}", "import os", "--max-tokens", "24")
        assert len(answer["token_ids"]) == 24
        code, took = link.stop()
        assert code == 0 and took < 10, link.stderr[-2000:]
        assert "bytes up" in link.stdout


@pytest.fixture(scope="module")
def chat_stack(tiny_pair, tiny_hf_dir):
    """`acespec cloud serve --model DIR` + `acespec edge serve --drafter CHAT.gguf`, both as
    processes: yields (base url, edge Proc)."""
    from acespec.models.gguf_export import export_gguf

    tok_dir, model, _ = tiny_pair
    gguf = export_gguf(model, tok_dir, tok_dir / "chat-readme.gguf", "q8_0", chat_template=CHAT)
    cloud, addr = verifier("--model", str(tiny_hf_dir))
    with cloud:
        with edge_serve(addr, "--drafter", str(gguf)) as stack:
            yield stack
        cloud.stop()


@pytest.mark.slow
def test_edge_serve_answers_the_openai_client(chat_stack):
    """`edge serve` started from the shell answers and does not hang: completions, chat,
    and streaming with the official client."""
    url, _ = chat_stack
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=60, max_retries=0)
    c = client.completions.create(model="acespec", prompt="def add(a, b):", max_tokens=16,
                                  temperature=0)
    assert c.choices[0].text and c.usage.completion_tokens > 0
    s = client.completions.create(model="acespec", prompt="def add(a, b):", max_tokens=16,
                                  temperature=0, stream=True)
    streamed = "".join(ch.choices[0].text for ch in s if ch.choices)
    assert streamed == c.choices[0].text  # greedy: the same text either way
    chat = client.chat.completions.create(
        model="acespec", messages=[{"role": "user", "content": "write a loop"}], max_tokens=12,
        temperature=0)
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content
    s = client.chat.completions.create(
        model="acespec", messages=[{"role": "user", "content": "write a loop"}], max_tokens=12,
        temperature=0, stream=True)
    assert "".join(ch.choices[0].delta.content or "" for ch in s if ch.choices) == \
        chat.choices[0].message.content
    assert client.models.list().data[0].id == "acespec"


@pytest.mark.slow
def test_servers_stop_on_sigterm_with_a_request_in_flight(tiny_pair, tiny_hf_dir):
    """SIGTERM stops `edge serve` and then `cloud serve` within a few seconds each, while a
    long streaming completion is running."""
    cloud, addr = verifier("--model", str(tiny_hf_dir), "--grace", "2",
                           "--emulate-step-ms", "20")
    port = free_port()
    edge = Proc("edge", "serve", "--cloud", addr, "--port", str(port), "--drafter",
                str(tiny_pair[2]["q8_0"]))
    with cloud, edge:
        edge.wait_for(r"acespec edge listening")
        wait_http(f"http://127.0.0.1:{port}/health")
        got: list[str] = []

        def client():
            try:
                with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", timeout=60,
                                  json={"model": "acespec", "prompt": "import os",
                                        "max_tokens": 2000, "stream": True,
                                        "ignore_eos": True}) as r:
                    for line in r.iter_lines():
                        got.append(line)
            except httpx.HTTPError as e:  # the server going away mid-stream is expected
                got.append(f"error: {e}")

        t = threading.Thread(target=client, daemon=True)
        t.start()
        deadline = time.monotonic() + 60
        while sum(x.startswith("data: {") for x in got) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sum(x.startswith("data: {") for x in got) >= 3, got[-5:]
        code, took = edge.stop(signal.SIGTERM, timeout=20)
        assert took < 10, f"edge serve took {took:.1f} s to stop"
        t.join(30)
        code, took = cloud.stop(signal.SIGTERM, timeout=20)
        assert code == 0 and took < 8, cloud.stderr[-2000:]


@pytest.mark.slow
def test_demo_as_typed(smollm2_cache):
    """README: `acespec demo` (SmolLM2 answering a chat question over an emulated 50 kbit/s
    link; the fixture's cache holds the files its first use fetches) and `acespec demo
    --pair demo` (the tiny shipped pair)."""
    env = {**os.environ, "ACESPEC_CACHE_DIR": str(smollm2_cache)}
    p = acespec("demo", "--max-tokens", "16", env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "[demo] pair smollm2 (the default" in p.stderr
    answer = p.stdout.split("| figure |")[0]
    assert "User: " in answer and "Assistant: " in answer and \
        len(answer.split("Assistant: ", 1)[1].strip()) > 10, answer
    assert "| figure | acespec-gap | ar |" in p.stdout and "acespec-gap / ar:" in p.stdout
    tiny = acespec("demo", "--pair", "demo", "--max-tokens", "16", timeout=600)
    assert tiny.returncode == 0, tiny.stderr[-3000:]
    assert "[demo] pair smollm2" not in tiny.stderr and "acespec-gap / ar:" in tiny.stdout


@pytest.mark.slow
def test_bench_short_run(tmp_path):
    """README: `acespec bench --link ... --modes ar,sd,pipeline,acespec --out ... --plot ...`
    (one prompt per category, few tokens, so it stays short)."""
    out = tmp_path / "results.json"
    p = acespec("bench", "--link", "1mbit:20ms,loopback", "--modes", "ar,sd,pipeline,acespec",
                "--per-category", "1", "--max-tokens", "8", "--emulate-step-ms", "2",
                "--out", str(out), "--plot", str(tmp_path / "plots"), timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "profile: --emulate-step-ms 2" in p.stdout
    rows = json.loads(out.read_text())
    text = json.dumps(rows)
    for mode in ("ar", "sd", "pipeline", "acespec"):
        assert f'"{mode}"' in text
    assert list((tmp_path / "plots").glob("*.png"))


def test_bench_sweep_as_in_the_readme(tmp_path):
    """README: `acespec bench sweep --calibration costs.json --accept 0.8 --rates ... --rtts
    ...`, with a calibration as `bench calibrate` writes it: the model's table, the decided
    modes' lone share, and the calibration's prompt-lookup acceptance unless overridden."""
    from acespec.sim.des import ModelCosts

    cal = tmp_path / "costs.json"
    cal.write_text(json.dumps({"costs": vars(ModelCosts()), "acceptance": 0.7, "hit_rate": 0.5,
                               "lookup_acceptance": 0.5}))
    args = ("bench", "sweep", "--calibration", str(cal), "--accept", "0.8", "--rates",
            "20kbit,1mbit", "--rtts", "50ms", "--depths", "4")
    p = acespec(*args, "--out", str(tmp_path / "sweep.json"), timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "acceptance 0.8, hit rate 0.5, prompt-lookup acceptance 0.5" in p.stdout
    assert "acespec_lone" in p.stdout
    rows = json.loads((tmp_path / "sweep.json").read_text())["rows"]
    assert len(rows) == 4 and all(0 < r["acespec_lone"] <= 1 for r in rows)
    plain = acespec(*args, "--lookup-accept", "0", "--hold-ms", "50", timeout=300)
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert "prompt-lookup acceptance 0.0, verifier holds up to 50 ms" in plain.stdout
    bad = acespec(*args, "--lookup-accept", "1", timeout=60)
    assert bad.returncode == 2 and "--lookup-accept" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_nginx_config_prints_a_config():
    p = acespec("cloud", "nginx-config", "10.0.0.11:50051", "10.0.0.12:50051", "--listen",
                "0.0.0.0:50051", timeout=60)
    assert p.returncode == 0 and "grpc_pass" in p.stdout and "10.0.0.12:50051" in p.stdout


def test_demo_and_bench_refuse_bad_numbers_in_one_line():
    for cmd in (["demo", "--max-tokens", "0"], ["bench", "--max-tokens", "-1"],
                ["bench", "--depth", "0"], ["bench", "--per-category", "0"]):
        p = acespec(*cmd, timeout=60)
        assert p.returncode == 2 and "must be an integer in [1, inf)" in p.stderr, (cmd, p.stderr)
        assert "Traceback" not in p.stderr


@pytest.mark.slow
def test_edge_serve_chat_template_flag(tiny_pair, tiny_hf_dir, tmp_path):
    """`edge serve --chat-template FILE` gives chat to a drafter GGUF that has no template
    (the docker compose stack serves the demo drafter this way); a broken template is a
    one-line start-up error."""
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}")
    p = acespec("edge", "serve", "--drafter", str(tiny_pair[2]["q8_0"]), "--chat-template",
                str(bad), timeout=60)
    assert p.returncode == 2 and "--chat-template" in p.stderr and "Traceback" not in p.stderr
    tpl = tmp_path / "chat.jinja"
    tpl.write_text(CHAT)
    cloud, addr = verifier("--model", str(tiny_hf_dir))
    with cloud:
        with edge_serve(addr, "--drafter", str(tiny_pair[2]["q8_0"]), "--chat-template",
                        str(tpl)) as (url, _):
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=60,
                                   max_retries=0)
            r = client.chat.completions.create(model="acespec", max_tokens=8, temperature=0,
                                               messages=[{"role": "user", "content": "hi"}])
            assert r.choices[0].message.content and r.usage.completion_tokens > 0
        cloud.stop()


@pytest.mark.slow
def test_edge_generate_chat(tiny_pair, tiny_hf_dir, tmp_path):
    """`edge generate --chat MESSAGE` renders the message with the chat template and answers
    it: the same tokens as `edge generate` on the rendered prompt; with no template anywhere,
    a one-line error naming --chat."""
    gguf = str(tiny_pair[2]["q8_0"])
    tpl = tmp_path / "chat.jinja"
    tpl.write_text(CHAT)
    p = acespec("edge", "generate", "hi", "--chat", "--drafter", gguf, timeout=60)
    assert p.returncode == 2 and "--chat" in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    cloud, addr = verifier("--model", str(tiny_hf_dir))
    with cloud:
        common = ("--cloud", addr, "--drafter", gguf, "--max-tokens", "12", "--json")
        chat = acespec("edge", "generate", "write a loop", "--chat", "--chat-template", str(tpl),
                       *common, timeout=120)
        plain = acespec("edge", "generate", "<|user|>write a loop\n<|assistant|>", *common,
                        timeout=120)
        cloud.stop()
    assert chat.returncode == 0 and plain.returncode == 0, chat.stderr[-1000:]
    got, want = json.loads(chat.stdout), json.loads(plain.stdout)
    assert got["token_ids"] == want["token_ids"] and len(got["token_ids"]) > 0
