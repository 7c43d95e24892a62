"""Load a Hugging Face checkpoint directory into `Transformer`."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors import SafetensorError

from acespec.cloud.target.config import ModelArgs
from acespec.cloud.target.model import Transformer
from acespec.cloud.target.sharding import read_shard, shard_args
from acespec.shared.tokenizer import ModelFileError, Tokenizer, first_line, read_json_object

log = logging.getLogger(__name__)
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def checkpoint_files(path: Path) -> list[Path]:
    """The safetensors files of a checkpoint: single file or sharded with an index."""
    single = path / "model.safetensors"
    if single.is_file():
        return [single]
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json_object(index).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(f, str)
                                                       for f in weight_map.values()):
            raise ModelFileError(f"{index}: no 'weight_map' of tensor names to file names")
        return [path / s for s in sorted(set(weight_map.values()))]
    raise FileNotFoundError(f"{path}: neither model.safetensors nor model.safetensors.index.json")


def check_safetensors(file: Path) -> None:
    """ModelFileError naming `file` unless it is a whole safetensors file: an 8-byte header
    length, a JSON header, and every tensor's bytes (data_offsets) inside the file. Reads the
    header only, so a checkpoint cut short fails here, before any weight is read."""
    size = file.stat().st_size
    with file.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ModelFileError(f"{file}: truncated ({size} bytes; safetensors starts with "
                                 "an 8-byte header length)")
        n = int.from_bytes(head, "little")
        if 8 + n > size:
            raise ModelFileError(f"{file}: truncated or not safetensors ({size} bytes; its "
                                 f"header length says {n})")
        raw = f.read(n)
    try:
        header = json.loads(raw)
        ends = [int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        raise ModelFileError(f"{file}: not safetensors (its header is not a table of "
                             "tensors)") from None
    need = 8 + n + max(ends, default=0)
    if need > size:
        raise ModelFileError(f"{file}: truncated ({size} bytes of {need}: the tensors run "
                             "past its end)")


def check_checkpoint(path: str | Path) -> None:
    """ModelFileError (or FileNotFoundError) naming the file unless `path` is a checkpoint
    folder whose config.json, safetensors headers and tokenizer.json read: what a command
    that hands the folder to a child process checks first, so a bad file is its one-line
    error and not the child's. Reads no weights."""
    path = Path(path)
    ModelArgs.from_dir(path)
    for f in checkpoint_files(path):
        check_safetensors(f)
    Tokenizer.load(path)


def load_model(path: str | Path, dtype: str | torch.dtype = "float32",
               device: str | torch.device = "cpu", rank: int = 0, world: int = 1
               ) -> Transformer:
    """Build the model described by `path/config.json` and load its safetensors weights;
    with world > 1, only tensor-parallel rank `rank`'s shard (acespec.cloud.target.sharding)."""
    path = Path(path)
    full = ModelArgs.from_dir(path)
    args = shard_args(full, world)
    dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    with torch.device("meta"):
        model = Transformer(args)
    expected = {k for k in model.state_dict() if not (args.tie_word_embeddings and k == "lm_head.weight")}
    files = checkpoint_files(path)
    for f in files:
        check_safetensors(f)
    try:
        state, names = read_shard(files, expected | {"lm_head.weight"}, rank, world, str(device))
    except SafetensorError as e:  # what the header check cannot see (e.g. an unknown dtype)
        raise ModelFileError(f"{files[0] if len(files) == 1 else path}: unreadable "
                             f"safetensors ({first_line(e)})") from None
    state = {k: v.to(dtype) for k, v in state.items()}
    if args.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    missing = expected - state.keys()
    unexpected = names - expected - {"lm_head.weight"} - {
        k for k in names if k.endswith("rotary_emb.inv_freq")}
    if missing or unexpected:
        raise ValueError(f"{path}: checkpoint does not match the config: "
                         f"missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}")
    model.load_state_dict(state, strict=False, assign=True)
    if args.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    shard = f", tensor-parallel rank {rank} of {world}" if world > 1 else ""
    log.info("loaded %s (%s, %d layers, %.1fM params%s, %s) from %s", args.arch, dtype,
             args.num_layers, sum(p.numel() for p in model.parameters()) / 1e6, shard, device,
             path)
    return model.eval()


def set_threads(model, threads: int = 0, share: int = 1) -> None:
    """Small models run fastest on one CPU thread; more threads only add synchronisation,
    which turns into long, erratic stalls when another process keeps a core busy, while one
    thread keeps the step time steady. share: processes on this machine dividing its cores
    (tensor-parallel ranks)."""
    if model.device.type != "cpu":
        return
    if threads <= 0:
        small = sum(p.numel() for p in model.parameters()) < 50_000_000
        threads = 1 if small else max(1, torch.get_num_threads() // share)
    torch.set_num_threads(threads)
    log.info("target runs on %d CPU thread(s)", threads)
