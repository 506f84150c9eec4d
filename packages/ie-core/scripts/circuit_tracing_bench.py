"""Graph time and peak memory for one prompt on SmolLM2 (random per-layer transcoders of a given
width, circuit-tracer's format): ie on eager, ie on vLLM (engine start excluded), and
circuit-tracer 0.5.0 in its own environment; plus graphs per minute over a batch of prompts on
vLLM one by one. Each measurement runs in a fresh process (peak RSS is that process's). Writes a
JSON result; figures taken while other work runs on the machine are "under load", not results.

    uv run python packages/ie-core/scripts/circuit_tracing_bench.py --python /tmp/ct/bin/python \\
        --out /tmp/circuits_bench.json [--width 256] [--no-vllm]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPTS = (
    "The capital of France is",
    "Fact: the Eiffel Tower is in the city of",
    "Michael Jordan plays the sport of",
    "The opposite of hot is",
)
CHILD = Path(__file__).with_name("circuit_tracer_child.py")
PARITY = Path(__file__).with_name("circuit_tracer_parity.py")


def _set(folder: Path, width: int) -> Path:
    from ie_core.circuits import random_transcoder, write_layer_file

    folder.mkdir(parents=True, exist_ok=True)
    for layer in range(30):  # SmolLM2-135M: 30 layers, d_model 576
        tc = random_transcoder(576, width, layer, seed=500 + layer)
        write_layer_file(tc, folder / f"layer_{layer}.safetensors")
    return folder


def _measure_ie(backend: str, tc: str, prompts: list[str]) -> dict[str, object]:
    """In this (fresh) process: load, one warm-up graph, then each prompt's graph timed."""
    import torch
    from ie_core import load_model
    from ie_core.circuits import attribute
    from ie_core.runner import run
    from ie_eager import smollm2

    torch.set_num_threads(os.cpu_count() or 1)
    folder = smollm2.convert()
    extra = {"max_model_len": 256} if backend == "vllm" else {"dtype": "float32"}
    model = load_model(smollm2.MODEL_ID, backend=backend, **extra)
    weights = str(folder) if backend == "vllm" else None
    sys.path.insert(0, str(PARITY.parent))
    from circuit_tracer_parity import _special_first
    from transformers import AutoTokenizer

    # The ids circuit-tracer attributes (a special token first), so both do the same work.
    tok = AutoTokenizer.from_pretrained(str(folder))
    ids = [_special_first(tok, tok(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    try:
        from ie_core.circuits.weights import weights_for

        w = weights_for(model, weights)
        attribute(model, ids[0], tc, weights=w)  # warm-up
        times, nodes = [], []
        for p in ids:
            start = time.perf_counter()
            g = attribute(model, p, tc, weights=w)
            times.append(time.perf_counter() - start)
            nodes.append(g.n_nodes)
    finally:
        run(model.shutdown())
    return {
        "backend": backend,
        "seconds": times,
        "nodes": nodes,
        "graphs_per_minute": 60 * len(times) / sum(times),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _ie(backend: str, tc: Path, prompts: list[str]) -> dict[str, object]:
    code = [
        sys.executable,
        __file__,
        "--child",
        backend,
        "--tc",
        str(tc),
        "--prompts",
        json.dumps(prompts),
    ]
    out = subprocess.run(code, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _circuit_tracer(python: str, tc: Path, prompt: str, work: Path) -> dict[str, object]:
    sys.path.insert(0, str(PARITY.parent))
    import torch
    from circuit_tracer_parity import _for_transformers4, _special_first
    from ie_eager import smollm2
    from transformers import AutoTokenizer

    folder = smollm2.convert()
    tok = AutoTokenizer.from_pretrained(str(folder))
    ids = _special_first(tok, tok(prompt, add_special_tokens=False)["input_ids"])
    ct_folder = _for_transformers4(folder, work)
    out = work / "ct.pt"
    subprocess.run(
        [python, str(CHILD), str(ct_folder), str(tc), json.dumps(ids), str(out)], check=True
    )
    r = torch.load(out, weights_only=False)
    return {
        "seconds": r["seconds"],
        "peak_rss_mib": r["peak_rss_mib"],
        "nodes": int(r["adjacency"].shape[0]),
    }


def main() -> None:
    p = argparse.ArgumentParser(description="circuit tracing time and memory on SmolLM2")
    p.add_argument("--python", help="circuit-tracer's venv interpreter (omit to skip it)")
    p.add_argument("--out", type=Path, help="the result file (required)")
    p.add_argument("--width", type=int, default=256, help="features per transcoder")
    p.add_argument("--no-vllm", action="store_true")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--tc", help=argparse.SUPPRESS)
    p.add_argument("--prompts", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(_measure_ie(args.child, args.tc, json.loads(args.prompts))))
        return
    if args.out is None:
        p.error("--out is required")
    with tempfile.TemporaryDirectory() as tmp:
        tc = _set(Path(tmp) / "tc", args.width)
        result: dict[str, object] = {
            "model": "HuggingFaceTB/SmolLM2-135M-Instruct (offline folder)",
            "transcoders": f"random, per-layer, width {args.width}",
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
            "load_note": "under load unless the machine ran nothing else",
            "ie_eager": _ie("eager", tc, list(PROMPTS)),
        }
        if not args.no_vllm:
            result["ie_vllm"] = _ie("vllm", tc, list(PROMPTS))
        if args.python:
            result["circuit_tracer"] = _circuit_tracer(args.python, tc, PROMPTS[0], Path(tmp))
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
