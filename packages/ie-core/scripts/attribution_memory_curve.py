"""Peak memory and time of one attribution graph on SmolLM2 as the prompt grows (issue 67): ie's
`attribute` (then `prune`, as `ie trace` does) on eager (and vLLM with `--engines`), beside
circuit-tracer 0.5.0 in its own environment, on the same ids: the tokenizer's BOS, then the first
N - 1 tokens of Newton's Opticks (the worked example's corpus).

Each (engine, length) point runs in a fresh process, watched from here: its process tree's
resident memory is sampled every 0.2 s and the tree is stopped past `--max-rss-gib` or
`--timeout` (recorded as such, not as a result). The child reports its own peak (ru_maxrss),
after attribution and after pruning. Beside each ie point: `ie fit`'s price of the attribution at
that length, at the measured active features (`ie_core.fit`). The JSON is rewritten after every
point, so a stopped run keeps what it measured. Figures taken while other work runs on the
machine are "under load", not results.

    uv run python packages/ie-core/scripts/attribution_memory_curve.py --out curve.json \\
        --transcoders OUT/transcoders --python CT_VENV/bin/python \\
        [--tokens 128 256 512 1024 2048 4096] [--engines ie-eager circuit-tracer ie-vllm]

(circuit-tracer's environment: see circuit_tracer_parity.py; OUT/transcoders:
docs/examples/transcoders_smollm2.py. Without --transcoders, random width-`--width` ones.)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
CT_CHILD = HERE / "attribution_curve_ct_child.py"
OPTICKS = "tvm_ffi/3rdparty/libbacktrace/Isaac.Newton-Opticks.txt"
N_LAYERS = 30  # SmolLM2-135M


def _folder() -> Path:
    from ie_eager import smollm2

    return smollm2.convert()


def _prompt_ids(n: int) -> list[int]:
    """BOS (circuit-tracer's special token first), then the first n - 1 tokens of Opticks."""
    import importlib.util

    sys.path.insert(0, str(HERE))
    from circuit_tracer_parity import _special_first
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec(OPTICKS.split("/")[0])
    root = Path(next(iter(spec.submodule_search_locations or []))) if spec else None
    if root is None:
        raise SystemExit(f"the corpus {OPTICKS} is not installed (tvm_ffi)")
    text = (root / OPTICKS.split("/", 1)[1]).read_text(errors="replace")
    tok = AutoTokenizer.from_pretrained(str(_folder()))
    plain = tok(text[: 40 * n], add_special_tokens=False)["input_ids"]
    ids = _special_first(tok, plain[: n - 1])
    if len(ids) != n:
        raise SystemExit(f"could not build a {n}-token prompt (got {len(ids)})")
    return ids


def _tree_rss(root: int) -> int:
    """Resident bytes of `root`'s process group (vLLM's engine core is a child process)."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != root:
                continue
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except (OSError, ProcessLookupError):
            continue
    return total


def _watched(cmd: list[str], limit: int, timeout: float) -> dict[str, Any]:
    """Run `cmd` in its own process group; its last stdout line as JSON, with the sampled peak
    of the group; stopped past `limit` bytes or `timeout` seconds."""
    start, peak, stopped = time.perf_counter(), 0, ""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
    while proc.poll() is None:
        peak = max(peak, _tree_rss(proc.pid))
        if peak > limit:
            stopped = f"stopped: resident memory over {limit / 2**30:g} GiB"
        elif time.perf_counter() - start > timeout:
            stopped = f"stopped: over {timeout:g} s"
        if stopped:
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.2)
    out = proc.communicate()[0]
    result: dict[str, Any] = {"wall_seconds": time.perf_counter() - start}
    result["sampled_peak_rss_mib"] = peak / 2**20
    if stopped or proc.returncode:
        result["failed"] = stopped or f"exit status {proc.returncode}"
        return result
    return {**result, **json.loads(out.strip().splitlines()[-1])}


def _measure_ie(backend: str, tc: str, ids: list[int], cap: int | None, batch: int) -> None:
    """In this (fresh) process: load, one graph, its pruning; one JSON line."""
    import torch
    from ie_core import load_model
    from ie_core.circuits import attribute, prune
    from ie_core.circuits.weights import weights_for
    from ie_core.runner import run
    from ie_eager import smollm2

    def rss() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    torch.set_num_threads(os.cpu_count() or 1)
    extra = {"max_model_len": max(256, len(ids) + 1)} if backend == "vllm" else {"dtype": "float32"}
    model = load_model(smollm2.MODEL_ID, backend=backend, **extra)
    try:
        w = weights_for(model, str(_folder()) if backend == "vllm" else None)
        loaded, start = rss(), time.perf_counter()
        g = attribute(model, ids, tc, weights=w, max_feature_nodes=cap, batch_size=batch)
        seconds, after = time.perf_counter() - start, rss()
        start = time.perf_counter()
        prune(g)
        pruned = time.perf_counter() - start
    finally:
        run(model.shutdown())
    print(json.dumps({
        "seconds_attribute": seconds, "seconds_prune": pruned, "nodes": g.n_nodes,
        "active_features": int(g.active_features.shape[0]), "peak_rss_mib_loaded": loaded,
        "peak_rss_mib_attribute": after, "peak_rss_mib": rss(),
    }))  # fmt: skip


def _priced(tokens: int, active: int, cap: int | None) -> dict[str, Any]:
    """`ie fit`'s price of the attribution at this length, at the measured active features."""
    from ie_core.fit import model_shape, read_checkpoint
    from ie_core.fit.attribution import attribution_items

    shape = model_shape(read_checkpoint(_folder()).config)
    items = attribution_items(shape, tokens, active / (N_LAYERS * tokens), cap)
    return {i.name: i.nbytes / 2**20 for i in items} | {
        "sum_mib": sum(i.nbytes for i in items) / 2**20,
        "peak_phase": items[-1].note,
    }


def _point(args: argparse.Namespace, engine: str, n: int, tc: Path, work: Path) -> dict[str, Any]:
    ids_file = work / f"ids_{n}.json"
    ids_file.write_text(json.dumps(_prompt_ids(n)))
    cap = "none" if args.max_feature_nodes is None else str(args.max_feature_nodes)
    if engine == "circuit-tracer":
        sys.path.insert(0, str(HERE))
        from circuit_tracer_parity import _for_transformers4

        hf4 = work / f"hf4-{_folder().name}"
        if not hf4.exists():
            _for_transformers4(_folder(), work)
        cmd = [
            args.python,
            str(CT_CHILD),
            str(hf4),
            str(tc),
            str(ids_file),
            cap,
            str(args.batch_size),
        ]
    else:
        backend = engine.removeprefix("ie-")
        cmd = [sys.executable, __file__, "--child", backend, "--tc", str(tc),
               "--ids", str(ids_file), "--cap", cap, "--batch-size", str(args.batch_size)]  # fmt: skip
    load = os.getloadavg()[0]
    r = _watched(cmd, int(args.max_rss_gib * 2**30), args.timeout)
    r |= {"engine": engine, "tokens": n, "load_average_1min": [load, os.getloadavg()[0]]}
    if engine.startswith("ie-") and "active_features" in r:
        r["ie_fit_price_mib"] = _priced(n, r["active_features"], args.max_feature_nodes)
    return r


def _transcoders(args: argparse.Namespace, work: Path) -> tuple[Path, str]:
    if args.transcoders is not None:
        return args.transcoders, f"trained ({args.transcoders})"
    from ie_core.circuits import random_transcoder, write_layer_file

    folder = work / "tc"
    folder.mkdir()
    for layer in range(N_LAYERS):  # SmolLM2-135M: d_model 576
        tc = random_transcoder(576, args.width, layer, seed=500 + layer)
        write_layer_file(tc, folder / f"layer_{layer}.safetensors")
    return folder, f"random, per-layer, width {args.width}"


def main() -> None:
    p = argparse.ArgumentParser(description="attribution memory vs prompt length on SmolLM2")
    p.add_argument("--out", type=Path, help="the result JSON (required)")
    p.add_argument("--tokens", type=int, nargs="+", default=[128, 256, 512, 1024, 2048, 4096])
    p.add_argument("--engines", nargs="+", default=["ie-eager", "circuit-tracer"],
                   choices=["ie-eager", "ie-vllm", "circuit-tracer"])  # fmt: skip
    p.add_argument("--python", help="circuit-tracer's venv interpreter (needed for it)")
    p.add_argument(
        "--transcoders", type=Path, help="a trained per-layer set (the worked example's)"
    )
    p.add_argument("--width", type=int, default=1024, help="random transcoders' width otherwise")
    p.add_argument("--max-feature-nodes", type=int, default=8192,
                   help="both engines' feature cap (circuit-tracer's demos use 8192)")  # fmt: skip
    p.add_argument("--batch-size", type=int, default=256, help="targets per backward pass")
    p.add_argument("--max-rss-gib", type=float, default=20.0, help="stop a point past this")
    p.add_argument("--timeout", type=float, default=3600.0, help="stop a point past this (s)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--tc", help=argparse.SUPPRESS)
    p.add_argument("--ids", help=argparse.SUPPRESS)
    p.add_argument("--cap", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        cap = None if args.cap == "none" else int(args.cap)
        ids = json.loads(Path(args.ids).read_text())
        _measure_ie(args.child, args.tc, ids, cap, args.batch_size)
        return
    if args.out is None:
        p.error("--out is required")
    if "circuit-tracer" in args.engines and not args.python:
        p.error("circuit-tracer needs --python (its own environment's interpreter)")
    result: dict[str, Any] = {
        "model": "HuggingFaceTB/SmolLM2-135M-Instruct (offline folder), fp32, CPU",
        "prompt": f"BOS + the first N - 1 tokens of {OPTICKS}",
        "max_feature_nodes": args.max_feature_nodes,
        "batch_size": args.batch_size,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "load_note": "under load unless the machine ran nothing else",
        "points": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        tc, result["transcoders"] = _transcoders(args, Path(tmp))
        for n in args.tokens:
            for engine in args.engines:
                result["points"].append(_point(args, engine, n, tc, Path(tmp)))
                args.out.write_text(json.dumps(result, indent=1) + "\n")
                print(json.dumps(result["points"][-1]), flush=True)


if __name__ == "__main__":
    main()
