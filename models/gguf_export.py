"""Write a Llama-architecture torch model plus its byte-level BPE tokenizer as GGUF.

llama.cpp's own converter refuses tokenizers whose pre-tokenizer hash it does not know,
so we write the file directly with the `gguf` package. Tokenizer metadata: model `gpt2`,
pre-tokenizer `gpt-2` (the same regex as `tokenizers`' ByteLevel).
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from acespec.models.tokenizer_train import bpe_merges
from acespec.shared.tokenizer import Tokenizer, read_json_object

FILE_TYPES = {"f32": 0, "f16": 1, "q8_0": 7}  # llama_ftype values


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF half-split RoPE layout -> llama.cpp's interleaved layout (rows of q or k)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def export_gguf(model, tokenizer_dir: str | Path, out_path: str | Path, ftype: str = "f16",
                name: str = "acespec-drafter", context_length: int = 4096,
                chat_template: str | None = None, tokenizer_gguf: str | Path | None = None) -> Path:
    """Write `model` (acespec.cloud.target.model.Transformer, arch llama, no biases) to GGUF.

    ftype: 'f32' | 'f16' | 'q8_0'. Norms always stay F32 (as llama.cpp's converter does).
    tokenizer_gguf: copy every `tokenizer.*` key (vocabulary, merges, special ids, chat
    template) from that GGUF instead of writing them from `tokenizer_dir`, so llama.cpp
    tokenizes exactly as it does for that model.
    """
    args = model.args
    if args.arch != "llama" or args.qkv_bias or args.o_bias or args.mlp_bias or args.rope_scaling:
        raise ValueError("GGUF export supports plain Llama (no biases, no rope scaling)")
    if ftype not in FILE_TYPES:
        raise ValueError(f"ftype must be one of {sorted(FILE_TYPES)}, got {ftype!r}")
    out_path = Path(out_path)
    w = gguf.GGUFWriter(str(out_path), arch="llama")
    _write_hparams(w, args, name, context_length, ftype)
    if tokenizer_gguf is None:
        _write_tokenizer(w, Path(tokenizer_dir), args.vocab_size)
    else:
        _copy_tokenizer(w, Path(tokenizer_gguf), args.vocab_size)
    if chat_template:
        w.add_chat_template(chat_template)
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, args.num_layers)
    for hf_name, tensor in model.state_dict().items():
        if args.tie_word_embeddings and hf_name == "lm_head.weight":
            continue  # llama.cpp reuses token_embd when output.weight is absent
        data = tensor.detach().float().cpu().numpy()
        if hf_name.endswith("q_proj.weight"):
            data = _permute(data, args.num_heads)
        elif hf_name.endswith("k_proj.weight"):
            data = _permute(data, args.num_kv_heads)
        name_ = tmap.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name_ is None:
            raise ValueError(f"no GGUF name for tensor {hf_name}")
        _add_tensor(w, name_, data, ftype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out_path


def export_target(model_dir: str | Path, out_path: str | Path, ftype: str = "f16") -> Path:
    """Write the Hugging Face checkpoint at `model_dir` (what `cloud serve --model` loads) as
    a GGUF drafter with the folder's tokenizer and chat template: the target drafting for
    itself, what the edge's drafts can at best bring (docs/benchmarks.md §11). Raises
    ModelFileError or ValueError naming what is wrong with the folder."""
    # lazy: torch, to read the checkpoint (the rest of this module needs only numpy)
    from acespec.cloud.target.loader import load_model

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise ValueError(f"{model_dir}: no config.json (a Hugging Face checkpoint folder)")
    if ftype not in FILE_TYPES:  # before the checkpoint is read
        raise ValueError(f"ftype must be one of {sorted(FILE_TYPES)}, got {ftype!r}")
    if not Path(out_path).parent.is_dir():
        raise ValueError(f"{Path(out_path).parent}: no such folder to write {Path(out_path).name}")
    return export_gguf(load_model(model_dir), model_dir, out_path, ftype, name=model_dir.name,
                       chat_template=_chat_template(model_dir))


def _chat_template(model_dir: Path) -> str | None:
    """tokenizer_config.json's chat template, where it has one as a string."""
    path = model_dir / "tokenizer_config.json"
    template = read_json_object(path).get("chat_template") if path.is_file() else None
    return template if isinstance(template, str) else None


def _write_hparams(w, args, name: str, context_length: int, ftype: str) -> None:
    w.add_name(name)
    w.add_context_length(context_length)
    w.add_embedding_length(args.hidden_size)
    w.add_block_count(args.num_layers)
    w.add_feed_forward_length(args.intermediate_size)
    w.add_head_count(args.num_heads)
    w.add_head_count_kv(args.num_kv_heads)
    w.add_key_length(args.head_dim)
    w.add_value_length(args.head_dim)
    w.add_rope_dimension_count(args.head_dim)
    w.add_layer_norm_rms_eps(args.rms_norm_eps)
    w.add_rope_freq_base(args.rope_theta)
    w.add_vocab_size(args.vocab_size)
    w.add_file_type(FILE_TYPES[ftype])


def _write_tokenizer(w, tokenizer_dir: Path, vocab_size: int) -> None:
    tok = Tokenizer.load(tokenizer_dir)
    table = tok.id_to_token_table()
    if len(table) != vocab_size:
        raise ValueError(f"tokenizer has {len(table)} tokens, model vocab is {vocab_size}")
    specials = {t.content for t in tok.backend.get_added_tokens_decoder().values() if t.special}
    types = [gguf.TokenType.CONTROL if t in specials else gguf.TokenType.NORMAL for t in table]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(table)
    w.add_token_types(types)
    w.add_token_merges(bpe_merges(tok.path))
    if tok.bos_id is not None:
        w.add_bos_token_id(tok.bos_id)
    if tok.eos_id is not None:
        w.add_eos_token_id(tok.eos_id)
    w.add_add_bos_token(False)  # AceSpec feeds token ids; it adds BOS itself


def _copy_tokenizer(w, src: Path, vocab_size: int) -> None:
    fields = gguf.GGUFReader(str(src)).fields
    n = len(fields["tokenizer.ggml.tokens"].data)
    if n != vocab_size:
        raise ValueError(f"{src} has {n} tokens, model vocab is {vocab_size}")
    for key, f in fields.items():
        if key.startswith("tokenizer."):
            vtype = f.types[0]
            sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(key, f.contents(), vtype, sub_type=sub)


def _add_tensor(w, name: str, data: np.ndarray, ftype: str) -> None:
    if data.ndim == 1 or ftype == "f32":
        w.add_tensor(name, data.astype(np.float32))
    elif ftype == "f16":
        w.add_tensor(name, data.astype(np.float16))
    else:
        q = gguf.quants.quantize(data.astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
