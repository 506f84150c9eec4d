"""CPU benchmark of ie-vllm on SmolLM2: decode tok/s at 1 and 8 concurrent requests for eager,
vllm and vllm-generate; capture latency of resid_post at the middle layer and at every layer.

A program, not a test: `uv run python packages/ie-vllm/benchmarks/bench_cpu.py OUT.jsonl [backend ...]`
appends one JSON object per backend to OUT.jsonl (vLLM logs to stdout).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
NEW_TOKENS = 32
REPEATS = 3
PROMPTS = [f"Write a short story about a robot named R{i} who learns to paint." for i in range(8)]


def _median_time(fn: Any, repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench(backend: str) -> dict[str, Any]:
    from ie_core import SamplingParams, load_model
    from ie_core.runner import run

    t0 = time.perf_counter()
    kw: dict[str, Any] = (
        {"max_model_len": 512} if backend.startswith("vllm") else {"dtype": "float32"}
    )
    model = load_model(MODEL, backend=backend, **kw)
    load_s = time.perf_counter() - t0
    params = SamplingParams(max_new_tokens=NEW_TOKENS, stop_at_eos=False)
    ids = [model.to_tokens(p) for p in PROMPTS]
    run(model.generate(ids[0], SamplingParams(max_new_tokens=4)))  # warm up

    def one() -> None:
        run(model.generate(ids[0], params))

    async def eight() -> None:
        await asyncio.gather(*(model.generate(p, params) for p in ids))

    out: dict[str, Any] = {"backend": backend, "model": MODEL, "load_s": round(load_s, 1)}
    out["decode_tok_s_c1"] = round(NEW_TOKENS / _median_time(one), 2)
    out["decode_tok_s_c8"] = round(8 * NEW_TOKENS / _median_time(lambda: run(eight())), 2)
    if backend != "vllm-generate":
        mid = model.n_layers // 2
        every = [f"resid_post.{i}" for i in range(model.n_layers)]
        prompt = ids[0]
        out["capture_tokens"] = len(prompt)
        out["capture_mid_ms"] = round(
            1e3 * _median_time(lambda: run(model.capture([prompt], [f"resid_post.{mid}"]))), 1
        )
        out["capture_all_ms"] = round(
            1e3 * _median_time(lambda: run(model.capture([prompt], every))), 1
        )
        out["forward_only_ms"] = round(
            1e3
            * _median_time(lambda: run(model.generate(prompt, SamplingParams(max_new_tokens=1)))),
            1,
        )
    run(model.shutdown())
    return out


def main() -> None:
    import torch

    torch.set_num_threads(1)
    out = Path(sys.argv[1])
    for backend in sys.argv[2:] or ["eager", "vllm", "vllm-generate"]:
        result = bench(backend)
        with out.open("a") as f:
            f.write(json.dumps(result) + "\n")
        print(result, file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
