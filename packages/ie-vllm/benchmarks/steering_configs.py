"""Many steering configurations in one batch: N concurrent generations where request i carries
configuration i % K (distinct additive vectors at several layers), K = 1, 8, 32, 256, against the
same N requests unsteered, on hooked vLLM and vllm-static. SmolLM2-135M; results go to JSON and
markdown with the load average before and after each backend; run it alone.

    uv run --locked python packages/ie-vllm/benchmarks/steering_configs.py

Smoke run: `--requests 16 --ks 1,4 --new-tokens 2`. EasySteer's published figures (their GPU) are
quoted in docs/PERFORMANCE.md beside this table; they are not measured here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from ie_core.ops import Additive, Steering, steer_at
from ie_core.protocol import SamplingParams
from ie_core.runner import run

HERE = Path(__file__).resolve().parent
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def configurations(k: int, layers: list[int], d_model: int) -> list[list[Steering]]:
    """K configurations, each a distinct seeded vector per layer (norm 2: visible, not wild)."""
    out = []
    for i in range(k):
        g = torch.Generator().manual_seed(1000 + i)
        steering = []
        for layer in layers:
            v = torch.randn(d_model, generator=g)
            steering.append(steer_at(f"resid_post.{layer}", Additive(v / v.norm() * 2.0)))
        out.append(steering)
    return out


async def _batch(model: Any, n: int, params: SamplingParams, configs: list[Any] | None) -> int:
    """N generations in flight together; request i takes configuration i % K. Returns tokens."""
    calls = [
        model.generate(
            PROMPT, params, steering=None if configs is None else configs[i % len(configs)]
        )
        for i in range(n)
    ]
    return sum(len(g.token_ids) for g in await asyncio.gather(*calls))


def _cell(model: Any, n: int, params: SamplingParams, configs: Any, repeats: int) -> dict:
    run(_batch(model, min(n, 8), params, configs))  # warm: first tables, first shapes
    best = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        tokens = run(_batch(model, n, params, configs))
        seconds = time.perf_counter() - t0
        best = seconds if best is None else min(best, seconds)
    assert best is not None
    return {"seconds": best, "tokens": tokens, "tok_per_s": tokens / best}


def backend_cells(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    from ie_core.loading import load_model

    layers = [int(x) for x in args.layers.split(",")]
    extra: dict[str, Any] = {}
    if backend == "vllm-static":
        # One slot per steered request in flight (the default 16 would queue the batch).
        writes = [f"resid_post.{layer}" for layer in layers]
        extra = {"static_points": writes, "static_writes": writes, "static_slots": args.requests}
    t0 = time.perf_counter()
    model = load_model(MODEL, backend=backend, max_model_len=512, **extra)
    start_s = time.perf_counter() - t0
    params = SamplingParams(max_new_tokens=args.new_tokens, stop_at_eos=False)
    cells: dict[str, Any] = {"engine_start_s": start_s, "load_before": os.getloadavg()}
    try:
        cells["no steering"] = _cell(model, args.requests, params, None, args.repeats)
        for k in (int(x) for x in args.ks.split(",")):
            configs = configurations(k, layers, model.d_model)
            cells[f"K={k}"] = _cell(model, args.requests, params, configs, args.repeats)
    finally:
        run(model.shutdown())
    cells["load_after"] = os.getloadavg()
    return cells


def _table(results: dict[str, Any], first_k: str) -> list[str]:
    lines = [
        "| backend | configurations | tok/s | vs K=1 | vs no steering |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for backend, cells in results.items():
        base, plain = cells[first_k]["tok_per_s"], cells["no steering"]["tok_per_s"]
        for name, c in cells.items():
            if isinstance(c, dict):
                rate = c["tok_per_s"]
                lines.append(
                    f"| {backend} | {name} | {rate:.1f} | {rate / base:.2f}x | {rate / plain:.2f}x |"
                )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backends", default="vllm,vllm-static")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--ks", default="1,8,32,256")
    ap.add_argument(
        "--layers", default="5,15,25", help="resid_post layers each configuration steers"
    )
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "steering_configs")
    args = ap.parse_args()
    results: dict[str, Any] = {}
    for backend in args.backends.split(","):
        results[backend] = backend_cells(backend, args)
        _write(args, results)  # after each backend, so a later failure keeps the earlier cells


def _write(args: argparse.Namespace, results: dict[str, Any]) -> None:
    record = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "args": {k: str(v) for k, v in vars(args).items() if k != "out"},
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(record, indent=2))
    lines = _table(results, f"K={args.ks.split(',')[0]}")
    for backend, cells in results.items():
        lines.append(
            f"\n{backend}: engine start {cells['engine_start_s']:.0f} s; load average "
            f"{cells['load_before'][0]:.2f} before, {cells['load_after'][0]:.2f} after"
        )
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
