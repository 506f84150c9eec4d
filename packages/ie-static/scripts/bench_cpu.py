"""Decode tok/s of vllm-static against vllm-generate, vllm (hooked) and eager, on the CPU.

    uv run python packages/ie-static/scripts/bench_cpu.py --out static_bench.json

Each backend loads SmolLM2 in turn (vllm-static: reads at every layer, one write site) and
generates `--new-tokens` greedy tokens for 1 and for 8 requests submitted together, after a warm-up
request; tok/s = generated tokens / wall time. Repeats `--repeats` times and keeps the best.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
PROMPTS = [
    "The capital of France is",
    "Write a haiku about the ocean.",
    "List three prime numbers:",
    "Once upon a time, in a small village,",
    "The derivative of x squared is",
    "Explain why the sky is blue in one sentence.",
    "def fibonacci(n):",
    "Translate 'good morning' into Spanish:",
]


async def _rate(model: Any, concurrency: int, new_tokens: int, capture: list[str] | None) -> float:
    from ie_core.protocol import SamplingParams

    sp = SamplingParams(max_new_tokens=new_tokens, stop_at_eos=False)

    def job(prompt: str) -> Any:
        if capture:
            return model.capture_generation(prompt, capture, sp)
        return model.generate(prompt, sp)

    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(concurrency)]
    t0 = time.perf_counter()
    results = await asyncio.gather(*(job(p) for p in prompts))
    dt = time.perf_counter() - t0
    return sum(len(getattr(r, "generation", r).token_ids) for r in results) / dt


def measure(
    model: Any, new_tokens: int, repeats: int, capture: list[str] | None = None
) -> dict[str, float]:
    from ie_core.runner import run

    run(_rate(model, 1, 4, capture))  # warm-up
    out = {}
    for c in (1, 8):
        out[f"c{c}"] = max(run(_rate(model, c, new_tokens, capture)) for _ in range(repeats))
    return out


def load(backend: str) -> Any:
    from ie_core.loading import load_model

    if backend == "vllm-static":
        return load_model(
            MODEL, backend=backend, static_points="auto", static_writes=["resid_post.15"],
            max_model_len=1024,
        )  # fmt: skip
    if backend == "eager":
        return load_model(MODEL, backend=backend)
    return load_model(MODEL, backend=backend, max_model_len=1024)


def main(argv: list[str] | None = None) -> int:
    from ie_core.runner import run

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--backends", default="vllm-static,vllm-generate,vllm,eager", help="comma-separated"
    )
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"model": MODEL, "new_tokens": args.new_tokens}
    for backend in args.backends.split(","):
        t0 = time.perf_counter()
        model = load(backend)
        load_s = time.perf_counter() - t0
        entry: dict[str, Any] = {
            "load_s": load_s,
            "generate": measure(model, args.new_tokens, args.repeats),
        }
        if backend in ("vllm-static", "vllm"):
            every = [f"resid_post.{i}" for i in range(model.n_layers)]
            entry["capture_all_resid_post"] = measure(model, args.new_tokens, 1, every)
        run(model.shutdown()) if hasattr(model, "shutdown") else None
        results[backend] = entry
        print(json.dumps({backend: entry}), flush=True)
    if "vllm-static" in results and "vllm-generate" in results:
        results["ratio_static_vs_generate"] = {
            c: results["vllm-static"]["generate"][c] / results["vllm-generate"]["generate"][c]
            for c in ("c1", "c8")
        }
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
