"""Linear probes on any backend: `probe_scores` gives `activation(h @ weight + bias)` per token.

`Probe` holds the checked probe and its maths; the reducer `ie_core.reduce.probe.ProbeScores`
runs it where the rows live (`ModelFront.probe_scores`: in the vLLM workers, eager's forward, or
`ie serve`'s workers), so only the scores travel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ie_core.active_steering import with_active
from ie_core.errors import SteeringSpecError
from ie_core.grammar import AddressLike
from ie_core.ops.conditional import ACTIVATIONS, activate
from ie_core.ops.values import as_row, real_number
from ie_core.ops.vectors import cached, on_device, without_cache
from ie_core.protocol import Prompt, SteeringArg
from ie_core.runner import run
from ie_core.sync import ModelLike, unwrap

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Probe:
    """`weight` is `[width][n]` and `bias` `[n]`; `vector` a probe given as a `[width]` vector
    (its scores have no trailing `n`). Build it with `Probe.build`, which checks everything."""

    weight: tuple[tuple[float, ...], ...]
    bias: tuple[float, ...]
    activation: str = "linear"
    vector: bool = False

    @classmethod
    def build(
        cls, weight: Any, bias: Any = 0.0, activation: str = "linear", *, width: int, point: str
    ) -> Probe:
        """A probe for rows of `point` (`width` wide); refused with the reason before any forward:
        a shape that is not a vector or matrix, another width, a non-finite value, a bias of the
        wrong length, an unknown activation."""
        w = _numbers(weight, "weight")
        if w.ndim not in (1, 2) or w.numel() == 0:
            raise SteeringSpecError(
                f"a probe is a [width] vector or [width, n] matrix, got {tuple(w.shape)}"
            )
        if w.shape[0] != width:
            raise SteeringSpecError(
                f"the probe is {w.shape[0]} wide but {point} is {width} wide on this model; fit "
                "the probe on this point's rows"
            )
        if activation not in ACTIVATIONS:
            raise SteeringSpecError(
                f"activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}"
            )
        vector = w.ndim == 1
        columns = [as_row(c, "probe") for c in (w[None] if vector else w.T)]
        n = len(columns)
        bt = _numbers(bias, "bias")
        if vector and bt.ndim != 0:
            raise SteeringSpecError(f"a vector probe takes one bias, got {tuple(bt.shape)}")
        b = tuple(real_number(x, "bias") for x in (bt.expand(n) if bt.ndim == 0 else bt).tolist())
        if len(b) != n:
            raise SteeringSpecError(f"the bias has {len(b)} entries for a probe of {n} outputs")
        rows = tuple(tuple(r) for r in zip(*columns, strict=True))
        return cls(rows, b, activation, vector)

    def scores(self, rows: torch.Tensor) -> torch.Tensor:
        """activation(rows @ weight + bias) in fp32, on the rows' device: `rows.shape[:-1]` for a
        vector, `(*rows.shape[:-1], n)` for a matrix."""
        x = rows.float()  # fp32: the weight and bias are built like it, once per probe and device
        w = cached(self, "weight", x, lambda: on_device(self.weight, x))
        b = cached(self, "bias", x, lambda: on_device(self.bias, x))
        return activate(x @ w[:, 0] + b[0] if self.vector else x @ w + b, self.activation)

    def __getstate__(self) -> dict[str, Any]:
        """The probe's fields, without the device tensors it keeps (`cached`)."""
        return without_cache(self)

    def arguments(self) -> dict[str, Any]:
        """`weight`, `bias`, `activation` as `build` takes them, in plain JSON data (what the
        remote backend posts to `ie serve`'s probe route)."""
        vector = self.vector
        return {
            "weight": [r[0] for r in self.weight] if vector else [list(r) for r in self.weight],
            "bias": self.bias[0] if vector else list(self.bias),
            "activation": self.activation,
        }

    def to_params(self) -> dict[str, Any]:
        """Plain data (a reducer's params cross vLLM's RPC as lists and numbers)."""
        return {
            "weight": [list(r) for r in self.weight],
            "bias": list(self.bias),
            "activation": self.activation,
            "vector": self.vector,
        }

    @classmethod
    def from_params(cls, params: Any) -> Probe:
        weight = tuple(tuple(float(x) for x in r) for r in params["weight"])
        bias = tuple(float(x) for x in params["bias"])
        return cls(weight, bias, str(params["activation"]), bool(params["vector"]))


def _numbers(values: Any, label: str) -> torch.Tensor:
    import torch  # a probe's spec imports no torch until it is built from numbers

    try:
        return torch.as_tensor(values, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        raise SteeringSpecError(
            f"a probe's {label} must be numbers (a number, a vector or a matrix), got "
            f"{type(values).__name__}"
        ) from None


def probe_scores(
    model: ModelLike,
    prompts: Prompt | Sequence[Sequence[int]],
    address: AddressLike,
    weight: Any,
    bias: Any = 0.0,
    activation: str = "linear",
    *,
    steering: SteeringArg = None,
) -> torch.Tensor:
    """activation(h @ weight + bias) for every token of each prompt at `address` (the rows as
    steered): `[batch, seq]` for a `[width]` weight, `[batch, seq, n]` for `[width, n]`."""
    steering = with_active(model, steering)
    work = unwrap(model).probe_scores(prompts, address, weight, bias, activation, steering=steering)
    return run(work)


__all__ = ["Probe", "probe_scores"]
