"""Circuit tracing speed on SmolLM2 (random per-layer transcoders of a given width, or a trained
set, in circuit-tracer's format), ie against circuit-tracer 0.5.0 on the same ids (circuit-tracer's
special token first):

- one prompt's graph time and peak RSS: ie on eager, ie on vLLM (engine start excluded), and
  circuit-tracer in its own environment;
- graphs per minute over a batch of prompts: ie's `attribute_many` (one batched capture) on vLLM
  and on eager, against circuit-tracer one prompt after another.

Each backend runs in a fresh process (peak RSS is that process's), with one warm-up graph first.
The backends run in turn within each round (`--rounds`), so the ratios of one round are taken
under the same load; the load average is recorded beside each. Figures taken while other work
runs on the machine are "under load", not results.

    uv run python packages/ie-core/scripts/circuit_tracing_bench.py --python /tmp/ct/bin/python \\
        --out /tmp/circuits_bench.json [--width 256 | --transcoders DIR] [--rounds 1] \\
        [--n-prompts 4] [--no-vllm]

(circuit-tracer's environment: see circuit_tracer_parity.py.)
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
from typing import Any

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


def _ids(prompts: list[str]) -> tuple[Path, list[list[int]]]:
    """SmolLM2's offline folder and the ids circuit-tracer attributes for each prompt."""
    sys.path.insert(0, str(PARITY.parent))
    from circuit_tracer_parity import _special_first
    from ie_eager import smollm2
    from transformers import AutoTokenizer

    folder = smollm2.convert()
    tok = AutoTokenizer.from_pretrained(str(folder))
    plain = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    return folder, [_special_first(tok, ids) for ids in plain]


def _described(args: argparse.Namespace) -> str:
    if args.transcoders is None:
        return f"random, per-layer, width {args.width}"
    from safetensors import safe_open

    with safe_open(str(args.transcoders / "layer_0.safetensors"), "pt") as f:
        width = f.get_slice("W_enc").get_shape()[0]
    return f"trained, per-layer, width {width} ({args.transcoders.name})"


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _measure_ie(backend: str, tc: str, prompts: list[str]) -> dict[str, object]:
    """In this (fresh) process: load, a warm-up graph, the first prompt's graph, then the batch."""
    import torch
    from ie_core import load_model
    from ie_core.circuits import attribute, attribute_many
    from ie_core.circuits.weights import weights_for
    from ie_core.runner import run
    from ie_eager import smollm2

    torch.set_num_threads(os.cpu_count() or 1)
    folder, ids = _ids(prompts)
    extra = {"max_model_len": 256} if backend == "vllm" else {"dtype": "float32"}
    model = load_model(smollm2.MODEL_ID, backend=backend, **extra)
    try:
        w = weights_for(model, str(folder) if backend == "vllm" else None)
        attribute(model, ids[0], tc, weights=w)  # warm-up
        load = os.getloadavg()[0]
        start = time.perf_counter()
        g = attribute(model, ids[0], tc, weights=w)
        single, rss = time.perf_counter() - start, _rss_mib()
        start = time.perf_counter()
        graphs = attribute_many(model, ids, tc, weights=w)
        batch = time.perf_counter() - start
    finally:
        run(model.shutdown())
    return {
        "backend": backend,
        "single_seconds": single,
        "single_nodes": g.n_nodes,
        "peak_rss_mib_single": rss,
        "batch_seconds": batch,
        "batch_nodes": [x.n_nodes for x in graphs],
        "graphs_per_minute": 60 * len(graphs) / batch,
        "peak_rss_mib_batch": _rss_mib(),
        "load_average_1min": [load, os.getloadavg()[0]],
    }


def _ie(backend: str, tc: Path, prompts: list[str]) -> dict[str, object]:
    code = [sys.executable, __file__, "--child", backend, "--tc", str(tc)]
    code += ["--prompts", json.dumps(prompts)]
    out = subprocess.run(code, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _circuit_tracer(python: str, tc: Path, prompts: list[str], work: Path) -> dict[str, object]:
    """circuit-tracer's child: a warm-up graph, then each prompt's graph one by one."""
    import torch

    folder, ids = _ids(prompts)  # puts circuit_tracer_parity on the path
    from circuit_tracer_parity import _for_transformers4

    ct_folder = work / f"hf4-{folder.name}"
    if not ct_folder.exists():
        _for_transformers4(folder, work)
    out = work / "ct.pt"
    load = os.getloadavg()[0]
    subprocess.run(
        [python, str(CHILD), str(ct_folder), str(tc), json.dumps(ids), str(out)], check=True
    )
    r = torch.load(out, weights_only=False)
    return {
        "single_seconds": r["seconds"][0],
        "single_nodes": r["nodes"][0],
        "peak_rss_mib_single": r["peak_rss_mib"][0],
        "one_by_one_seconds": r["seconds"],
        "batch_nodes": r["nodes"],
        "graphs_per_minute": 60 * len(ids) / sum(r["seconds"]),
        "peak_rss_mib_batch": r["peak_rss_mib"][-1],
        "load_average_1min": [load, os.getloadavg()[0]],
    }


def _ratios(r: dict[str, Any]) -> dict[str, float]:
    """ie over circuit-tracer within one round: time ratios (< 1: ie faster), rate ratios."""
    ct, out = r.get("circuit_tracer"), {}
    if ct is None:
        return out
    for name in ("ie_eager", "ie_vllm"):
        if name in r:
            out[f"{name}_single_time_over_ct"] = r[name]["single_seconds"] / ct["single_seconds"]
            rate = r[name]["graphs_per_minute"] / ct["graphs_per_minute"]
            out[f"{name}_batch_graphs_per_minute_over_ct"] = rate
    return out


def _round(args: argparse.Namespace, tc: Path, work: Path) -> dict[str, Any]:
    r: dict[str, Any] = {}
    prompts = list(PROMPTS[: args.n_prompts])
    if args.python:
        r["circuit_tracer"] = _circuit_tracer(args.python, tc, prompts, work)
    r["ie_eager"] = _ie("eager", tc, prompts)
    if not args.no_vllm:
        r["ie_vllm"] = _ie("vllm", tc, prompts)
    r["ratios"] = _ratios(r)
    return r


def main() -> None:
    p = argparse.ArgumentParser(description="circuit tracing time and memory on SmolLM2")
    p.add_argument("--python", help="circuit-tracer's venv interpreter (omit to skip it)")
    p.add_argument("--out", type=Path, help="the result file (required)")
    p.add_argument("--width", type=int, default=256, help="features per random transcoder")
    p.add_argument(
        "--transcoders", type=Path,
        help="a trained set's folder (circuit-tracer's per-layer format; docs/examples/"
        "transcoders_smollm2.py writes one) instead of random transcoders",
    )  # fmt: skip
    p.add_argument("--rounds", type=int, default=1, help="circuit-tracer, eager, vLLM in turn")
    p.add_argument("--no-vllm", action="store_true")
    p.add_argument("--n-prompts", type=int, default=len(PROMPTS), help="batch: the first N prompts")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--tc", help=argparse.SUPPRESS)
    p.add_argument("--prompts", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(_measure_ie(args.child, args.tc, json.loads(args.prompts))))
        return
    if args.out is None:
        p.error("--out is required")
    start, load = time.perf_counter(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        tc = args.transcoders or _set(Path(tmp) / "tc", args.width)
        rounds = [_round(args, tc, Path(tmp)) for _ in range(args.rounds)]
    result = {
        "model": "HuggingFaceTB/SmolLM2-135M-Instruct (offline folder)",
        "transcoders": _described(args),
        "prompts": list(PROMPTS[: args.n_prompts]),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "load_note": "under load unless the machine ran nothing else",
        "load_average_1min": [load, os.getloadavg()[0]],
        "wall_seconds": time.perf_counter() - start,
        "rounds": rounds,
        "same_work": "every backend attributes the same ids (circuit-tracer's special token "
        "first); node counts recorded per graph",
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
