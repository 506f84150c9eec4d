"""Top-k dictionary features at every token of concurrent generations, against plain generation
on the same engine: hooked vLLM and vllm-static (encode + top-k in the worker), and ie-eager
(generate, capture, encode on the host). SmolLM2-135M, random fp32 dictionaries (16k wide by
default) at one layer and at four. Results go to JSON and markdown; run it alone.

    uv venv /tmp/saelens && uv pip install --python /tmp/saelens/bin/python sae-lens torch==2.13.0
    uv run --locked python packages/ie-vllm/benchmarks/sae_features.py --saelens-python /tmp/saelens/bin/python

SAELens + TransformerLens (sae-lens 6.x pins transformer-lens 3.x, below the 4.x this workspace
locks) runs from that environment as a subprocess (`sae_features_saelens.py`: TransformerBridge
generation, a cached run, SAELens TopK `encode` + top-k); without `--saelens-python` it is
recorded as not run. Smoke run: `--new-tokens 4 --repeats 1 --width 1024`.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from ie_core.experiments.saes import SAE, from_tensors
from ie_core.protocol import SamplingParams
from ie_core.runner import run

HERE = Path(__file__).resolve().parent
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def dictionaries(d: int, width: int, layers: list[int], k: int) -> dict[str, SAE]:
    out = {}
    for i, layer in enumerate(layers):
        g = torch.Generator().manual_seed(i)
        w = {"W_enc": torch.randn(d, width, generator=g) / d**0.5,
             "b_enc": torch.randn(width, generator=g) / 8,
             "W_dec": torch.randn(width, d, generator=g) / 4,
             "b_dec": torch.zeros(d)}  # fmt: skip
        out[f"L{layer}"] = from_tensors(
            w, address=f"resid_post.{layer}", activation="topk", k=k, b_dec_in=True
        )
    return out


def _time(fn: Any, repeats: int) -> float:
    fn()  # warm: compile, first dictionary upload
    return statistics.median(_once(fn) for _ in range(repeats))


def _once(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def vllm_cells(backend: str, args: argparse.Namespace, sets: dict[str, dict[str, SAE]]) -> dict:
    from ie_core.loading import load_model
    from ie_vllm.host.features import generate_with_features

    points = sorted({s.address for saes in sets.values() for s in saes.values()})
    extra = {"static_points": points} if backend == "vllm-static" else {}
    model = load_model(MODEL, backend=backend, max_model_len=512, **extra)
    params = SamplingParams(max_new_tokens=args.new_tokens, stop_at_eos=False)
    prompts = [PROMPT] * args.concurrency
    cells: dict[str, float] = {}
    try:
        cells["plain"] = _time(lambda: run(_plain(model, prompts, params)), args.repeats)
        for name, saes in sets.items():
            cells[name] = _time(
                lambda s=saes: run(generate_with_features(model, prompts, s, params, k=args.k)),
                args.repeats,
            )
    finally:
        run(model.shutdown())
    return cells


async def _plain(model: Any, prompts: list[str], params: SamplingParams) -> Any:
    import asyncio

    return await asyncio.gather(*(model.generate(p, params) for p in prompts))


def eager_cells(args: argparse.Namespace, sets: dict[str, dict[str, SAE]]) -> dict:
    from ie_core.experiments.features import feature_activations
    from ie_core.loading import load_model

    model = load_model(MODEL, backend="eager", dtype="float32")
    params = SamplingParams(max_new_tokens=args.new_tokens, stop_at_eos=False)
    cells: dict[str, float] = {}

    def plain() -> None:
        for _ in range(args.concurrency):
            run(model.generate(PROMPT, params))

    def with_features(saes: dict[str, SAE]) -> None:
        for _ in range(args.concurrency):
            gen = run(model.generate(PROMPT, params))
            ids = [*gen.prompt_ids, *gen.token_ids[:-1]]
            feature_activations(model, [ids], saes, k=args.k)

    cells["plain"] = _time(plain, args.repeats)
    for name, saes in sets.items():
        cells[name] = _time(lambda s=saes: with_features(s), args.repeats)
    return cells


def saelens_cells(args: argparse.Namespace, sets: dict[str, dict[str, SAE]]) -> dict:
    """SAELens + TransformerLens on the same work, from its own environment (a subprocess)."""
    import subprocess

    from ie_core.models import resolve_model_path

    if not args.saelens_python:
        return {"error": "pass --saelens-python (sae-lens pins a transformer-lens below the "
                         "workspace's, so it runs from its own environment)"}  # fmt: skip
    layers = {n: sorted(int(s.address.split(".")[1]) for s in saes.values())
              for n, saes in sets.items()}  # fmt: skip
    config = {"prompt": PROMPT, "sets": layers, "width": args.width, "k": args.k,
              "concurrency": args.concurrency, "new_tokens": args.new_tokens,
              "repeats": args.repeats}  # fmt: skip
    cmd = [args.saelens_python, str(HERE / "sae_features_saelens.py"),
           "--model-folder", str(resolve_model_path(MODEL)), "--config", json.dumps(config)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1:] or ["no output"]
        return {"error": f"the SAELens subprocess failed: {last[0]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backends", default="vllm-static,vllm,eager,saelens")
    ap.add_argument("--saelens-python", help="python of an environment with sae-lens installed")
    ap.add_argument("--width", type=int, default=16384)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=16)  # one run in ~8 min on 2 CPU cores
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "sae_features")
    args = ap.parse_args()
    sets = {
        "1 layer": dictionaries(576, args.width, [10], args.k),
        "4 layers": dictionaries(576, args.width, [3, 10, 17, 24], args.k),
    }
    tokens = args.concurrency * args.new_tokens
    results: dict[str, Any] = {}
    for backend in args.backends.split(","):
        if backend == "saelens":
            backend, cells = "saelens+transformerlens", saelens_cells(args, sets)
        elif backend == "eager":
            cells = eager_cells(args, sets)
        else:
            cells = vllm_cells(backend, args, sets)
        if "error" in cells:
            results[backend] = cells
            continue
        results[backend] = {n: {"seconds": s, "tok_per_s": tokens / s,
                                "vs_plain": cells["plain"] / s} for n, s in cells.items()}  # fmt: skip
    record = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "args": {k: str(v) for k, v in vars(args).items()},
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(record, indent=2))
    lines = ["| backend | cell | tok/s | vs plain |", "| --- | --- | ---: | ---: |"]
    for backend, cells in results.items():
        if "error" in cells:
            lines.append(f"| {backend} | not run: {cells['error']} | | |")
            continue
        for name, c in cells.items():
            lines.append(f"| {backend} | {name} | {c['tok_per_s']:.1f} | {c['vs_plain']:.2f}x |")
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
