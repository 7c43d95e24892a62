"""Write a trained `Transformer` as a Hugging Face checkpoint that transformers loads unchanged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.torch import save_file

from acespec.cloud.target.model import Transformer

HF_NAMES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def hf_config(model: Transformer, bos_id: int, eos_id: int) -> dict:
    a = model.args
    if a.arch != "llama":
        raise ValueError("only Llama export is implemented")
    return {
        "architectures": [HF_NAMES[a.arch]], "model_type": a.arch,
        "vocab_size": a.vocab_size, "hidden_size": a.hidden_size,
        "intermediate_size": a.intermediate_size, "num_hidden_layers": a.num_layers,
        "num_attention_heads": a.num_heads, "num_key_value_heads": a.num_kv_heads,
        "head_dim": a.head_dim, "hidden_act": "silu", "rms_norm_eps": a.rms_norm_eps,
        "rope_theta": a.rope_theta, "rope_scaling": None,
        "max_position_embeddings": a.max_position_embeddings,
        "tie_word_embeddings": a.tie_word_embeddings, "attention_bias": False,
        "mlp_bias": False, "bos_token_id": bos_id, "eos_token_id": eos_id,
        "torch_dtype": "float32", "initializer_range": 0.02,
    }


def export_hf(model: Transformer, tokenizer_dir: str | Path, out_dir: str | Path,
              bos_id: int, eos_id: int) -> Path:
    """config.json, model.safetensors, tokenizer files, generation_config.json."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if model.args.tie_word_embeddings:
        state.pop("lm_head.weight")
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf_config(model, bos_id, eos_id), indent=2) + "\n")
    gen = {"bos_token_id": bos_id, "eos_token_id": eos_id, "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        src = Path(tokenizer_dir) / name
        if src.resolve() != (out / name).resolve():
            shutil.copyfile(src, out / name)
    return out
