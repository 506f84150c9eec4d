"""Parity helpers shared by the tests and the parity-table script: vLLM against eager."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from ie_core.runner import run

# A prompt longer than the synthetic sliding window (8), so windowed masks matter.
PROMPT_TEXT = "The quick brown fox jumps over the lazy dog while the cat sleeps"


def servable_addresses(model: Any) -> list[str]:
    """Every address the vLLM model serves, attention maps included."""
    return sorted(model.info.widths, key=_order)


def _order(address: str) -> tuple[int, str]:
    name, _, layer = address.partition(".")
    return (int(layer) if layer else -1, name)


def max_abs_diffs(a: Any, b: Any, addresses: Sequence[str]) -> dict[str, float]:
    """max |a - b| per address; masked attention scores compare as equal where both are min."""
    out: dict[str, float] = {}
    for address in addresses:
        x, y = a[address].float(), b[address].float()
        if x.shape != y.shape:
            raise AssertionError(f"{address}: shapes {tuple(x.shape)} vs {tuple(y.shape)}")
        if address.startswith("attn_scores"):
            low = torch.finfo(torch.float32).min / 2
            both = (x < low) & (y < low)
            x, y = x.masked_fill(both, 0), y.masked_fill(both, 0)
        out[address] = float((x - y).abs().max()) if x.numel() else 0.0
    return out


def scaled_diffs(a: Any, b: Any, addresses: Sequence[str]) -> dict[str, float]:
    """max |a - b| / max(1, max |b|): real models carry massive activations (SmolLM2's reach the
    hundreds), where fp32 kernels that sum in another order differ by ~1e-7 of the magnitude."""
    abs_diffs = max_abs_diffs(a, b, addresses)
    out = {}
    for address, d in abs_diffs.items():
        ref = b[address].float()
        if address.startswith("attn_scores"):
            ref = ref.masked_fill(ref < torch.finfo(torch.float32).min / 2, 0)
        scale = float(ref.abs().max()) if ref.numel() else 0.0
        out[address] = d / max(1.0, scale)
    return out


def parity(vllm_model: Any, eager_model: Any, ids: Sequence[int]) -> dict[str, float]:
    addresses = servable_addresses(vllm_model)
    got = run(vllm_model.capture([list(ids)], addresses))
    want = run(eager_model.capture([list(ids)], addresses))
    return max_abs_diffs(got, want, addresses)


def by_point(diffs: dict[str, float]) -> dict[str, float]:
    """The worst diff over layers, per point name."""
    out: dict[str, float] = {}
    for address, d in diffs.items():
        name = address.split(".")[0]
        out[name] = max(out.get(name, 0.0), d)
    return out


# Where vLLM's model math differs from HF's by design, the comparison aligns eager to vLLM's
# math (documented per family); the hooks must then read the same tensors within 1e-4.
ENGINE_DIFFERENCES = {
    "bloom": "vLLM's BloomMLP applies exact (erf) GELU where HF's BloomGelu uses the tanh "
    "approximation; eager is compared with its GELU switched to the exact form",
}


def align_eager(family: str, eager_model: Any) -> None:
    """Give eager vLLM's math where ENGINE_DIFFERENCES says they differ (in place)."""
    if family == "bloom":
        for block in eager_model.hf_model.transformer.h:
            block.mlp.gelu_impl = torch.nn.GELU()


def served_layers(capability_file: Mapping[str, Any], family: str) -> dict[str, list[int | None]]:
    """point -> the layers `family`'s committed capability entry serves (None: a trunk point)."""
    entry = capability_file["models"][f"ie-synthetic/{family}"]["points"]
    return {name: (list(cap["layers"]) or [None]) for name, cap in entry.items() if cap["served"]}


def eager_scales(family: str, layers: Mapping[str, Sequence[int | None]]) -> dict[str, float]:
    """point -> max |eager capture| over `layers` of PROMPT_TEXT (eager aligned as the sweep
    aligns it): the scale a committed max |backend - eager| is judged relative to."""
    from ie_core import load_model

    eager = load_model(f"ie-synthetic/{family}", backend="eager", device="cpu", dtype="float32")
    align_eager(family, eager)
    ids = eager.to_tokens(PROMPT_TEXT)
    addresses = [n if i is None else f"{n}.{i}" for n, ls in layers.items() for i in ls]
    cache = run(eager.capture([ids], addresses))
    out: dict[str, float] = {}
    for address in addresses:
        t = cache[address].float()
        if address.startswith("attn_scores"):  # masked entries sit at dtype min
            t = t.masked_fill(t < torch.finfo(torch.float32).min / 2, 0)
        name = address.partition(".")[0]
        out[name] = max(out.get(name, 0.0), float(t.abs().max()) if t.numel() else 0.0)
    return out
