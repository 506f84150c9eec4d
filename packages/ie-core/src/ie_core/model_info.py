"""`ModelInfo`: what a loaded model says about itself, one typed record on every process boundary.

A vLLM worker builds it from its point table, the host reads it, `ie serve` sends it as
`GET /v1/ie/info` and the remote client reads it back; each side checks it with `from_wire`
instead of reading keys out of a dict.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ie_core.errors import InterpError
from ie_core.grammar import to_address

__all__ = ["DescribedModel", "ModelInfo", "ModelInfoError", "StageInfo"]


class ModelInfoError(InterpError, ValueError):
    """A model description that is missing a field or holds one of the wrong type."""


@dataclass(frozen=True)
class StageInfo:
    """One pipeline stage: its rank and the `[first, stop)` decoder layers it runs (None: none)."""

    rank: int
    layers: tuple[int, int] | None


@dataclass(frozen=True)
class ModelInfo:
    """Shape, served addresses (with widths), writable addresses and refusals of one model."""

    n_layers: int
    d_model: int
    widths: Mapping[str, int] = field(default_factory=dict)  # served address -> row width
    writable: tuple[str, ...] = ()
    refused: Mapping[str, str] = field(default_factory=dict)  # address or point name -> reason
    architecture: str = ""
    vocab_size: int = 0  # 0 when the config does not say; the tokenizer's length is used then
    attn_heads: Mapping[int, int] = field(default_factory=dict)  # layer -> query heads
    tp_size: int = 1
    pp_size: int = 1
    model_id: str = ""  # filled by the server; a worker does not know the name it was loaded by
    backend: str = ""
    points: tuple[str, ...] = ()  # served point names in forward order (set by the server)
    stages: tuple[StageInfo, ...] = ()  # pipeline stages in rank order (empty without PP)
    model_runner: str = ""  # the vLLM model runner class the workers run on (empty on eager)
    bos_token_id: int | None = None  # the tokenizer's BOS (set by the server; None: it has none)

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> ModelInfo:
        """Parse a worker's or server's description; raises ModelInfoError naming the field."""
        if not isinstance(data, Mapping):
            raise ModelInfoError(f"a model description is a JSON object, got {type(data).__name__}")
        return cls(
            n_layers=_int(data, "n_layers", required=True),
            d_model=_int(data, "d_model", required=True),
            widths={str(a): int(w) for a, w in _mapping(data, "widths").items()},
            writable=tuple(str(a) for a in _list(data, "writable")),
            refused={str(k): str(v) for k, v in _mapping(data, "refused").items()},
            architecture=str(data.get("architecture") or ""),
            vocab_size=_int(data, "vocab_size"),
            attn_heads={int(k): int(v) for k, v in _mapping(data, "attn_heads").items()},
            tp_size=_int(data, "tp_size", 1),
            pp_size=_int(data, "pp_size", 1),
            model_id=str(data.get("model_id") or ""),
            backend=str(data.get("backend") or ""),
            points=tuple(str(p) for p in _list(data, "points")),
            stages=tuple(_stage(s) for s in _list(data, "stages") if s),
            model_runner=str(data.get("model_runner") or ""),
            bos_token_id=_int(data, "bos_token_id")
            if data.get("bos_token_id") is not None
            else None,
        )

    def to_wire(self) -> dict[str, Any]:
        """Plain JSON data (layer keys of `attn_heads` become strings, as JSON keys are)."""
        out = asdict(self)
        out["widths"] = dict(self.widths)
        out["refused"] = dict(self.refused)
        out["attn_heads"] = {str(k): v for k, v in self.attn_heads.items()}
        out["writable"] = list(self.writable)
        out["points"] = list(self.points)
        out["stages"] = [{"rank": s.rank, "layers": s.layers} for s in self.stages]
        return out

    def __repr__(self) -> str:
        """One short line: the shape and counts (the full tables are `widths`, `refused`, ...)."""
        return (
            f"ModelInfo(model_id={self.model_id!r}, backend={self.backend!r}, "
            f"architecture={self.architecture!r}, n_layers={self.n_layers}, "
            f"d_model={self.d_model}, vocab_size={self.vocab_size}, points={len(self.points)}, "
            f"addresses={len(self.widths)}, writable={len(self.writable)}, "
            f"refused={len(self.refused)}, tp_size={self.tp_size}, pp_size={self.pp_size})"
        )

    def with_fields(self, **changes: Any) -> ModelInfo:
        """A copy with some fields replaced (the server adds its name, backend and points)."""
        return replace(self, **changes)

    def widths_of(self, points: set[str]) -> dict[str, int]:
        """The widths of the addresses whose point is in `points`."""
        return {a: w for a, w in self.widths.items() if to_address(a).name in points}

    def refusal(self, address: str) -> str | None:
        """The reason `address` is refused (its own, else its point's), or None."""
        return self.refused.get(address) or self.refused.get(to_address(address).name)


class DescribedModel:
    """The shape of a model that carries its `ModelInfo` as `self.info` (vLLM's, a remote one)."""

    info: ModelInfo

    @property
    def n_layers(self) -> int:
        return self.info.n_layers

    @property
    def d_model(self) -> int:
        return self.info.d_model

    @property
    def architecture(self) -> str:
        return self.info.architecture


def _int(data: Mapping[str, Any], key: str, default: int = 0, *, required: bool = False) -> int:
    value = data.get(key)
    if value is None:
        if required:
            raise ModelInfoError(f"the model description has no {key!r}")
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelInfoError(f"{key} must be an integer, got {type(value).__name__} {value!r}")
    return value


def _stage(data: Any) -> StageInfo:
    if not isinstance(data, Mapping) or "rank" not in data:
        raise ModelInfoError(f"a pipeline stage is an object with a rank, got {data!r}")
    layers = data.get("layers")
    return StageInfo(int(data["rank"]), (int(layers[0]), int(layers[1])) if layers else None)


def _mapping(data: Mapping[str, Any], key: str) -> Mapping[Any, Any]:
    value = data.get(key) or {}
    if not isinstance(value, Mapping):
        raise ModelInfoError(f"{key} must be an object, got {type(value).__name__}")
    return value


def _list(data: Mapping[str, Any], key: str) -> list[Any]:
    value = data.get(key) or []
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
        raise ModelInfoError(f"{key} must be a list, got {type(value).__name__}")
    return list(value)
