"""Train a byte-level BPE tokenizer with the `tokenizers` library."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

BOS, EOS = "<|bos|>", "<|eos|>"
SPECIALS = [BOS, EOS]


def train_bpe(texts: Iterable[str], vocab_size: int) -> object:
    """A byte-level BPE over `texts` with BOS/EOS as ids 0 and 1. Returns tokenizers.Tokenizer."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def save_tokenizer(tok, out_dir: str | Path, model_max_length: int = 2048) -> None:
    """Write tokenizer.json and a tokenizer_config.json naming BOS/EOS."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS,
           "add_bos_token": True, "model_max_length": model_max_length,
           "clean_up_tokenization_spaces": False}
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def bpe_merges(tokenizer_json: str | Path) -> list[str]:
    """The BPE merges of a tokenizer.json as 'a b' strings (GGUF's form)."""
    merges = json.loads(Path(tokenizer_json).read_text())["model"]["merges"]
    return [m if isinstance(m, str) else " ".join(m) for m in merges]
