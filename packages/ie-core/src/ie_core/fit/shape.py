"""A model's shape as `config.json` states it: what `ie fit` prices memory from.

Each fact is read under the names HF configs use for it (Llama's `num_hidden_layers`, GPT-2's
`n_layer`, ...); a fact with no default that the config lacks is refused by name. Multimodal
configs are read through their `text_config`. Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ie_core.errors import UnsupportedModelError
from ie_core.grammar import Width

__all__ = ["ConfigFieldError", "ModelShape", "model_shape"]


class ConfigFieldError(UnsupportedModelError):
    """config.json lacks a field `ie fit` needs; the message names it."""


@dataclass(frozen=True)
class ModelShape:
    architecture: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_mlp: int
    vocab: int
    n_experts: int
    experts_per_token: int
    max_positions: int | None
    sliding_window: int | None
    sliding_layers: int  # layers whose attention sees at most `sliding_window` tokens
    torch_dtype: str  # the checkpoint's declared dtype ("" when the config names none)

    def width(self, width: Width) -> int:
        """Row width of a point of this `Width` (per token; attention maps: heads x keys per
        query, counted by the caller); 0 for a width the config does not give."""
        widths = {
            Width.D: self.d_model,
            Width.H: self.n_heads * self.head_dim,
            Width.KV: self.n_kv_heads * self.head_dim,
            Width.N: self.d_mlp,
            Width.E: self.n_experts,
            Width.K: self.experts_per_token,
            Width.VOCAB: self.vocab,
        }
        return widths.get(width, 0)


_NAMES: Mapping[str, tuple[str, ...]] = {
    "layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "d_model": ("hidden_size", "n_embd", "d_model"),
    "heads": ("num_attention_heads", "n_head", "num_heads"),
    "vocab": ("vocab_size", "padded_vocab_size"),
}


def _first(config: Mapping[str, Any], names: tuple[str, ...]) -> Any:
    for name in names:
        value = config.get(name)
        if value is not None:
            return value
    return None


def _required(config: Mapping[str, Any], fact: str, source: str) -> int:
    names = _NAMES[fact]
    value = _first(config, names)
    if value is None:
        first, *rest = names
        others = f" (nor {', '.join(rest)})" if rest else ""
        raise ConfigFieldError(
            f"{source} has no `{first}`{others}: `ie fit` needs the model's {fact} to price "
            f"its memory; add the field to the config"
        )
    return int(value)


def _kv_heads(config: Mapping[str, Any], heads: int) -> int:
    if config.get("multi_query") and not config.get("new_decoder_architecture"):
        return 1  # Falcon-7B style: one K/V head
    value = _first(config, ("num_key_value_heads", "num_kv_heads", "n_head_kv"))
    return int(value) if value else heads


def _sliding(config: Mapping[str, Any], n_layers: int) -> tuple[int | None, int]:
    """(window, layers under it): `layer_types` says which layers slide; else a window with
    `use_sliding_window` not false applies to every layer (Mistral)."""
    window = config.get("sliding_window")
    if not window:
        return None, 0
    types = config.get("layer_types")
    if isinstance(types, list):
        return int(window), sum(1 for t in types if t == "sliding_attention")
    pattern = config.get("sliding_window_pattern")  # Gemma 3: every pattern-th layer is global
    if pattern:
        return int(window), n_layers - n_layers // int(pattern)
    if _arch(config) == "Gemma2ForCausalLM":  # Gemma 2 alternates, from a sliding layer 0
        return int(window), (n_layers + 1) // 2
    if config.get("use_sliding_window") is False:
        return None, 0
    return int(window), n_layers


def _arch(config: Mapping[str, Any]) -> str:
    return str((config.get("architectures") or [""])[0])


def model_shape(config: Mapping[str, Any], source: str = "config.json") -> ModelShape:
    """The shape of the model `config` (a parsed config.json) describes; `source` names it in
    refusals."""
    text = config.get("text_config") or config
    n_layers = _required(text, "layers", source)
    d_model = _required(text, "d_model", source)
    heads = _required(text, "heads", source)
    vocab = _required(text, "vocab", source)
    head_dim = int(_first(text, ("head_dim",)) or d_model // heads)
    d_mlp = int(_first(text, ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size")) or 0)
    window, sliding_layers = _sliding({**text, "architectures": [_arch(config)]}, n_layers)
    dtype = _first(text, ("torch_dtype", "dtype")) or _first(config, ("torch_dtype", "dtype"))
    return ModelShape(
        architecture=_arch(config),
        n_layers=n_layers,
        d_model=d_model,
        n_heads=heads,
        n_kv_heads=_kv_heads(text, heads),
        head_dim=head_dim,
        d_mlp=d_mlp or 4 * d_model,
        vocab=vocab,
        n_experts=int(_first(text, ("num_local_experts", "num_experts", "n_routed_experts")) or 0),
        experts_per_token=int(_first(text, ("num_experts_per_tok", "moe_topk")) or 0),
        max_positions=_int_or_none(_first(text, ("max_position_embeddings", "n_positions"))),
        sliding_window=window,
        sliding_layers=sliding_layers,
        torch_dtype=str(dtype or ""),
    )


def _int_or_none(value: Any) -> int | None:
    return int(value) if value else None
