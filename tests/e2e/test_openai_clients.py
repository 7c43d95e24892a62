"""What real OpenAI clients send, against `acespec edge serve` started from the shell (with
`acespec cloud serve` serving the tiny target), through the official `openai` SDK: content as
a list of text parts (guidellm sends it so), models.retrieve, served names and aliases,
ignore_eos where the model ends its text, stream_options.continuous_usage_stats, and user
and metadata, which the server logs; and langchain-openai, a framework client, streaming."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("llama_cpp")
pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from cli_harness import Proc, verifier, wait_http  # noqa: E402
from conftest import free_port, plain_greedy, stdlib_texts  # noqa: E402

pytestmark = pytest.mark.slow
CHAT = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")
NAMES = ("tiny-llama", "my-model")  # --served-model-name: the reported name, then an alias


@pytest.fixture(scope="module")
def stack(tiny_pair, tiny_hf_dir):
    """`acespec cloud serve --model DIR` + `acespec -v edge serve --drafter CHAT.gguf
    --served-model-name tiny-llama my-model`: yields (openai client, edge Proc)."""
    from acespec.models.gguf_export import export_gguf

    tok_dir, model, _ = tiny_pair
    gguf = export_gguf(model, tok_dir, tok_dir / "chat-clients.gguf", "q8_0", chat_template=CHAT)
    cloud, addr = verifier("--model", str(tiny_hf_dir))
    port = free_port()
    edge = Proc("-v", "edge", "serve", "--cloud", addr, "--port", str(port), "--drafter",
                str(gguf), "--served-model-name", *NAMES)
    try:
        edge.wait_for(r"acespec edge listening")
        wait_http(f"http://127.0.0.1:{port}/health")
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused",
                            timeout=60, max_retries=0), edge
    finally:
        edge.stop(timeout=20)
        edge.__exit__()
        cloud.stop()
        cloud.__exit__()


def test_chat_content_as_text_parts(stack):
    client, _ = stack
    ask = {"model": "tiny-llama", "max_tokens": 12, "temperature": 0}
    parts = client.chat.completions.create(**ask, messages=[{"role": "user", "content": [
        {"type": "text", "text": "write"}, {"type": "text", "text": "a loop"}]}])
    joined = client.chat.completions.create(**ask, messages=[
        {"role": "user", "content": "write\na loop"}])
    assert parts.choices[0].message.content == joined.choices[0].message.content
    assert parts.usage.prompt_tokens == joined.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**ask, messages=[{"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}])
    assert e.value.status_code == 400 and e.value.body["param"] == "messages[0].content[1]"
    assert "'image_url'" in e.value.body["message"]


def test_models_retrieve_and_list(stack):
    client, _ = stack
    assert [m.id for m in client.models.list().data] == list(NAMES)
    for name in NAMES:
        m = client.models.retrieve(name)
        assert m.id == name and m.object == "model" and m.owned_by == "acespec"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-4o")
    assert e.value.body["code"] == "model_not_found"


def test_a_request_naming_an_alias(stack):
    client, _ = stack
    c = client.completions.create(model="my-model", prompt="import os\n", max_tokens=4,
                                  temperature=0)
    assert c.model == "tiny-llama" and c.usage.completion_tokens == 4
    with pytest.raises(openai.NotFoundError) as e:  # not served: names were given
        client.completions.create(model="acespec", prompt="import os\n", max_tokens=4)
    assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"


def ends_early(model, tok, n: int) -> tuple[str, int]:
    """A prompt whose greedy continuation by the tiny target emits end of text after at least
    one token and within n: (prompt, tokens before the end)."""
    lines = [ln for text in stdlib_texts(8) for ln in text.splitlines() if ln.strip()][:200]
    for p in ("import os\n", "def parse(text):\n", "x = 1\n", "class Stack:\n", *lines):
        ids = plain_greedy(model, tok.encode(p), n)
        if tok.eos_id in ids[1:]:
            return p, ids.index(tok.eos_id)
    raise AssertionError("no candidate prompt ends early")


def test_ignore_eos_runs_past_the_end_of_text(stack, tiny_pair):
    from acespec.shared.tokenizer import Tokenizer

    client, _ = stack
    tok_dir, model, _ = tiny_pair
    prompt, before = ends_early(model, Tokenizer.load(tok_dir), 48)
    ask = {"model": "tiny-llama", "prompt": prompt, "max_tokens": 64, "temperature": 0}
    ended = client.completions.create(**ask)
    assert ended.choices[0].finish_reason == "stop"
    assert ended.usage.completion_tokens == before
    ran = client.completions.create(**ask, extra_body={"ignore_eos": True})
    assert ran.choices[0].finish_reason == "length" and ran.usage.completion_tokens == 64
    assert ran.choices[0].text.startswith(ended.choices[0].text)


def test_continuous_usage_stats(stack):
    client, _ = stack
    chunks = list(client.chat.completions.create(
        model="tiny-llama", max_tokens=10, temperature=0, stream=True,
        messages=[{"role": "user", "content": [{"type": "text", "text": "write a loop"}]}],
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    assert all(ch.usage is not None for ch in chunks), chunks
    counts = [ch.usage.completion_tokens for ch in chunks]
    assert counts == sorted(counts) and counts[-1] == 10
    assert chunks[-1].choices == [] and chunks[-2].choices[0].finish_reason == "length"
    plain = list(client.chat.completions.create(
        model="tiny-llama", max_tokens=10, temperature=0, stream=True,
        messages=[{"role": "user", "content": "write a loop"}],
        stream_options={"include_usage": True}))
    assert [ch.usage is not None for ch in plain] == [False] * (len(plain) - 1) + [True]
    assert plain[-1].usage.completion_tokens == 10


def test_user_and_metadata_are_accepted_and_logged(stack):
    client, edge = stack
    r = client.chat.completions.create(
        model="tiny-llama", max_tokens=4, temperature=0, user="alice",
        metadata={"team": "edge", "ticket": "42"},
        messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content is not None
    edge.wait_for(r'request model=tiny-llama user="alice" '
                  r'metadata=\{"team":"edge","ticket":"42"\} n=1', timeout=10)


def test_what_sdks_send_by_default_is_accepted(stack):
    """Parameters at their "off" values, as SDKs and tools fill them in."""
    client, _ = stack
    r = client.chat.completions.create(
        model="tiny-llama", max_completion_tokens=4, temperature=0, n=1, presence_penalty=0,
        frequency_penalty=0.0, logprobs=False, parallel_tool_calls=True, store=False,
        stop=None, messages=[{"role": "developer", "content": "be brief"},
                             {"role": "user", "content": "hi"}])
    assert r.usage.completion_tokens <= 4
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny-llama", logit_bias={"5": 10},
                                       messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["param"] == "logit_bias"


def test_langchain_chat_model_streams_and_invokes(stack):
    """langchain-openai's ChatOpenAI (a framework client), streaming and not, with AceSpec's
    own request field passed through extra_body: the same text as the openai SDK's."""
    chat_models = pytest.importorskip("langchain_openai")
    client, _ = stack
    llm = chat_models.ChatOpenAI(base_url=str(client.base_url), api_key="unused",
                                 model="my-model", temperature=0, max_tokens=12,
                                 max_retries=0, timeout=60, extra_body={"offline": "wait"})
    ask = [("user", "write a loop")]
    chunks = list(llm.stream(ask))
    whole = llm.invoke(ask)
    sdk = client.chat.completions.create(model="my-model", max_tokens=12, temperature=0,
                                         messages=[{"role": "user", "content": "write a loop"}])
    assert len(chunks) > 2
    assert "".join(c.content for c in chunks) == whole.content \
        == sdk.choices[0].message.content
    assert whole.response_metadata["model_name"] == "tiny-llama"
