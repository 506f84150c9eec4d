"""The Jacobian lens: a layer's residual carried to the final layer by the average Jacobian
J_L = E[d resid_final / d resid_L] (same position, over a prompt set), then decoded with the model's
own final norm and unembed. `resid_final` is `resid_post` of the last layer, the residual right
before the final norm. The matrices are computed on eager (`ie_eager.jacobian.jacobian_lens`);
applying them is backend-free: `rows @ J_L.T`, then each backend's logit lens (on vLLM the top-k
runs in the worker). Imports torch (ie_core does not import this module at load)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ie_core.errors import LayerOutOfRangeError, UnsupportedModelError
from ie_core.protocol import TopK
from ie_core.runner import run
from ie_core.sync import unwrap

__all__ = ["JacobianLens", "ajacobian_lens_topk", "jacobian_lens_topk"]

_FORMAT = "ie-jacobian-lens/1"


@dataclass(frozen=True)
class JacobianLens:
    """`matrices[L]` is J_L, `[d_model, d_model]` fp32: row i holds d resid_final[i] / d resid_L."""

    model_id: str
    n_layers: int
    d_model: int
    matrices: Mapping[int, torch.Tensor]
    n_rows: int  # token rows the average ran over

    def __post_init__(self) -> None:
        for layer, m in self.matrices.items():
            if not 0 <= layer < self.n_layers:
                raise LayerOutOfRangeError(
                    f"layer {layer} is out of range for a {self.n_layers}-layer model", str(layer)
                )
            if tuple(m.shape) != (self.d_model, self.d_model):
                raise ValueError(
                    f"J_{layer} has shape {tuple(m.shape)}, expected "
                    f"({self.d_model}, {self.d_model})"
                )

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(sorted(self.matrices))

    def matrix(self, layer: int) -> torch.Tensor:
        """J_layer, or a named error when the lens was not computed there."""
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise TypeError(f"layer must be an int, got {type(layer).__name__} {layer!r}")
        if layer not in self.matrices:
            raise LayerOutOfRangeError(
                f"this Jacobian lens holds layers {list(self.layers)}, not {layer}; compute it "
                "for that layer (jacobian_lens(model, prompts, layers=[...]))",
                f"resid_post.{layer}",
            )
        return self.matrices[layer]

    def transport(self, rows: Any, layer: int) -> torch.Tensor:
        """`[..., d_model]` residuals of `layer` -> their fp32 image `rows @ J_layer.T`."""
        m = self.matrix(layer)
        t = torch.as_tensor(rows)
        if t.ndim == 0 or t.shape[-1] != self.d_model:
            raise ValueError(
                f"rows must be [..., d_model={self.d_model}], got shape {tuple(t.shape)}"
            )
        return t.detach().float().cpu() @ m.T

    # --- persistence (safetensors: one tensor per layer, facts in the header) ------------------

    def save(self, path: str | Path) -> None:
        from safetensors.torch import save_file

        tensors = {f"J.{layer}": m.contiguous() for layer, m in self.matrices.items()}
        meta = {"model_id": self.model_id, "n_layers": self.n_layers, "d_model": self.d_model}
        meta |= {"n_rows": self.n_rows}
        save_file(tensors, str(path), metadata={"format": _FORMAT, "facts": json.dumps(meta)})

    @classmethod
    def load(cls, path: str | Path) -> JacobianLens:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
            if header.get("format") != _FORMAT:
                raise ValueError(f"{path} is not a Jacobian lens file ({_FORMAT})")
            facts = json.loads(header["facts"])
            matrices = {int(k.split(".")[1]): f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
        return cls(
            facts["model_id"],
            int(facts["n_layers"]),
            int(facts["d_model"]),
            matrices,
            int(facts["n_rows"]),
        )

    def check_model(self, model: Any) -> None:
        """Refuse a model whose shape differs from the one the lens was computed on."""
        if (int(model.n_layers), int(model.d_model)) != (self.n_layers, self.d_model):
            raise UnsupportedModelError(
                f"this Jacobian lens was computed on {self.model_id} ({self.n_layers} layers, "
                f"d_model {self.d_model}); the model has {model.n_layers} layers, d_model "
                f"{model.d_model}"
            )


async def ajacobian_lens_topk(
    model: Any, lens: JacobianLens, rows: Any, layer: int, k: int = 10
) -> TopK:
    model = unwrap(model)
    lens.check_model(model)
    return await model.decode_residuals_topk(lens.transport(rows, layer), k)


def jacobian_lens_topk(model: Any, lens: JacobianLens, rows: Any, layer: int, k: int = 10) -> TopK:
    """Top-k of the final norm + unembed of `rows @ J_layer.T`, on the model's own backend."""
    return run(ajacobian_lens_topk(model, lens, rows, layer, k))
