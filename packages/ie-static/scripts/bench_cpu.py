"""Decode tok/s of vllm-static against vllm-generate, vllm (hooked) and eager, on the CPU.

    uv run python packages/ie-static/scripts/bench_cpu.py --out static_bench.json

Each backend loads SmolLM2 (vllm-static: reads at every layer, one write site) and generates
`--new-tokens` greedy tokens for 1 and for 8 requests submitted together, after a warm-up request;
tok/s = generated tokens / wall time, best of `--repeats`. vllm-static also reports tok/s while
capturing resid_post at every layer. The pair's three measurements (static generate, generate-only,
static capturing every layer) run interleaved in each round after `SETTLE_S` idle seconds, and each
round's ratios are kept (`rounds`, `ratios`) with the load sampled throughout (`load`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from typing import Any

from gpu_check_lib.parity import PROMPTS  # the GPU check's requests: both price the same work
from ie_core.tooling.load_sampling import SETTLE_S, LoadSampler

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _engine_cpu_s(model: Any) -> float:
    """CPU seconds used so far by the engine's processes (robust to a busy machine, unlike wall time)."""
    import psutil

    total = 0.0
    for pid in getattr(getattr(model, "engine", None), "_children", ()):
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def cpu_per_token(model: Any, concurrency: int, new_tokens: int) -> float:
    """Engine CPU milliseconds per generated token for `concurrency` requests together."""
    from ie_core.runner import run

    before = _engine_cpu_s(model)
    rate_tokens = run(_count(model, concurrency, new_tokens))
    return 1000.0 * (_engine_cpu_s(model) - before) / rate_tokens


async def _count(model: Any, concurrency: int, new_tokens: int) -> int:
    from ie_core.protocol import SamplingParams

    sp = SamplingParams(max_new_tokens=new_tokens, stop_at_eos=False)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(concurrency)]
    results = await asyncio.gather(*(model.generate(p, sp) for p in prompts))
    return sum(len(r.token_ids) for r in results)


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


def _paired_round(pair: dict[str, Any], every: list[str], new_tokens: int) -> dict[str, Any]:
    """One round: at 1 then 8 requests, static generate, generate-only, static capturing every
    layer, each after `SETTLE_S` idle seconds (an idle vLLM worker spins for 1 s after a step)."""
    from ie_core.runner import run

    out: dict[str, Any] = {"load_1m": round(os.getloadavg()[0], 2)}
    for c in (1, 8):
        for name, model, capture in (
            ("vllm-static", pair["vllm-static"], None),
            ("vllm-generate", pair["vllm-generate"], None),
            ("capture_all", pair["vllm-static"], every),
        ):
            time.sleep(SETTLE_S)
            out.setdefault(name, {})[f"c{c}"] = run(_rate(model, c, new_tokens, capture))
    return out


def _ratio_summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per request count, static / generate-only and capture-all / generate-only of each round
    (same round, so same load): their median, min and max."""
    out: dict[str, Any] = {}
    for key in ("vllm-static", "capture_all"):
        for c in ("c1", "c8"):
            per = [r[key][c] / r["vllm-generate"][c] for r in rounds]
            out[f"{key}_vs_generate_{c}"] = {
                "median": statistics.median(per), "min": min(per), "max": max(per),
            }  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    from ie_core.runner import run

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--others", default="vllm,eager", help="comma-separated, measured after")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"model": MODEL, "new_tokens": args.new_tokens}

    # vllm-static and vllm-generate are loaded together and measured alternately, so a busy
    # machine slows both alike; the best of `repeats` rounds is kept, and each round's ratios.
    pair = {}
    for backend in ("vllm-static", "vllm-generate"):
        t0 = time.perf_counter()
        pair[backend] = load(backend)
        results[backend] = {"load_s": time.perf_counter() - t0, "generate": {}}
    static = pair["vllm-static"]
    every = [f"resid_post.{i}" for i in range(static.n_layers)]
    for model in pair.values():
        run(_rate(model, 1, 4, None))
    run(_rate(static, 1, 4, every))
    with LoadSampler() as sampler:
        rounds = [_paired_round(pair, every, args.new_tokens) for _ in range(args.repeats)]
    results["rounds"], results["load"] = rounds, sampler.summary()
    results["ratios"] = _ratio_summary(rounds)
    for backend in pair:
        results[backend]["generate"] = {
            f"c{c}": max(r[backend][f"c{c}"] for r in rounds) for c in (1, 8)
        }
    results["vllm-static"]["capture_all_resid_post"] = {
        f"c{c}": max(r["capture_all"][f"c{c}"] for r in rounds) for c in (1, 8)
    }
    for backend, model in pair.items():
        results[backend]["engine_cpu_ms_per_token"] = {
            f"c{c}": min(cpu_per_token(model, c, args.new_tokens) for _ in range(2)) for c in (1, 8)
        }
    for model in pair.values():
        run(model.shutdown())
    results["ratio_static_vs_generate"] = {
        c: results["vllm-static"]["generate"][c] / results["vllm-generate"]["generate"][c]
        for c in ("c1", "c8")
    }
    results["cpu_ratio_generate_vs_static"] = {
        c: results["vllm-generate"]["engine_cpu_ms_per_token"][c]
        / results["vllm-static"]["engine_cpu_ms_per_token"][c]
        for c in ("c1", "c8")
    }
    print(json.dumps(results), flush=True)

    for backend in [b for b in args.others.split(",") if b]:
        t0 = time.perf_counter()
        model = load(backend)
        entry: dict[str, Any] = {"load_s": time.perf_counter() - t0}
        entry["generate"] = measure(model, args.new_tokens, args.repeats)
        if hasattr(model, "shutdown"):
            run(model.shutdown())
        results[backend] = entry
        print(json.dumps({backend: entry}), flush=True)
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
