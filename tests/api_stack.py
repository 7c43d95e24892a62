"""A stack the API tests share: `acespec cloud serve` with the tiny target, and `acespec edge
serve` in acespec mode and in ar mode beside it, started from the shell. A test module
imports the `servers` fixture."""

from __future__ import annotations

import contextlib

import pytest

from cli_harness import edge_serve, verifier

CHAT = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture(scope="module")
def servers(tiny_pair, tiny_hf_dir):
    """One verifier; `edge serve` in acespec mode and in ar mode: yields {mode: base url}."""
    from acespec.models.gguf_export import export_gguf

    tok_dir, model, _ = tiny_pair
    gguf = export_gguf(model, tok_dir, tok_dir / "chat-logprobs.gguf", "q8_0",
                       chat_template=CHAT)
    cloud, addr = verifier("--model", str(tiny_hf_dir))
    with cloud:
        with contextlib.ExitStack() as edges:
            yield {mode: edges.enter_context(edge_serve(addr, "--drafter", str(gguf),
                                                        "--mode", mode))[0]
                   for mode in ("acespec", "ar")}
        cloud.stop(timeout=20)
