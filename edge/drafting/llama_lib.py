"""llama.cpp's library-level glue for the drafter: its log routed away (its error lines
kept, so a failed load can say why), its errors, and its tokenizer."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

from acespec.shared.tokenizer import ModelFileError

_LOG_CALLBACK = None  # keeps the ctypes log callback alive for the process
_GGML_LOG_ERROR = 4  # ggml's GGML_LOG_LEVEL_ERROR
_ERRORS: list[str] = []  # llama.cpp's last error lines, kept while its log is silenced
_RESERVED = re.compile(r"(?:KV|compute) buffer size = +([\d.]+) MiB")
_BUFFERS: list[float] = []  # MiB of the KV and compute buffers llama.cpp reported reserving


class DrafterError(RuntimeError):
    """llama.cpp refused a model file or a decode call."""


class DrafterFileError(DrafterError, ModelFileError):
    """llama.cpp could not load a GGUF: the message names the file and says why, on one
    line (a ModelFileError, so the commands print it and exit 2)."""


def tokenize(ll, vocab, text: str, special: bool) -> list[int]:
    """Token ids of `text` with a llama.cpp vocabulary (no BOS; control tokens parsed only
    when `special`). DrafterError if llama.cpp fails."""
    raw = text.encode("utf-8")
    buf = (ll.llama_token * (len(raw) + 8))()
    n = ll.llama_tokenize(vocab, raw, len(raw), buf, len(buf), False, special)
    if n < 0:
        raise DrafterError(f"tokenization of {len(raw)} bytes failed ({n})")
    return list(buf[:n])


def silence(llama_cpp) -> None:
    """Route llama.cpp's log away from stderr, keeping its last error lines (`_ERRORS`) so a
    failed load can say why."""
    global _LOG_CALLBACK

    def keep_errors(level, text, data):
        if level == _GGML_LOG_ERROR:
            _ERRORS.append(text.decode("utf-8", "replace").strip())
            del _ERRORS[:-8]
        elif m := _RESERVED.search(text.decode("utf-8", "replace")):
            _BUFFERS.append(float(m.group(1)))

    if _LOG_CALLBACK is None:
        _LOG_CALLBACK = llama_cpp.llama_log_callback(keep_errors)
        llama_cpp.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))


def new_context(llama_cpp, model, params) -> tuple[object, float | None]:
    """(llama.cpp's context for `model`, the MiB it reserved for its KV and compute buffers:
    address space whose pages become resident as the context first reaches them; None
    where its log was not silenced here, so not read)."""
    _BUFFERS.clear()
    ctx = llama_cpp.llama_init_from_model(model, params)
    return ctx, (sum(_BUFFERS) if _BUFFERS else None)


def load_model(llama_cpp, path: Path):
    """The llama_model of the GGUF at `path` (default parameters); DrafterFileError saying
    why if llama.cpp refuses it."""
    _ERRORS.clear()
    model = llama_cpp.llama_model_load_from_file(str(path).encode(),
                                                 llama_cpp.llama_model_default_params())
    if not model:
        raise _load_failure(path)
    return model


def _load_failure(path: Path) -> DrafterFileError:
    """Why llama.cpp just refused `path`: its first error line of the load, stripped of the
    function names ('... tensor 'x' data is not within the file bounds, ...')."""
    if path.stat().st_size == 0:
        return DrafterFileError(f"{path}: empty file, not a GGUF model")
    why = re.sub(r"^(?:\w+: |error loading model: )*", "", _ERRORS[0]) if _ERRORS else \
        "not a GGUF model?"
    return DrafterFileError(f"{path}: llama.cpp could not load it ({why})")
