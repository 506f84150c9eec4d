"""GPU check for vllm-static: parity with the hooked backend under CUDA graphs, and its price.

Run on a CUDA machine (about 5 minutes on one H200 with SmolLM2):

    uv run python packages/ie-static/scripts/gpu_check.py --out gpu_check.json

Parity (float32): the hooked `vllm` engine is the reference; `vllm-static` runs under vLLM's
default CUDA-graph mode (FULL_AND_PIECEWISE) and under PIECEWISE. Each compares captures
(resid_post at every layer over prompt + generated rows) and steered captures (every op kind and a
position mask, steered and unsteered requests in flight together) with the reference.
Price (the model's dtype): decode tok/s at 1 and 8 concurrent requests for `vllm-static` (reads
at every layer, one write site; plain generation and capture at every layer) and `vllm-generate`.
Prints one JSON summary (also written with --out); exit 1 when parity fails. Without CUDA it
prints a skip line and exits 0, so it imports and runs anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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
PARITY_TOL = 1e-4  # |diff| / |row|, fp32: compiled and eager kernels differ only in rounding


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def steering_cases(model: Any, width: int, layer: int) -> dict[str, Any]:
    """One steering spec per op kind (plus a masked one) at resid_post.<layer>."""
    import torch
    from ie_core.steering import (
        Additive,
        LensAblate,
        LensSteer,
        LensSwap,
        Orthogonal,
        PositionMask,
        ProjectionCap,
        steer_at,
    )

    g = torch.Generator().manual_seed(0)

    def vec() -> torch.Tensor:
        return torch.randn(width, generator=g)

    site = f"resid_post.{layer}"
    return {
        "additive": steer_at(site, Additive(vec(), 4.0)),
        "orthogonal": steer_at(site, Orthogonal(vec(), 0.0)),
        "projection_cap": steer_at(site, ProjectionCap(vec(), min=-0.5, max=0.5)),
        "lens_steer": steer_at(site, LensSteer(vec(), 0.8, 0.5)),
        "lens_ablate": steer_at(site, LensAblate(vec())),
        "lens_swap": steer_at(site, LensSwap(vec(), vec())),
        "masked_additive": steer_at(site, Additive(vec(), 4.0), mask=PositionMask((0, 1, 2))),
    }


def rel_diff(a: Any, b: Any) -> float:
    a, b = a.float(), b.float()
    if a.shape != b.shape:
        return float("inf")
    return float(((a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-6)).max())


async def captures(
    model: Any, addresses: list[str], cases: dict[str, Any], new_tokens: int
) -> dict[str, Any]:
    """Unsteered capture_generation of every prompt, and every steering case, all in flight at once."""
    from ie_core.protocol import SamplingParams

    sp = SamplingParams(max_new_tokens=new_tokens, stop_at_eos=False)
    jobs: dict[str, Any] = {}
    for i, p in enumerate(PROMPTS):
        jobs[f"plain/{i}"] = model.capture_generation(p, addresses, sp)
    for name, spec in cases.items():
        jobs[f"steer/{name}"] = model.capture_generation(PROMPTS[0], addresses, sp, steering=spec)
    results = await asyncio.gather(*jobs.values())
    return dict(zip(jobs, results, strict=True))


def compare(ref: dict[str, Any], got: dict[str, Any], addresses: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, r in ref.items():
        g = got[key]
        same_tokens = r.generation.token_ids == g.generation.token_ids
        # Compare rows over the positions both runs computed from the same tokens.
        worst = 0.0
        for a in addresses:
            ra, ga = r.cache[a], g.cache[a]
            n = min(ra.shape[1], ga.shape[1])
            if not same_tokens:
                n = len(r.generation.prompt_ids)
            worst = max(worst, rel_diff(ga[:, :n], ra[:, :n]))
        out[key] = {"tokens_equal": same_tokens, "max_rel_diff": worst}
    return out


async def decode_rate(
    model: Any, concurrency: int, new_tokens: int, capture: list[str] | None
) -> float:
    """Generated tokens per second over `concurrency` requests submitted together (after a warm-up)."""
    from ie_core.protocol import SamplingParams

    sp = SamplingParams(max_new_tokens=new_tokens, stop_at_eos=False)

    def job(prompt: str) -> Any:
        if capture:
            return model.capture_generation(prompt, capture, sp)
        return model.generate(prompt, sp)

    await job(PROMPTS[0])
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(concurrency)]
    t0 = time.perf_counter()
    results = await asyncio.gather(*(job(p) for p in prompts))
    dt = time.perf_counter() - t0
    n = sum(len(getattr(r, "generation", r).token_ids) for r in results)
    return n / dt


async def rates(model: Any, new_tokens: int, capture: list[str] | None = None) -> dict[str, float]:
    out = {}
    for c in (1, 8):
        out[f"c{c}"] = await decode_rate(model, c, new_tokens, capture)
    return out


async def run_check(args: argparse.Namespace) -> dict[str, Any]:
    from ie_static.backend import StaticModel
    from ie_vllm import VLLMModel

    common = {"gpu_memory_utilization": args.mem, "max_model_len": 1024}
    summary: dict[str, Any] = {"model": MODEL, "new_tokens": args.new_tokens}
    t0 = time.perf_counter()

    # Parity in float32, so greedy tokens do not flip on bf16 near-ties between kernels.
    hooked = await VLLMModel.create(MODEL, "vllm", dtype="float32", **common)
    n_layers, width = hooked.n_layers, hooked.d_model
    layer = n_layers // 2
    addresses = [f"resid_post.{i}" for i in range(n_layers)]
    cases = steering_cases(hooked, width, layer)
    ref = await captures(hooked, addresses, cases, args.parity_tokens)
    await hooked.shutdown()
    summary["t_hooked_s"] = time.perf_counter() - t0

    for mode in ("FULL_AND_PIECEWISE", "PIECEWISE"):
        t1 = time.perf_counter()
        static = await StaticModel.create_static(
            MODEL,
            static_points="auto",
            static_writes=[f"resid_post.{layer}"],
            dtype="float32",
            compilation_config={"cudagraph_mode": mode},
            **common,
        )
        got = await captures(static, addresses, cases, args.parity_tokens)
        await static.shutdown()
        parity = compare(ref, got, addresses)
        summary[f"parity_{mode.lower()}"] = {
            "ok": all(
                v["tokens_equal"] and v["max_rel_diff"] <= PARITY_TOL for v in parity.values()
            ),
            "worst_rel_diff": max(v["max_rel_diff"] for v in parity.values()),
            "tokens_equal": sum(v["tokens_equal"] for v in parity.values()),
            "requests": len(parity),
            "steering_moved_rows": all(
                rel_diff(
                    got[f"steer/{k}"].cache[addresses[-1]][:, 3:],
                    got["plain/0"].cache[addresses[-1]][:, 3:],
                )
                > 1e-3
                for k in cases
            ),
            "detail": parity,
            "t_s": time.perf_counter() - t1,
        }

    # Price at the model's own dtype and vLLM's default graph mode.
    t2 = time.perf_counter()
    static = await StaticModel.create_static(
        MODEL, static_points="auto", static_writes=[f"resid_post.{layer}"], **common
    )
    summary["static_info"] = static.static_info.to_wire()
    summary["static_generate"] = await rates(static, args.new_tokens)
    summary["static_capture_every_layer"] = await rates(static, args.new_tokens, addresses)
    await static.shutdown()
    vanilla = await VLLMModel.create(MODEL, "vllm-generate", **common)
    summary["generate"] = await rates(vanilla, args.new_tokens)
    await vanilla.shutdown()
    summary["t_price_s"] = time.perf_counter() - t2

    summary["ratio_static_vs_generate"] = {
        c: summary["static_generate"][c] / summary["generate"][c] for c in ("c1", "c8")
    }
    summary["ratio_static_capture_vs_generate"] = {
        c: summary["static_capture_every_layer"][c] / summary["generate"][c] for c in ("c1", "c8")
    }
    summary["parity_ok"] = all(
        summary[f"parity_{m}"]["ok"] for m in ("full_and_piecewise", "piecewise")
    )
    summary["total_s"] = time.perf_counter() - t0
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write the JSON summary here too")
    parser.add_argument("--new-tokens", type=int, default=128, help="decode tokens per request")
    parser.add_argument("--parity-tokens", type=int, default=16, help="tokens per parity request")
    parser.add_argument("--mem", type=float, default=0.2, help="gpu_memory_utilization per engine")
    args = parser.parse_args(argv)
    if not cuda_available():
        print(json.dumps({"skipped": "no CUDA device; vllm-static's GPU check needs one"}))
        return 0
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "0")
    summary = asyncio.run(run_check(args))
    text = json.dumps(summary, indent=2, default=str)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    return 0 if summary["parity_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
