"""The gap drafter's file: a GGUF (converted for torch) or a Hugging Face checkpoint folder,
read with the target's tokenizer; a GGUF that is empty, not a GGUF, cut short or otherwise
unreadable is refused naming the file (checked by its own header, without loading it)."""

from __future__ import annotations

import logging
import math
import struct
import tempfile
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from acespec.cloud.target.loader import load_model
from acespec.cloud.target.model import Transformer
from acespec.models.gguf_to_hf import ConvertError, convert
from acespec.shared.tokenizer import ModelFileError, Tokenizer, first_line

log = logging.getLogger(__name__)


def read(path: Path, dtype: str, device: str) -> tuple[str, Transformer]:
    """(vocab hash, model) of the drafter at `path`: a GGUF (converted in a temporary
    folder) or an HF checkpoint folder."""
    with tempfile.TemporaryDirectory(prefix="acespec-gap-") as tmp:
        folder = path
        if path.is_file():
            log.info("gap drafter: converting %s for torch", path)
            folder = _convert(path, tmp)
        return Tokenizer.load(folder).vocab_hash(), load_model(folder, dtype=dtype,
                                                               device=device)


def _convert(path: Path, out: str) -> Path:
    """The GGUF at `path` as an HF checkpoint folder written into `out`; ModelFileError
    naming the GGUF when it is empty, not a GGUF, cut short or otherwise unreadable."""
    size = _check_magic(path)
    try:
        return convert(path, out)
    except ConvertError as e:  # a GGUF this converter does not cover
        raise ModelFileError(f"{path}: {e}") from None
    except (ValueError, TypeError, KeyError, IndexError) as e:  # the gguf reader's, on a bad file
        try:
            need = gguf_needs(path)
        except EOFError:
            raise ModelFileError(f"{path}: truncated ({size} bytes; its header is cut off)"
                                 ) from None
        except (ValueError, KeyError):
            need = 0
        raise ModelFileError(f"{path}: truncated ({size} bytes of {need})" if need > size else
                             f"{path}: corrupt GGUF ({first_line(e)})") from None


def _check_magic(path: Path) -> int:
    """The file's size; ModelFileError unless it starts as a GGUF does."""
    size = path.stat().st_size
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelFileError(f"{path}: empty file, not a GGUF model" if size == 0 else
                             f"{path}: not a GGUF file (it starts with {magic!r}, not b'GGUF')")
    return size


def check_gguf(path: Path, flag: str) -> None:
    """ModelFileError '<flag> <path>: what is wrong' unless the file is a whole GGUF by its
    own header (reads the header only): for commands that hand the file to a child."""
    try:
        size = _check_magic(path)
        try:
            need = gguf_needs(path)
        except EOFError:
            raise ModelFileError(f"{path}: truncated ({size} bytes; its header is cut off)"
                                 ) from None
        except (ValueError, KeyError) as e:
            raise ModelFileError(f"{path}: corrupt GGUF header ({first_line(e)})") from None
        if need > size:
            raise ModelFileError(f"{path}: truncated ({size} bytes of {need})")
    except ModelFileError as e:
        raise ModelFileError(f"{flag} {e}") from None
    except OSError as e:
        raise ModelFileError(f"{flag} {path}: {e.strerror}") from None


_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # bytes
_STRING, _ARRAY = 8, 9  # GGUF value types (the others are _SCALAR's)


def gguf_needs(path: Path) -> int:
    """The size a whole GGUF has by its own header: where its last tensor's data ends.
    Walks the header only (key-values, tensor infos, alignment). EOFError when the header
    itself is cut off; ValueError or KeyError when it is not a GGUF header."""
    size = path.stat().st_size
    with path.open("rb") as f:
        def take(fmt: str) -> tuple:
            raw = f.read(struct.calcsize("<" + fmt))
            if len(raw) < struct.calcsize("<" + fmt):
                raise EOFError
            return struct.unpack("<" + fmt, raw)

        def skip(n: int) -> None:
            if n > size - f.tell():
                raise EOFError
            f.seek(n, 1)

        def string() -> bytes:
            (n,) = take("Q")
            if n > size - f.tell():
                raise EOFError
            return f.read(n)

        def value(vtype: int) -> None:
            if vtype == _STRING:
                string()
            elif vtype != _ARRAY:
                skip(_SCALAR[vtype])
            else:
                itype, n = take("IQ")
                if itype in _SCALAR:
                    skip(n * _SCALAR[itype])
                else:
                    for _ in range(n):
                        value(itype)

        _, _, n_tensors, n_kv = take("4sIQQ")
        align = 32
        for _ in range(n_kv):
            key, (vtype,) = string(), take("I")
            if key == b"general.alignment" and vtype == 4:  # a uint32
                (align,) = take("I")
            else:
                value(vtype)
        end = 0
        for _ in range(n_tensors):
            string()  # the tensor's name
            (n_dims,) = take("I")
            if n_dims > 8:
                raise ValueError(f"a tensor with {n_dims} dimensions")
            dims = take(f"{n_dims}Q")
            ttype, offset = take("IQ")
            block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
            end = max(end, offset + math.prod(dims) * nbytes // block)
        return -(-f.tell() // align) * align + end
