"""`ie demo`: logit lens, a few captured shapes, and a steering example, on any backend.

Everything goes through the protocol and ie_core's free functions, so `--backend vllm` runs the
same script on vLLM once that backend is installed."""

from __future__ import annotations

import argparse
import time
from typing import Any

from ie_core import Additive, load_model, steer_at
from ie_core.api import capture, decode_residuals, generate
from ie_core.errors import LayerOutOfRangeError
from ie_core.grammar import to_address
from ie_core.models import DEFAULT_MODEL
from ie_core.runner import run
from ie_core.tooling.cli import SuggestingParser

PROMPT = "The capital of France is"
STEER_PROMPT = "I went to the park and I felt"
# Contrast pair for a steering vector (difference of mean residuals, "ActAdd" style).
POSITIVE = "I love it. It is wonderful, beautiful and joyful."
NEGATIVE = "I hate it. It is terrible, ugly and miserable."


def _parser() -> argparse.ArgumentParser:
    p = SuggestingParser(
        prog="ie demo",
        description="Logit lens, captures and steering in one minute.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--backend", default="eager", help="eager, vllm, vllm-static, or auto")
    p.add_argument(
        "--model", default=DEFAULT_MODEL, help="Hub id, local HF folder or ie-synthetic/<family>"
    )
    p.add_argument("--prompt", default=PROMPT, help="prompt for the logit lens")
    p.add_argument("--top", type=int, default=3, help="tokens shown per layer")
    p.add_argument(
        "--coeff", type=float, default=4.0, help="steering strength (multiples of the vector)"
    )
    p.add_argument("--layer", type=int, default=None, help="steering layer (unset: one third deep)")
    p.add_argument(
        "--max-new-tokens", type=int, default=12, help="tokens generated per steering row"
    )
    return p


def _rows(t: Any) -> Any:
    """One prompt's rows `[seq, d]`, whether a backend returns `[batch, seq, d]` or `[seq, d]`."""
    return t[0] if t.dim() == 3 else t


def _mean_row(model: Any, text: str, address: str) -> Any:
    ids = model.to_tokens(text)
    return _rows(capture(model, ids, [address])[address]).float().mean(0)


def _show(model: Any, ids: list[int]) -> str:
    return repr(model.to_string(ids))


def lens_section(model: Any, prompt: str, top: int) -> list[list[int]]:
    ids = model.to_tokens(prompt)
    addresses = [f"resid_post.{i}" for i in range(model.n_layers)]
    cache = capture(model, ids, addresses)
    import torch

    rows = torch.stack([_rows(cache[a])[-1] for a in addresses])
    result = decode_residuals(model, rows, k=top)
    print(f"\n== logit lens: top {top} next tokens after {prompt!r}, last position, every layer")
    tops: list[list[int]] = []
    for layer, (row_ids, row_probs) in enumerate(
        zip(result.ids.tolist(), result.probs.tolist(), strict=True)
    ):
        cells = "  ".join(
            f"{model.to_string([t])!r:>12} {p:5.1%}"
            for t, p in zip(row_ids, row_probs, strict=True)
        )
        print(f"  layer {layer:2d}  {cells}")
        tops.append(row_ids)
    return tops


def shapes_section(model: Any, prompt: str) -> None:
    mid = model.n_layers // 2
    available = set(model.points())
    wanted = [
        "embeddings",
        f"resid_post.{mid}",
        f"attn_probs.{mid}",
        f"value.{mid}",
        f"mlp_act.{mid}",
    ]
    addresses = [a for a in wanted if to_address(a).name in available]
    ids = model.to_tokens(prompt)
    cache = capture(model, ids, addresses)
    print(
        f"\n== captured shapes ({len(ids)} prompt tokens; [batch, seq, ...], attention [batch, heads, q, k])"
    )
    for address in addresses:
        print(f"  {address:<18} {tuple(cache[address].shape)}")


def steering_section(model: Any, layer: int, coeff: float, max_new_tokens: int) -> None:
    address = f"resid_pre.{layer}"
    vector = _mean_row(model, POSITIVE, address) - _mean_row(model, NEGATIVE, address)
    ids = model.to_tokens(STEER_PROMPT)
    base = generate(model, ids, max_new_tokens=max_new_tokens)
    spec = steer_at(address, Additive(vector.tolist(), coeff))
    up = generate(model, ids, max_new_tokens=max_new_tokens, steering=spec)
    spec_down = steer_at(address, Additive(vector.tolist(), -coeff))
    down = generate(model, ids, max_new_tokens=max_new_tokens, steering=spec_down)
    print(f"\n== steering at {address}: vector = mean({POSITIVE!r}) - mean({NEGATIVE!r})")
    print(f"  prompt        {STEER_PROMPT!r}")
    print(f"  unsteered     {_show(model, list(base.token_ids))}")
    print(f"  +{coeff:g} x vector {_show(model, list(up.token_ids))}")
    print(f"  -{coeff:g} x vector {_show(model, list(down.token_ids))}")


def demo_command(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    start = time.perf_counter()
    model = load_model(args.model, backend=args.backend)
    print(
        f"loaded {args.model} on backend {model.backend!r}: {model.n_layers} layers, d_model {model.d_model} "
        f"({time.perf_counter() - start:.1f} s)"
    )
    try:
        layer = args.layer if args.layer is not None else max(1, model.n_layers // 3)
        if not 0 <= layer < model.n_layers:
            raise LayerOutOfRangeError(
                f"--layer {layer} is outside this model's layers 0..{model.n_layers - 1}; "
                "pick one in range or leave it unset"
            )
        lens_section(model, args.prompt, args.top)
        shapes_section(model, args.prompt)
        steering_section(model, layer, args.coeff, args.max_new_tokens)
    finally:
        run(model.shutdown())
    print(f"\ndone in {time.perf_counter() - start:.1f} s")
    return 0
