"""A stack the API tests share: `acespec cloud serve` with the tiny target, and `acespec edge
serve` in acespec mode and in ar mode beside it, started from the shell."""

from __future__ import annotations

from cli_harness import Proc, verifier, wait_http
from conftest import free_port

CHAT = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def api_servers(tiny_pair, tiny_hf_dir):
    """One verifier; `edge serve` in acespec mode and in ar mode: yields {mode: base url}
    (a module's `servers` fixture yields from it)."""
    from acespec.models.gguf_export import export_gguf

    tok_dir, model, _ = tiny_pair
    gguf = export_gguf(model, tok_dir, tok_dir / "chat-logprobs.gguf", "q8_0",
                       chat_template=CHAT)
    cloud, addr = verifier("--model", str(tiny_hf_dir))
    edges, urls = [], {}
    try:
        for mode in ("acespec", "ar"):
            port = free_port()
            edges.append(Proc("edge", "serve", "--cloud", addr, "--port", str(port),
                              "--drafter", str(gguf), "--mode", mode))
            edges[-1].wait_for(r"acespec edge listening")
            urls[mode] = f"http://127.0.0.1:{port}"
            wait_http(urls[mode] + "/health")
        yield urls
    finally:
        for p in (*edges, cloud):
            p.stop(timeout=20)
            p.__exit__()
