"""Target-model hyper-parameters, read from a Hugging Face `config.json`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from acespec.shared.tokenizer import ModelFileError, read_json_object

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
ROPE_TYPES = ("default", "linear", "llama3")
_SIZES = {  # ModelArgs field -> its config.json key: integers > 0
    "vocab_size": "vocab_size", "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size", "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim", "max_position_embeddings": "max_position_embeddings"}


class UnsupportedModel(ValueError):
    """The checkpoint uses an architecture or option this implementation does not cover."""


@dataclass(frozen=True)
class ModelArgs:
    arch: str  # "llama" | "qwen2" | "qwen3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict = field(default_factory=dict)  # {} = plain RoPE
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # bias on q/k/v projections (Qwen2 always)
    o_bias: bool = False  # bias on the output projection (Llama attention_bias)
    mlp_bias: bool = False
    qk_norm: bool = False  # per-head RMSNorm on q and k (Qwen3)
    max_position_embeddings: int = 4096

    @classmethod
    def from_hf_config(cls, cfg: dict) -> ModelArgs:
        """Map a Hugging Face config dict onto ModelArgs; refuses what is not supported."""
        archs = cfg.get("architectures") or []
        arch = next((ARCHITECTURES[a] for a in archs if a in ARCHITECTURES), None)
        if arch is None:
            raise UnsupportedModel(
                f"architectures {archs} not supported; expected one of {sorted(ARCHITECTURES)}")
        heads = cfg["num_attention_heads"]
        rope_theta, scaling = _rope(cfg)
        attention_bias = bool(cfg.get("attention_bias", False))
        return cls(
            arch=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_scaling=scaling,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=arch == "qwen2" or attention_bias,
            o_bias=arch == "llama" and attention_bias,
            mlp_bias=arch == "llama" and bool(cfg.get("mlp_bias", False)),
            qk_norm=arch == "qwen3",
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> ModelArgs:
        """ModelArgs of the checkpoint folder `path`; errors name its config.json
        (ModelFileError when the file is malformed, UnsupportedModel when it is not covered)."""
        cfg_path = Path(path) / "config.json"
        if not cfg_path.is_file():
            raise FileNotFoundError(f"no config.json in {path}")
        cfg = read_json_object(cfg_path)
        try:
            args = cls.from_hf_config(cfg)
        except KeyError as e:
            raise ModelFileError(f"{cfg_path}: no {e.args[0]!r} field") from None
        except UnsupportedModel as e:
            raise UnsupportedModel(f"{cfg_path}: {e}") from None
        except (TypeError, ValueError, ZeroDivisionError) as e:  # a field of the wrong type
            raise ModelFileError(f"{cfg_path}: a field has a wrong value ({e})") from None
        for name, key in _SIZES.items():
            if not _positive_int(getattr(args, name)):
                raise ModelFileError(f"{cfg_path}: {key} must be a positive integer, got "
                                     f"{getattr(args, name)!r}")
        return args


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _rope(cfg: dict) -> tuple[float, dict]:
    """(rope_theta, scaling dict) from either the classic or the `rope_parameters` form."""
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", None) or cfg.get("rope_theta") or 10000.0)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise UnsupportedModel(f"rope type {kind!r} not supported; supported: {ROPE_TYPES}")
    return theta, ({} if kind == "default" else {**params, "rope_type": kind})
