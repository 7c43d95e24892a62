"""Convert a Llama-architecture GGUF (llama.cpp's format) into a Hugging Face checkpoint
directory: config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
generation_config.json. `transformers` and the verifier (acespec.cloud.target.loader) load it
unchanged.

Weights are dequantized with `gguf` and stored as float32. Why float32: a Q4_1 weight is
d * q + m with f16 scale d, f16 minimum m and a 4-bit q, which needs ~15 significant bits;
float32 holds it exactly (bfloat16 has 8, float16 11), and the verifier runs on a CPU where
float32 is the fast dtype anyway. The cost is disk: 4 bytes per parameter.

Output is deterministic: the same GGUF gives byte-identical files.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

# GGUF tensor name -> HF name; {i} is the layer.
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
CONTROL = 3  # llama.cpp token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte
USER_DEFINED = 4
# llama.cpp's `smollm` (and `starcoder`, ...) pre-tokenizer: each digit alone, then GPT-2's
# byte-level regex; `gpt2`/`default` have no digit split.
_DIGIT_SPLIT_PRES = {"smollm", "starcoder", "refact", "codeshell", "exaone", "minerva"}


class ConvertError(ValueError):
    """The GGUF is not something this converter covers (architecture, tokenizer, tensors)."""


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def hf_name(gguf_name: str) -> str:
    """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj.weight'."""
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", gguf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.weight"
    base = gguf_name.removesuffix(".weight")
    if base in _TOP_NAMES and gguf_name.endswith(".weight"):
        return f"{_TOP_NAMES[base]}.weight"
    raise ConvertError(f"unexpected tensor {gguf_name!r} in a llama GGUF")


def unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (convert_hf_to_gguf.py `permute`), which turns HF's
    rotate-half RoPE layout into interleaved pairs. w: [n_heads * head_dim, hidden]."""
    rows = w.shape[0]
    return (w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def hf_config(reader) -> dict:
    """config.json for LlamaForCausalLM from the GGUF's `llama.*` metadata."""
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ConvertError(f"architecture {arch!r}: only 'llama' GGUFs are converted")

    def g(key, default=None):
        return _field(reader, f"llama.{key}", default)

    heads = int(g("attention.head_count"))
    hidden = int(g("embedding_length"))
    head_dim = hidden // heads
    if int(g("rope.dimension_count", head_dim)) != head_dim:
        raise ConvertError("partial rotary embeddings are not supported")
    if g("rope.scaling.type") not in (None, "none"):
        raise ConvertError(f"rope scaling {g('rope.scaling.type')!r} is not supported")
    names = {t.name for t in reader.tensors}
    vocab = len(_field(reader, "tokenizer.ggml.tokens"))
    # float32 metadata -> the short decimal it was written from (9.99999975e-06 -> 1e-05)
    as_decimal = lambda x: float(str(np.float32(x)))  # noqa: E731
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": vocab, "hidden_size": hidden,
        "intermediate_size": int(g("feed_forward_length")),
        "num_hidden_layers": int(g("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(g("attention.head_count_kv", heads)),
        "head_dim": head_dim, "hidden_act": "silu",
        "rms_norm_eps": as_decimal(g("attention.layer_norm_rms_epsilon")),
        "rope_theta": as_decimal(g("rope.freq_base", 10000.0)), "rope_scaling": None,
        "max_position_embeddings": int(g("context_length")),
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": False, "mlp_bias": False,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": _field(reader, "tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float32", "initializer_range": 0.02,
    }


def convert_weights(reader, cfg: dict, on_tensor: Callable[[int, int], None] | None = None
                    ) -> dict[str, np.ndarray]:
    """Dequantized float32 tensors under HF names, Q/K un-permuted. on_tensor(done, total)."""
    from gguf.quants import dequantize  # lazy: as convert's

    out: dict[str, np.ndarray] = {}
    for n, t in enumerate(reader.tensors, 1):
        name = hf_name(t.name)
        w = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        if name.endswith("q_proj.weight"):
            w = unpermute(w, cfg["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            w = unpermute(w, cfg["num_key_value_heads"])
        out[name] = np.ascontiguousarray(w)
        if on_tensor:
            on_tensor(n, len(reader.tensors))
    return out


def tokenizer_json(reader) -> dict:
    """A `tokenizers` byte-level BPE equal to llama.cpp's tokenizer for this GGUF."""
    model, pre = _field(reader, "tokenizer.ggml.model"), _field(reader, "tokenizer.ggml.pre")
    if model != "gpt2":
        raise ConvertError(f"tokenizer model {model!r}: only byte-level BPE ('gpt2') is converted")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type")
    merges = _field(reader, "tokenizer.ggml.merges")
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    pre_tok = byte_level if pre not in _DIGIT_SPLIT_PRES else {
        "type": "Sequence",
        "pretokenizers": [{"type": "Digits", "individual_digits": True}, byte_level]}
    added = [{"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": ty == CONTROL}
             for i, (tok, ty) in enumerate(zip(tokens, types)) if ty in (CONTROL, USER_DEFINED)]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None, "pre_tokenizer": pre_tok,
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True,
                           "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {tok: i for i, tok in enumerate(tokens)}, "merges": list(merges)},
    }


def tokenizer_config(reader) -> dict:
    """tokenizer_config.json: special tokens by name, the chat template, no automatic BOS."""
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type")

    def name(key: str) -> str | None:
        i = _field(reader, f"tokenizer.ggml.{key}_token_id")
        return None if i is None else tokens[i]

    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": name("bos"), "eos_token": name("eos"), "unk_token": name("unknown"),
        "pad_token": name("padding"),
        "additional_special_tokens": [t for t, ty in zip(tokens, types) if ty == CONTROL],
        "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(_field(reader, "tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(_field(reader, "llama.context_length")),
    }
    template = _field(reader, "tokenizer.chat_template")
    if template:
        cfg["chat_template"] = template
    return {k: v for k, v in cfg.items() if v is not None}


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=False) + "\n",
                    encoding="utf-8")


def convert(gguf_path: str | Path, out_dir: str | Path,
            on_tensor: Callable[[int, int], None] | None = None) -> Path:
    """Write the HF checkpoint of `gguf_path` into `out_dir` (created; files overwritten)."""
    # lazy: gguf and safetensors are the cloud's; the edge imports this module (through
    # acespec.models.smollm2, for the pair's GGUF) without them
    import gguf
    from safetensors.numpy import save_file

    reader = gguf.GGUFReader(str(gguf_path))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = hf_config(reader)
    state = convert_weights(reader, cfg, on_tensor)
    if cfg["tie_word_embeddings"]:
        state.pop("lm_head.weight", None)
    save_file(dict(sorted(state.items())), str(out / "model.safetensors"),
              metadata={"format": "pt"})
    (out / "model.safetensors").chmod(0o644)  # safetensors creates it owner-only
    _write_json(out / "config.json", cfg)
    _write_json(out / "generation_config.json", {
        "bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"],
        "pad_token_id": cfg["pad_token_id"], "do_sample": False})
    _write_json(out / "tokenizer.json", tokenizer_json(reader))
    _write_json(out / "tokenizer_config.json", tokenizer_config(reader))
    return out
