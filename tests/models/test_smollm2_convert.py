"""SmolLM2-135M-Instruct: the GGUF -> Hugging Face conversion against llama.cpp on the same
GGUF, and the verifier against `transformers` on the converted checkpoint.

Tolerances (transformers on the float32 checkpoint vs llama.cpp on the Q4_1 GGUF, f32 KV
cache, 1 thread). The weights are the same numbers, but llama.cpp multiplies Q4_1 weights
with activations it quantizes to 8 bits per 32-value block (emulating that in torch shrinks
the first position's difference from 0.7 to 0.15), so logits differ by noise that grows
through 30 layers. On these prompts (89 positions): mean |dlogit| 0.22, max 2.6,
top-1 agreement 88/89, total variation between the softmaxes mean 0.033, max 0.093.
Bounds: mean < 0.4, max < 4.0, top-1 >= 95%, TV mean < 0.05, TV max < 0.2.
A conversion that skips the Q/K un-permutation breaks them by far (checked below), so the
bounds catch a wrong conversion while tolerating llama.cpp's arithmetic.
The verifier's own model against transformers: 2e-4 absolute (in practice 0: same float32 arithmetic).
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
llama_cpp = pytest.importorskip("llama_cpp")

from acespec.models.gguf_to_hf import convert, unpermute  # noqa: E402
from acespec.models.smollm2 import GGUF_NAME  # noqa: E402

pytestmark = pytest.mark.slow
CHAT = [{"role": "user", "content": "Write a Python function that checks whether a number "
         "is prime."}]
PROMPTS = ["def fibonacci(n):\n    if n < 2:\n        return n\n", "The capital of France is",
           "Ünïcödé 😀 tabs\tand   spaces 12345, naïve café"]
TEXTS = ["  leading spaces and trailing  ", "tabs\t\tand\nnewlines\n\n\n", "数字 123456 ½ ①",
         "emoji 😀👍🏽 and ZWJ 👨‍👩‍👧", "def f(x):\n\treturn x**2  # ok\n", "'s 're 'll don't",
         "Ünïcödé naïve café ß", "<|im_start|>user\nhi<|im_end|>\n", "x" * 300 + " 1.5e-3",
         "    indented\r\n\x00ctrl"]
GGML_F32 = 0


@pytest.fixture(scope="module")
def files(smollm2_cache):
    root = smollm2_cache / "smollm2"
    return root / GGUF_NAME, root / "target"


@pytest.fixture(scope="module")
def hf_model(files):
    return transformers.AutoModelForCausalLM.from_pretrained(
        files[1], dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def hf_tok(files):
    return transformers.AutoTokenizer.from_pretrained(files[1])


@pytest.fixture(scope="module")
def llama(files):
    ll = llama_cpp.Llama(str(files[0]), n_ctx=256, n_threads=1, logits_all=True,
                         verbose=False, type_k=GGML_F32, type_v=GGML_F32)
    yield ll
    ll.close()


def _prompt_ids(llama, hf_tok) -> list[list[int]]:
    chat = hf_tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    return [llama.tokenize(p.encode(), add_bos=False, special=True) for p in [chat, *PROMPTS]]


def _llama_logits(llama, ids: list[int]) -> np.ndarray:
    llama.reset()
    llama.eval(ids)
    return np.array(llama.scores[:len(ids)], dtype=np.float32)  # [T, V]


def _compare(ours: np.ndarray, ref: np.ndarray) -> dict:
    d = np.abs(ours - ref)
    p, q = torch.softmax(torch.tensor(ours), -1), torch.softmax(torch.tensor(ref), -1)
    tv = 0.5 * (p - q).abs().sum(-1)
    return {"mean": float(d.mean()), "max": float(d.max()), "tv_mean": float(tv.mean()),
            "tv_max": float(tv.max()),
            "top1": float((ours.argmax(-1) == ref.argmax(-1)).mean())}


def _all_positions(model, llama, prompts) -> dict:
    ours, ref = [], []
    with torch.no_grad():
        for ids in prompts:
            ours.append(model(torch.tensor([ids])).logits[0].numpy())
            ref.append(_llama_logits(llama, ids))
    return _compare(np.concatenate(ours), np.concatenate(ref))


def test_config_from_gguf_metadata(files):
    cfg = json.loads((files[1] / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (9, 3, 64)
    assert (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]) == \
        (576, 1536, 30)
    assert cfg["rope_theta"] == 100000.0 and cfg["rms_norm_eps"] == 1e-5
    assert cfg["tie_word_embeddings"] is True and cfg["vocab_size"] == 49152
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (1, 2)


def test_transformers_logits_match_llama_cpp(hf_model, hf_tok, llama):
    r = _all_positions(hf_model, llama, _prompt_ids(llama, hf_tok))
    print("transformers vs llama.cpp:", {k: round(v, 4) for k, v in r.items()})
    assert r["mean"] < 0.4 and r["max"] < 4.0, r
    assert r["top1"] >= 0.95 and r["tv_mean"] < 0.05 and r["tv_max"] < 0.2, r


def test_a_wrong_conversion_fails_the_tolerance(files, hf_tok, llama):
    """The bounds above have teeth: leaving Q/K in llama.cpp's permuted layout breaks them."""
    bad = transformers.AutoModelForCausalLM.from_pretrained(files[1], dtype=torch.float32).eval()
    with torch.no_grad():
        for layer in bad.model.layers:
            for proj, heads in ((layer.self_attn.q_proj, 9), (layer.self_attn.k_proj, 3)):
                proj.weight.copy_(torch.from_numpy(_permute(proj.weight.numpy(), heads)))
    r = _all_positions(bad, llama, _prompt_ids(llama, hf_tok)[:2])
    print("permuted Q/K vs llama.cpp:", {k: round(v, 4) for k, v in r.items()})
    assert r["mean"] > 2 and r["top1"] < 0.8 and r["tv_mean"] > 0.2, r


def _permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py `permute` (HF layout -> GGUF layout)."""
    return (w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def test_unpermute_inverts_llama_cpp_permute():
    w = np.arange(9 * 64 * 5, dtype=np.float32).reshape(9 * 64, 5)
    assert np.array_equal(unpermute(_permute(w, 9), 9), w)


def test_verifier_logits_match_transformers(files, hf_model, hf_tok):
    from acespec.cloud.target.loader import load_model

    ours = load_model(files[1])
    ids = hf_tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    ids = hf_tok(ids, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0]
        diff = (ours(ids, ours.new_cache()) - ref).abs().max().item()
    print(f"verifier vs transformers: max|diff| {diff:.2e}")
    assert diff < 2e-4


def test_tokenizer_round_trip_equals_llama_cpp(files, hf_tok, llama):
    from acespec.edge.drafting.llama import LlamaDrafter, LlamaDrafterConfig
    from acespec.edge.text import TextCodec
    from acespec.shared.tokenizer import Tokenizer

    ours = Tokenizer.load(files[1])
    drafter = LlamaDrafter(str(files[0]), LlamaDrafterConfig(n_ctx=64, n_seq_max=1))
    try:
        codec = TextCodec.from_drafter(drafter)
        assert ours.vocab_hash() == drafter.vocab_hash() == codec.vocab_hash
        assert (ours.bos_id, ours.eos_id) == (codec.bos_id, codec.eos_id) == (1, 2)
        for text in TEXTS:
            ref = llama.tokenize(text.encode(), add_bos=False, special=True)
            assert ours.encode(text, add_bos=False) == ref, text
            assert hf_tok(text, add_special_tokens=False)["input_ids"] == ref, text
            assert codec.encode(text)[1 if ref[:1] != [1] else 0:] == ref, text
            plain = llama.tokenize(text.encode(), add_bos=False, special=False)
            assert ours.backend.decode(plain, skip_special_tokens=False) == text
            assert llama.detokenize(plain).decode() == text
    finally:
        drafter.close()


def test_chat_template_renders_as_llama_cpp(files, hf_tok, llama):
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    template = llama.metadata["tokenizer.chat_template"]
    fmt = Jinja2ChatFormatter(template, eos_token="<|im_end|>", bos_token="<|im_start|>")
    for msgs in (CHAT, [{"role": "system", "content": "Be brief."},
                        {"role": "user", "content": "Hi 😀"},
                        {"role": "assistant", "content": "Hello!"},
                        {"role": "user", "content": "2+2?"}]):
        text = fmt(messages=msgs).prompt
        ref = llama.tokenize(text.encode(), add_bos=False, special=True)
        ours = hf_tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
        ours = ours["input_ids"] if isinstance(ours, dict) or hasattr(ours, "keys") else ours
        assert text.endswith("<|im_start|>assistant\n")
        assert list(ours) == ref


@pytest.mark.slow
def test_conversion_is_deterministic(files, tmp_path):
    convert(files[0], tmp_path / "again")
    for f in sorted(files[1].iterdir()):
        if f.name.startswith("."):
            continue
        a, b = (hashlib.sha256(p.read_bytes()).hexdigest() for p in (f, tmp_path / "again" / f.name))
        assert a == b, f.name
