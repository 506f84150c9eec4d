"""Where a vllm-static step's time goes, paired with vllm-generate, on the CPU.

    /work/bin/vllm-slot uv run python packages/ie-static/scripts/profile_step.py --out profile.json

Loads SmolLM2 twice: `vllm-static` (reads at every `resid_post`, one write site at `resid_post.15`,
as the sweep's variant) and `vllm-generate`. Each round runs every phase on both engines one after
the other (round-robin), so a ratio is taken under one condition even on a busy machine:

- `gen_c1`, `gen_c8`: plain generation, 1 and 8 requests together (static / generate ratio);
- `all_c1`, `all_c8`: static capturing `resid_post` at all layers while generating, against that
  round's plain generate at the same concurrency.

The static worker's counters (`ie_static_stats`) split each phase's wall time into the host-side
row-table refresh (`set_rows`), the model forward (taps included), the per-step harvest and
slicing of captured rows (`harvest`), the final gather and encoding (`collect`), and what is left
(scheduler, sampling, IPC, the front end). Ratios are medians over rounds of each round's ratio.
Each phase starts after `SETTLE_S` idle seconds, so the other engine's post-step busy loop (vLLM's
shared-memory queue spins for 1 s after its last read) does not run into it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cpu import MODEL, PROMPTS
from ie_core.tooling.load_sampling import SETTLE_S, LoadSampler

PARTS = ("set_rows", "forward", "harvest", "collect")
PHASES = (("gen_c1", 1, False), ("gen_c8", 8, False), ("all_c1", 1, True), ("all_c8", 8, True))


def load(backend: str, max_model_len: int) -> Any:
    from ie_core.loading import load_model

    kwargs: dict[str, Any] = {"max_model_len": max_model_len, "enable_prefix_caching": False}
    if backend == "vllm-static":
        kwargs.update(static_points="auto", static_writes=["resid_post.15"])
    return load_model(MODEL, backend=backend, dtype="float32", **kwargs)


def stats(model: Any) -> dict[str, float]:
    from ie_core.runner import run

    if model.backend != "vllm-static":
        return {}
    return dict(run(model.flow.on_engine(model.engine.rpc("ie_static_stats")))[0])


async def _job(model: Any, concurrency: int, new_tokens: int, capture: list[str] | None) -> int:
    from ie_core.protocol import SamplingParams

    sp = SamplingParams(max_new_tokens=new_tokens, stop_at_eos=False)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(concurrency)]
    if capture:
        outs = await asyncio.gather(*(model.capture_generation(p, capture, sp) for p in prompts))
        return sum(len(o.generation.token_ids) for o in outs)
    outs = await asyncio.gather(*(model.generate(p, sp) for p in prompts))
    return sum(len(o.token_ids) for o in outs)


def timed(model: Any, concurrency: int, new_tokens: int, capture: list[str] | None) -> dict:
    """One phase on one engine: tok/s and, on static, the step split from the worker counters."""
    from ie_core.runner import run

    before = stats(model)
    time.sleep(SETTLE_S)
    t0 = time.perf_counter()
    tokens = run(_job(model, concurrency, new_tokens, capture))
    wall = time.perf_counter() - t0
    after = stats(model)
    out: dict[str, Any] = {"tok_s": tokens / wall, "wall_s": wall, "tokens": tokens}
    if after:
        forwards = after["forwards"] - before["forwards"]
        split = {k: after[k] - before[k] for k in PARTS}
        split["outside_worker"] = wall - sum(split.values())
        out["forwards"] = forwards
        out["ms_per_forward"] = {k: 1000 * v / max(forwards, 1) for k, v in split.items()}
    return out


def one_round(engines: dict[str, Any], every: list[str], new_tokens: int) -> dict[str, Any]:
    """Every phase on both engines, one after the other (capture phases on static only)."""
    entry: dict[str, Any] = {"loadavg_start": os.getloadavg()[0]}
    for phase, concurrency, capture in PHASES:
        entry[phase] = {}
        for backend, model in engines.items():
            if capture and backend != "vllm-static":
                continue
            entry[phase][backend] = timed(
                model, concurrency, new_tokens, every if capture else None
            )
    entry["loadavg_end"] = os.getloadavg()[0]
    return entry


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Median over rounds of each round's paired ratio, and the median static step split."""
    ratios: dict[str, float] = {}
    split: dict[str, dict[str, float]] = {}
    for phase, concurrency, capture in PHASES:
        base = f"gen_c{concurrency}"
        per_round = [
            r[phase]["vllm-static"]["tok_s"] / r[base]["vllm-generate"]["tok_s"] for r in rounds
        ]
        ratios[f"{phase}_static_over_generate"] = statistics.median(per_round)
        parts = [r[phase]["vllm-static"]["ms_per_forward"] for r in rounds]
        split[phase] = {k: statistics.median(p[k] for p in parts) for k in parts[0]}
        if not capture:
            # Plain generate's own wall per static forward count: the step it is compared with.
            split[phase]["generate_wall_per_step"] = statistics.median(
                1000
                * r[phase]["vllm-generate"]["wall_s"]
                / max(r[phase]["vllm-static"]["forwards"], 1)
                for r in rounds
            )
    return {"ratios": ratios, "ms_per_forward": split}


def main(argv: list[str] | None = None) -> int:
    from ie_core.runner import run

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-model-len", type=int, default=512)
    args = parser.parse_args(argv)
    engines = {b: load(b, args.max_model_len) for b in ("vllm-static", "vllm-generate")}
    static = engines["vllm-static"]
    every = [f"resid_post.{i}" for i in range(static.n_layers)]
    for model in engines.values():
        run(_job(model, 1, 4, None))  # warm-up
    run(_job(static, 1, 4, every))
    with LoadSampler() as sampler:
        rounds = [one_round(engines, every, args.new_tokens) for _ in range(args.rounds)]
    for model in engines.values():
        run(model.shutdown())
    results = {"model": MODEL, "new_tokens": args.new_tokens, **summarize(rounds), "rounds": rounds}
    results |= {"settle_s": SETTLE_S, "load": sampler.summary(), "quiet": sampler.quiet() is True}
    text = json.dumps(results, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(json.dumps({k: results[k] for k in ("ratios", "ms_per_forward")}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
