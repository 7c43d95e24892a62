"""The torch target model against `transformers` on tiny random checkpoints of each family.

Tolerance: fp32 logits within 2e-4 absolute (observed ~1e-6; the slack covers a
different summation order in attention and RoPE).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from acespec.cloud.target.config import ModelArgs, UnsupportedModel  # noqa: E402
from acespec.cloud.target.kv_cache import ROOT, TreeError  # noqa: E402
from acespec.cloud.target.loader import load_model  # noqa: E402

ATOL = 2e-4
SEQ = [5, 17, 3, 88, 42, 42, 7, 1, 60, 33, 21, 9, 70, 2, 11, 64, 50, 13]


def hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def test_prefill_matches_transformers(hf_pair):
    family, hf, path = hf_pair
    ours = load_model(path)
    cache = ours.new_cache(capacity=4)  # forces the cache to grow
    diff = (ours(SEQ, cache) - hf_logits(hf, SEQ)).abs().max().item()
    print(f"{family} prefill max|diff| = {diff:.2e}")
    assert diff < ATOL


def test_incremental_decode_matches_prefill(hf_pair):
    family, hf, path = hf_pair
    ours = load_model(path)
    ref = hf_logits(hf, SEQ)
    cache = ours.new_cache()
    ours(SEQ[:7], cache)
    rows = [ours(SEQ[i:i + 1], cache)[0] for i in range(7, len(SEQ))]
    diff = (torch.stack(rows) - ref[7:]).abs().max().item()
    print(f"{family} decode max|diff| = {diff:.2e}")
    assert diff < ATOL


def _tree():
    """A tree under a 5-token prefix: (tokens, parents as offsets into the new nodes, -1 =
    the prefix's last slot). Deep chain, wide fan-out, and branches off branches."""
    tokens = [10, 20, 30, 40, 11, 21, 31, 12, 22, 13, 50, 51]
    parents = [-1, 0, 1, 2, -1, 4, 5, 0, 7, 0, 3, 3]
    return tokens, parents


def _scored_tree(path):
    """The model at `path` after the 5-token prefix and then the tree of _tree() in one
    pass: (model, cache, prefix, tokens, relative parents, the tree's logits)."""
    ours = load_model(path)
    prefix = SEQ[:5]
    tokens, rel = _tree()
    cache = ours.new_cache()
    ours(prefix, cache)
    tree_logits = ours(tokens, cache, [4 if p < 0 else 5 + p for p in rel])
    return ours, cache, prefix, tokens, rel, tree_logits


def test_tree_paths_match_plain_sequences(hf_pair):
    family, hf, path = hf_pair
    _, _, prefix, tokens, rel, tree_logits = _scored_tree(path)
    worst = 0.0
    for i in range(len(tokens)):
        path_tokens, j = [], i
        while j >= 0:
            path_tokens.insert(0, tokens[j])
            j = rel[j]
        ref = hf_logits(hf, prefix + path_tokens)[-1]
        worst = max(worst, (tree_logits[i] - ref).abs().max().item())
    print(f"{family} tree max|diff| = {worst:.2e}")
    assert worst < ATOL


def test_commit_reroots_and_keeps_scoring(hf_pair):
    family, hf, path = hf_pair
    ours, cache, prefix, _, _, _ = _scored_tree(path)
    # Commit node 8 (tokens 10 -> 12 -> 22) and keep its subtree: nothing below, so a path.
    kept = cache.path_to(5 + 8)
    cache.retain(kept)
    assert cache.length == 8 and cache.n_linear == 8
    out = ours([90, 91], cache)
    ref = hf_logits(hf, prefix + [10, 12, 22, 90, 91])[-2:]
    assert (out - ref).abs().max().item() < ATOL


def test_retain_keeps_subtree_below_commit(hf_pair):
    _, hf, path = hf_pair
    ours = load_model(path)
    cache = ours.new_cache()
    ours(SEQ[:3], cache)
    # Two children of slot 2 (slots 3, 4), then a child of slot 3 (slot 5).
    ours([7, 8, 9], cache, [2, 2, 3])
    remap = cache.retain([0, 1, 2, 3, 5])  # commit slot 3, keep its child
    assert remap == [0, 1, 2, 3, -1, 4]
    out = ours([6], cache, [4])[0]
    ref = hf_logits(hf, SEQ[:3] + [7, 9, 6])[-1]
    assert (out - ref).abs().max().item() < ATOL


def test_batched_requests_equal_separate(hf_pair):
    from acespec.cloud.target.model import Request

    _, _, path = hf_pair
    ours = load_model(path)
    a, b = ours.new_cache(), ours.new_cache()
    ours(SEQ[:6], a)
    ours(SEQ[3:12], b)
    a2, b2 = ours.new_cache(), ours.new_cache()
    ours(SEQ[:6], a2)
    ours(SEQ[3:12], b2)
    batched = ours.forward_batch([Request([1, 2, 3], a, [5, 6, 6]), Request([4], b)])
    apart = [ours([1, 2, 3], a2, [5, 6, 6]), ours([4], b2)]
    for x, y in zip(batched, apart):
        assert (x - y).abs().max().item() < 1e-5


def test_bad_parent_is_refused_and_cache_unchanged(hf_pair):
    _, _, path = hf_pair
    ours = load_model(path)
    cache = ours.new_cache()
    ours(SEQ[:4], cache)
    with pytest.raises(TreeError, match="parent 9"):
        ours([1, 2], cache, [3, 9])
    assert cache.length == 4
    with pytest.raises(TreeError, match="kept but its parent"):
        cache.retain([0, 2, 3])
    ours([1], cache, [ROOT + 4])  # parent slot 3 still works


def test_bf16_close_to_fp32(hf_pair):
    family, hf, path = hf_pair
    ours = load_model(path, dtype="bfloat16")
    diff = (ours(SEQ, ours.new_cache()) - hf_logits(hf, SEQ)).abs().max().item()
    print(f"{family} bf16 max|diff| = {diff:.2e}")
    assert diff < 0.1  # bf16 has ~3 significant digits; logits here are O(1)


def test_unsupported_architecture_is_named():
    with pytest.raises(UnsupportedModel, match="GPT2LMHeadModel"):
        ModelArgs.from_hf_config({"architectures": ["GPT2LMHeadModel"]})
    with pytest.raises(UnsupportedModel, match="yarn"):
        ModelArgs.from_hf_config({"architectures": ["LlamaForCausalLM"], "num_attention_heads": 4,
                                  "rope_scaling": {"rope_type": "yarn", "factor": 2.0}})


def test_classic_llama31_config_form():
    """Published Llama 3.1 configs carry rope_theta and rope_scaling at the top level."""
    args = ModelArgs.from_hf_config({
        "architectures": ["LlamaForCausalLM"], "vocab_size": 128256, "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"}})
    assert (args.rope_theta, args.head_dim, args.num_kv_heads) == (500000.0, 128, 8)
    assert args.rope_scaling["rope_type"] == "llama3" and not args.qkv_bias


def test_sharded_checkpoint_loads(tmp_path):
    from conftest import save_tiny_hf

    hf = save_tiny_hf("qwen2", tmp_path / "src")
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    ours = load_model(tmp_path / "sharded")
    assert (ours(SEQ, ours.new_cache()) - hf_logits(hf, SEQ)).abs().max().item() < ATOL


def test_training_path_equals_inference_path(hf_pair):
    _, hf, path = hf_pair
    ours = load_model(path)
    ids = torch.tensor([SEQ, SEQ[::-1]])
    batch = ours.causal_logits(ids)
    assert (batch[0] - hf_logits(hf, SEQ)).abs().max().item() < ATOL
    assert (batch[1] - hf_logits(hf, SEQ[::-1])).abs().max().item() < ATOL
