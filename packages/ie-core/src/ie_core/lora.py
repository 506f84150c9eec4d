"""LoRA adapters chosen per request: a PEFT LoRA folder (`adapter_config.json` and
`adapter_model.safetensors`) named by a `LoraSpec` in the plan, read once into a `LoraAdapter`,
and checked against the model before any work.

A backend adds `scale * B(A(x))` to each targeted Linear's output for the requests that name the
adapter (eager: per-request forward hooks; hooked vLLM: its own `LoRARequest`), so the model is
left exactly as it was. Only the plain LoRA form is read: no DoRA, no rsLoRA's other scale, no
per-module rank or alpha patterns, no bias, no embedding targets; a folder that asks for one is
refused by name.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "CONFIG",
    "WEIGHTS",
    "LoraAdapter",
    "LoraError",
    "LoraSpec",
    "base_name",
    "load_adapter",
    "lora_from_wire",
]

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
_PREFIX = "base_model.model."
_UNREAD = ("use_dora", "use_rslora", "rank_pattern", "alpha_pattern")


class LoraError(ValueError):
    """An adapter folder that cannot be read, or does not fit the model it was sent to."""


@dataclass(frozen=True)
class LoraSpec:
    """An adapter a request runs under: `name` (one name, one folder, per model) and `path`, a
    PEFT LoRA folder readable where the model runs (a server reads it on its own disk)."""

    name: str
    path: str

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise LoraError("a LoRA adapter needs a non-empty name")
        if not self.path or not isinstance(self.path, str):
            raise LoraError(f"LoRA adapter {self.name!r} needs the path of its PEFT folder")

    def to_wire(self) -> dict[str, str]:
        return {"name": self.name, "path": self.path}


def lora_from_wire(data: Any) -> LoraSpec | None:
    """A plan's `lora` field back: null, or `{"name": ..., "path": ...}`."""
    if data is None:
        return None
    if not isinstance(data, dict) or set(data) != {"name", "path"}:
        raise LoraError("'lora' is null or an object {name, path} (a PEFT LoRA folder)")
    return LoraSpec(str(data["name"]), str(data["path"]))


@dataclass(frozen=True)
class LoraAdapter:
    """A read adapter: per targeted module (its path in the HF model, e.g.
    `model.layers.0.self_attn.q_proj`) the `A [r, in]` and `B [out, r]` weights."""

    spec: LoraSpec
    base_model: str
    rank: int
    alpha: float
    weights: Mapping[str, tuple[Tensor, Tensor]] = field(repr=False)

    @property
    def scale(self) -> float:
        """PEFT's plain LoRA scale, `lora_alpha / r`."""
        return self.alpha / self.rank

    def check(
        self,
        model_name: str,
        linear_shape: Callable[[str], tuple[int, int] | None],
        aliases: Sequence[str] = (),
    ) -> None:
        """Refuse, naming what, an adapter for another base model (its base named neither
        `model_name` nor one of `aliases`, e.g. the folder the name resolved to), a target the
        model lacks or that is not a Linear, or A / B shapes that do not fit it
        (`linear_shape(path)` is the module's `(in, out)` or None)."""
        mine = {base_name(n) for n in (model_name, *aliases) if n}
        theirs = base_name(self.base_model)
        if self.base_model and theirs and theirs not in mine:
            raise LoraError(
                f"LoRA adapter {self.spec.name!r} was trained on {self.base_model!r}, not "
                f"{model_name!r}; use an adapter for this base model"
            )
        for path, (a, b) in self.weights.items():
            shape = linear_shape(path)
            if shape is None:
                raise LoraError(
                    f"LoRA adapter {self.spec.name!r} targets {path!r}, which {model_name!r} "
                    "has not as a Linear module; the adapter is for another architecture"
                )
            want = f"A [{self.rank}, {shape[0]}] and B [{shape[1]}, {self.rank}]"
            if tuple(a.shape) != (self.rank, shape[0]) or tuple(b.shape) != (shape[1], self.rank):
                raise LoraError(
                    f"LoRA adapter {self.spec.name!r} at {path!r}: A {list(a.shape)} and B "
                    f"{list(b.shape)} do not fit r={self.rank} on this model's Linear (want "
                    f"{want}); the adapter is for another base model or its rank is wrong"
                )


def base_name(name: str) -> str:
    """A model's last name part, the same for a Hub id and its local folders
    (`org/Model`, `/cache/models/org--Model` -> `model`)."""
    return name.rstrip("/").replace("--", "/").rsplit("/", 1)[-1].lower()


def load_adapter(spec: LoraSpec) -> LoraAdapter:
    """Read `spec`'s PEFT folder: its config, then A and B for every targeted module."""
    from safetensors.torch import load_file

    folder = Path(spec.path)
    if not (folder / CONFIG).is_file() or not (folder / WEIGHTS).is_file():
        raise LoraError(
            f"LoRA adapter {spec.name!r}: {folder} is not a PEFT LoRA folder (it needs {CONFIG} "
            f"and {WEIGHTS})"
        )
    config = json.loads((folder / CONFIG).read_text())
    rank, alpha = _rank_alpha(spec, config)
    tensors = load_file(str(folder / WEIGHTS))
    weights: dict[str, tuple[Tensor, Tensor]] = {}
    for key in sorted(tensors):
        if not key.endswith(".lora_A.weight"):
            if not key.endswith(".lora_B.weight"):
                raise LoraError(f"LoRA adapter {spec.name!r} holds {key!r}, not a LoRA A or B")
            continue
        path = key.removesuffix(".lora_A.weight")
        b = tensors.get(f"{path}.lora_B.weight")
        if b is None:
            raise LoraError(f"LoRA adapter {spec.name!r} has A but no B for {path!r}")
        weights[path.removeprefix(_PREFIX)] = (tensors[key].float(), b.float())
    if not weights:
        raise LoraError(f"LoRA adapter {spec.name!r} holds no LoRA weights")
    base = str(config.get("base_model_name_or_path") or "")
    return LoraAdapter(spec, base, rank, alpha, weights)


def _rank_alpha(spec: LoraSpec, config: Any) -> tuple[int, float]:
    if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA":
        raise LoraError(f"LoRA adapter {spec.name!r}: {CONFIG} is not a LORA peft_type")
    asked = [k for k in _UNREAD if config.get(k)]
    if asked or config.get("bias", "none") != "none" or config.get("fan_in_fan_out"):
        raise LoraError(
            f"LoRA adapter {spec.name!r} asks for {asked or ['bias or fan_in_fan_out']}, which "
            "this engine does not apply; merge the adapter into the weights and load that model"
        )
    rank, alpha = config.get("r"), config.get("lora_alpha", config.get("r"))
    if not isinstance(rank, int) or rank < 1 or not isinstance(alpha, int | float):
        raise LoraError(f"LoRA adapter {spec.name!r}: {CONFIG} needs a positive int r")
    return rank, float(alpha)
