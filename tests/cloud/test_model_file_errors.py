"""The loaders' checks of model files, in process: what each kind of damage is called
(ModelFileError, naming the file), and that whole files pass. The commands' one-line errors
on the same damage: tests/e2e/test_corrupt_model_files.py."""

from __future__ import annotations

import json
import os
import shutil

import pytest

pytest.importorskip("torch")

from acespec.cloud.target.config import ModelArgs, UnsupportedModel  # noqa: E402
from acespec.cloud.target.loader import check_safetensors, load_model  # noqa: E402
from acespec.cloud.verify.gap_file import gguf_needs  # noqa: E402
from acespec.shared.tokenizer import ModelFileError, Tokenizer  # noqa: E402


@pytest.fixture
def target(tiny_hf_dir, tmp_path):
    """A copy of the tiny target folder to damage."""
    return shutil.copytree(tiny_hf_dir, tmp_path / "target")


def _edit_config(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    for key in [k for k, v in changes.items() if v is None]:
        del cfg[key]
    (folder / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("changes, words", [
    ({"num_attention_heads": None}, "no 'num_attention_heads' field"),
    ({"num_attention_heads": 0}, "num_attention_heads must be a positive integer, got 0"),
    ({"hidden_size": "64"}, "hidden_size must be a positive integer, got '64'"),
    ({"rope_theta": "fast"}, "a field has a wrong value"),
    ({"num_hidden_layers": -2}, "num_hidden_layers must be a positive integer, got -2"),
    ({"vocab_size": 1.5}, "vocab_size must be a positive integer, got 1.5"),
])
def test_bad_config_fields_name_the_file(target, changes, words):
    _edit_config(target, **changes)
    with pytest.raises(ModelFileError, match=words) as e:
        ModelArgs.from_dir(target)
    assert str(e.value).startswith(f"{target / 'config.json'}: ")


def test_config_that_is_not_json_or_not_supported(target):
    (target / "config.json").write_bytes(b"\xff\xfe not json")
    with pytest.raises(ModelFileError, match="config.json: not valid JSON"):
        ModelArgs.from_dir(target)
    (target / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(UnsupportedModel, match=r"config.json: architectures \['GPT2"):
        ModelArgs.from_dir(target)


def test_whole_safetensors_pass_and_cut_ones_are_truncated(target):
    weights = target / "model.safetensors"
    check_safetensors(weights)
    size = weights.stat().st_size
    for keep, words in ((size - 1, f"truncated ({size - 1} bytes of {size}"),
                        (100, "truncated or not safetensors (100 bytes"),
                        (7, "truncated (7 bytes")):
        os.truncate(weights, keep)
        with pytest.raises(ModelFileError, match=f"^{weights}: " + words.replace("(", r"\(")):
            load_model(target)


def test_a_header_that_is_not_a_tensor_table(target):
    weights = target / "model.safetensors"
    header = b'{"w": [1, 2]}'
    weights.write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(ModelFileError, match="not safetensors"):
        check_safetensors(weights)


def test_a_bad_shard_index_names_the_index(target):
    os.remove(target / "model.safetensors")
    (target / "model.safetensors.index.json").write_text('{"weight_map": 3}')
    with pytest.raises(ModelFileError, match="index.json: no 'weight_map'"):
        load_model(target)


def test_bad_tokenizer_files_name_the_file(target):
    (target / "tokenizer_config.json").write_text('"eos"')
    with pytest.raises(ModelFileError, match="tokenizer_config.json: holds a string"):
        Tokenizer.load(target)
    (target / "tokenizer.json").write_text("[]")
    with pytest.raises(ModelFileError, match="tokenizer.json: not a tokenizer.json"):
        Tokenizer.load(target)


def test_gguf_size_by_its_header(tiny_pair, tmp_path):
    """A whole GGUF of each type is exactly the size its header says; a cut one is not."""
    for gguf in tiny_pair[2].values():
        assert gguf_needs(gguf) == gguf.stat().st_size
    gguf = tiny_pair[2]["q8_0"]
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(gguf.read_bytes()[:gguf.stat().st_size - 10])
    assert gguf_needs(cut) == gguf.stat().st_size
    cut.write_bytes(gguf.read_bytes()[:100])
    with pytest.raises(EOFError):
        gguf_needs(cut)


def test_a_refused_gguf_is_both_a_drafter_and_a_model_file_error(tmp_path):
    pytest.importorskip("llama_cpp")
    from acespec.edge.drafting.llama import DrafterError, LlamaDrafter

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 40)
    with pytest.raises(DrafterError) as e:
        LlamaDrafter(bad)
    assert isinstance(e.value, ModelFileError)
    assert str(e.value).startswith(f"{bad}: llama.cpp could not load it (")
