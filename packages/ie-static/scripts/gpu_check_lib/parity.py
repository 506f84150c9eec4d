"""The parity half: `vllm-static` under CUDA graphs against the hooked `vllm` reference, in fp32.

Each compares captures (resid_post at every layer over prompt + generated rows) and steered
captures (every op kind and a position mask, steered and unsteered requests in flight together).
fp32, so greedy tokens do not flip on bf16 near-ties between kernels.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from gpu_check_lib.plan import PARITY_MODES, PARITY_TOL

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


def steering_cases(width: int, layer: int) -> dict[str, Any]:
    """One steering spec per op kind (plus a masked one) at resid_post.<layer>."""
    import torch
    from ie_core.ops import (
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
    """Every prompt unsteered and every steering case, all in flight at once."""
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
        # Rows compare only where both runs computed from the same tokens.
        worst = 0.0
        for a in addresses:
            ra, ga = r.cache[a], g.cache[a]
            n = min(ra.shape[1], ga.shape[1]) if same_tokens else len(r.generation.prompt_ids)
            worst = max(worst, rel_diff(ga[:, :n], ra[:, :n]))
        out[key] = {"tokens_equal": same_tokens, "max_rel_diff": worst}
    return out


def verdict(ref: dict[str, Any], got: dict[str, Any], addresses: list[str]) -> dict[str, Any]:
    """One graph mode's summary: ok, worst difference, and that steering moved the rows at all."""
    parity = compare(ref, got, addresses)
    last = addresses[-1]
    return {
        "ok": all(v["tokens_equal"] and v["max_rel_diff"] <= PARITY_TOL for v in parity.values()),
        "worst_rel_diff": max(v["max_rel_diff"] for v in parity.values()),
        "tokens_equal": sum(v["tokens_equal"] for v in parity.values()),
        "requests": len(parity),
        # Negative control: a steering op that changed nothing would pass parity trivially.
        "steering_moved_rows": all(
            rel_diff(got[k].cache[last][:, 3:], got["plain/0"].cache[last][:, 3:]) > 1e-3
            for k in got
            if k.startswith("steer/")
        ),
        "detail": parity,
    }


def run_parity(
    start: Callable[..., Any], stop: Callable[[Any], None], n_layers: int, width: int, tokens: int
) -> dict[str, Any]:
    """The reference on hooked vllm, then vllm-static under each graph mode; one engine at a time.

    `start(backend, **kwargs)` loads an engine (and checks it ran on CUDA); `stop` shuts it down.
    """
    from ie_core.runner import run

    layer = n_layers // 2
    addresses = [f"resid_post.{i}" for i in range(n_layers)]
    cases = steering_cases(width, layer)
    summary: dict[str, Any] = {"tolerance": PARITY_TOL, "new_tokens": tokens}
    t0 = time.perf_counter()
    hooked = start("vllm", dtype="float32")
    try:
        ref = run(captures(hooked, addresses, cases, tokens))
    finally:
        stop(hooked)
    summary["t_hooked_s"] = time.perf_counter() - t0
    for mode in PARITY_MODES:
        t1 = time.perf_counter()
        static = start(
            "vllm-static",
            dtype="float32",
            static_points="auto",
            static_writes=[f"resid_post.{layer}"],
            compilation_config={"cudagraph_mode": mode},
        )
        try:
            got = run(captures(static, addresses, cases, tokens))
        finally:
            stop(static)
        summary[mode.lower()] = verdict(ref, got, addresses) | {"t_s": time.perf_counter() - t1}
    summary["ok"] = all(summary[m.lower()]["ok"] for m in PARITY_MODES)
    return summary
