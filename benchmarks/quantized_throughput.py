"""Benchmark: decode tokens per second and the cost of capturing during decode, for the INT8 W8A8
checkpoint `ie-synthetic/llama-w8a8` against its full-precision family `ie-synthetic/llama`, on
hooked vLLM and vllm-static (both in bfloat16: vLLM's CPU INT8 kernel takes bf16 activations).

Per cell: a batch of prompts generates `--tokens` greedy tokens each, plain and with every
layer's `resid_post` captured; loading and one warm-up round are excluded. Run it alone (nothing
else on the machine); best of `--repeats` interleaved plain / captured rounds per cell, with
the load average at start and end recorded:

    uv run --locked python benchmarks/quantized_throughput.py --out benchmarks/results/quantized_throughput.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

MODELS = ("ie-synthetic/llama", "ie-synthetic/llama-w8a8")
BACKENDS = ("vllm", "vllm-static", "vllm-generate")  # vllm-generate: vanilla vLLM, the ceiling
PROMPT = "The capital of France is"
DTYPE = "bfloat16"


def _load(model_id: str, backend: str, n_layers: int = 4) -> Any:
    from ie_core import load_model

    kw: dict[str, Any] = {"dtype": DTYPE, "max_model_len": 512}
    if backend == "vllm-static":
        kw["static_points"] = [f"resid_post.{i}" for i in range(n_layers)]
    return load_model(model_id, backend=backend, **kw)


async def _round(model: Any, prompts: int, tokens: int, capture: bool) -> float:
    """Seconds for `prompts` concurrent greedy generations of `tokens` tokens each."""
    from ie_core import SamplingParams

    ids = model.to_tokens(PROMPT)
    params = SamplingParams(max_new_tokens=tokens, stop_at_eos=False)
    points = [f"resid_post.{i}" for i in range(model.n_layers)]
    start = time.perf_counter()
    if capture:
        await asyncio.gather(
            *(model.capture_generation(ids, points, params) for _ in range(prompts))
        )
    else:
        await asyncio.gather(*(model.generate(ids, params) for _ in range(prompts)))
    return time.perf_counter() - start


def _cell(model_id: str, backend: str, prompts: int, tokens: int, repeats: int) -> dict[str, Any]:
    from ie_core.runner import run

    model = _load(model_id, backend)
    captures = backend != "vllm-generate"  # vanilla vLLM refuses capture: plain rounds only
    try:
        run(_round(model, prompts, 2, capture=captures))  # warm-up
        # Plain and captured rounds interleaved, best of `repeats` each: load noise hits both.
        plain = captured = float("inf")
        for _ in range(repeats):
            plain = min(plain, run(_round(model, prompts, tokens, capture=False)))
            if captures:
                captured = min(captured, run(_round(model, prompts, tokens, capture=True)))
    finally:
        run(model.shutdown())
    return {
        "model": model_id,
        "backend": backend,
        "dtype": DTYPE,
        "prompts": prompts,
        "tokens": tokens,
        "decode_tok_s": prompts * tokens / plain,
        "capture_tok_s": prompts * tokens / captured if captures else None,
        "capture_cost": captured / plain - 1.0 if captures else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS))
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    load_start = os.getloadavg()
    cells = [
        _cell(m, b, args.prompts, args.tokens, args.repeats)
        for b in args.backends
        for m in args.models
    ]
    result = {
        "benchmark": "quantized_throughput",
        "cpus": os.cpu_count(),
        "repeats": args.repeats,
        "load_average_start": load_start,
        "load_average_end": os.getloadavg(),
        "cells": cells,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for c in cells:
        line = f"{c['backend']:13s} {c['model']:26s} decode {c['decode_tok_s']:8.1f} tok/s"
        if c["capture_tok_s"] is not None:
            line += f"  with capture {c['capture_tok_s']:8.1f} tok/s  cost {c['capture_cost']:+.1%}"
        print(line)


if __name__ == "__main__":
    main()
