"""Shared fixtures: tiny random Hugging Face checkpoints of each supported family."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

TINY = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


def tiny_hf_config(family: str):
    """A random-init-sized config of one family, with the options that family exercises."""
    import transformers as tf

    if family == "llama":
        return tf.LlamaConfig(**TINY, rope_theta=50000.0, tie_word_embeddings=False,
                              rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                            "original_max_position_embeddings": 16})
    if family == "qwen2":
        return tf.Qwen2Config(**TINY, rope_theta=1e6, tie_word_embeddings=True)
    if family == "qwen3":
        return tf.Qwen3Config(**{**TINY, "num_key_value_heads": 1}, head_dim=24,
                              rope_theta=1e6, tie_word_embeddings=False)
    raise ValueError(family)


def save_tiny_hf(family: str, path, seed: int = 0):
    """Write a random tiny checkpoint of `family` to `path`; return the HF model (fp32)."""
    import transformers as tf

    torch.manual_seed(seed)
    cfg = tiny_hf_config(family)
    cfg._attn_implementation = "eager"
    model = tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    with torch.no_grad():  # random norms and biases, so those code paths matter in the diff
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
    model.save_pretrained(path)
    return model


@pytest.fixture(scope="session", params=["llama", "qwen2", "qwen3"])
def hf_pair(request, tmp_path_factory):
    """(family, HF model, checkpoint dir) for each supported family."""
    path = tmp_path_factory.mktemp(f"hf-{request.param}")
    model = save_tiny_hf(request.param, path)
    return request.param, model, path
