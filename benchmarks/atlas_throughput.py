"""Tokens per second of `ie atlas` (every feature's top-k, count, sum, histogram and band samples
over the corpus, then the kept contexts and the decoder's logits) on eager, hooked vLLM and
vllm-static, against vLLM's own prefill of the same windows (`max_new_tokens=1`, no taps: the
forward alone) and SAEDashboard 0.8.0 on the same model, dictionary and windows (its own
environment, `atlas_saedashboard.py`). SmolLM2-135M, a random ReLU dictionary (16384 wide by
default, each feature firing on 0.5% of tokens) written in SAELens's folder layout at one layer, windows of Newton's Opticks as shipped
in the apache-tvm-ffi wheel (else a generated text).

Each variant runs in its own process (`--child`), one after another; the model's load is not
timed, a two-window warm-up runs first (compilation, the dictionary's upload). For `ie atlas`
the JSON holds the whole run's rate and the pass's alone (`pass_tokens_per_s`: without the step
after it, whose logits through the unembed cost the same whatever the corpus). Peak memory is
that process's `ru_maxrss` and its largest reaped child's (vLLM's engine core). The JSON also
holds the bytes per token that cross from where the rows live: dense fp32 activations
(`4 * d_sae`) against the atlas reducer's one sparse entry per window, measured on the first
windows. Run it alone; publish figures
only from a run on an otherwise idle machine.

    uv venv /tmp/saedash-env --python 3.11
    uv pip install --python /tmp/saedash-env/bin/python sae-dashboard==0.8.0 torch==2.13.0 "pyarrow<21"
    uv run --locked python benchmarks/atlas_throughput.py --saedashboard-python /tmp/saedash-env/bin/python

Smoke run: `--tokens 1024 --width 1024`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "atlas-results"
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
VARIANTS = ("vllm-prefill", "ie-eager", "vllm", "vllm-static", "saedashboard")
BACKENDS = {"ie-eager": "eager", "vllm": "vllm", "vllm-static": "vllm-static"}


def write_dictionary(folder: Path, rows: Any, width: int, layer: int, firing: float) -> Path:
    """A random ReLU SAE at resid_post.`layer` in SAELens's layout (cfg.json + weights). Each
    feature's encoder bias sets its firing rate on `rows` (a few windows' rows at that point) to
    `firing`, as sparse as a trained dictionary (random directions with a zero bias would fire
    on about half the tokens, which no trained one does)."""
    import torch
    from safetensors.torch import save_file

    d_in = int(rows.shape[-1])
    g = torch.Generator().manual_seed(0)
    folder.mkdir(parents=True, exist_ok=True)
    w_enc = torch.randn(d_in, width, generator=g) / d_in**0.5
    pre = rows.reshape(-1, d_in).float() @ w_enc
    weights = {
        "W_enc": w_enc,
        "b_enc": -torch.quantile(pre, 1.0 - firing, dim=0),
        "W_dec": torch.randn(width, d_in, generator=g) / width**0.5,
        "b_dec": torch.zeros(d_in),
    }
    save_file(weights, str(folder / "sae_weights.safetensors"))
    cfg = {"architecture": "standard", "d_in": d_in, "d_sae": width, "dtype": "float32",
           "hook_name": f"blocks.{layer}.hook_resid_post", "hook_layer": layer,
           "apply_b_dec_to_input": False, "activation_fn_str": "relu",
           "model_name": MODEL, "context_size": 128, "device": "cpu"}  # fmt: skip
    (folder / "cfg.json").write_text(json.dumps(cfg))
    return folder


def documents() -> tuple[str, list[str]]:
    from harvest_throughput import corpus  # the harvest benchmark's corpus, shared

    return corpus()


def peak_rss() -> dict[str, float]:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"peak_rss_mib": round(own, 1), "peak_rss_child_mib": round(child, 1)}


def child(variant: str, cfg: dict[str, Any]) -> dict[str, Any]:
    if variant == "vllm-prefill":
        return prefill(cfg)
    return ie_atlas(BACKENDS[variant], cfg)


def ie_atlas(backend: str, cfg: dict[str, Any]) -> dict[str, Any]:
    from ie_core import load_model
    from ie_core.atlas.dictionary import read_dictionary
    from ie_core.atlas.running import atlas
    from ie_core.runner import run

    sae = read_dictionary(cfg["dictionary"])
    extra: dict[str, Any] = {"max_model_len": cfg["context"] + 8}
    if backend == "eager":
        extra = {"dtype": "float32"}
    elif backend == "vllm-static":
        extra["static_points"] = [sae.address]
    model = load_model(cfg["model"], backend=backend, **extra)
    docs = json.loads(Path(cfg["documents"]).read_text())
    common = {"documents": docs, "context": cfg["context"], "top_k": cfg["top_k"],
              "batch_windows": cfg["batch_windows"], "progress": False}  # fmt: skip
    finish = _timed_finish()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            atlas(model, sae, Path(tmp) / "warm", max_tokens=2 * cfg["context"], **common)
            finish.clear()
            began = time.perf_counter()
            result = atlas(model, sae, Path(tmp) / "atlas", max_tokens=cfg["tokens"], **common)
            seconds = time.perf_counter() - began
    finally:
        run(model.shutdown())
    passed = seconds - sum(finish)
    return {"tokens": result.tokens, "windows": result.windows, "seconds": seconds,
            "tokens_per_s": result.tokens / seconds, "finish_seconds": sum(finish),
            "pass_tokens_per_s": result.tokens / passed, **peak_rss()}  # fmt: skip


def _timed_finish() -> list[float]:
    """The seconds of the step after the pass (kept contexts re-run, the decoder's logits
    through the unembed: a cost of the dictionary, not of the corpus), timed apart."""
    import ie_core.atlas.running as running

    spent: list[float] = []
    real = running._finish

    def timed(*args: Any) -> None:
        began = time.perf_counter()
        real(*args)
        spent.append(time.perf_counter() - began)

    running._finish = timed  # type: ignore[assignment]
    return spent


def prefill(cfg: dict[str, Any]) -> dict[str, Any]:
    from ie_core import SamplingParams, load_model
    from ie_core.runner import run

    model = load_model(cfg["model"], backend="vllm-generate", max_model_len=cfg["context"] + 8)
    windows = json.loads(Path(cfg["windows"]).read_text())
    one = SamplingParams(max_new_tokens=1, stop_at_eos=False)

    async def every(ws: list[list[int]]) -> None:
        await asyncio.gather(*(model.generate(w, one) for w in ws))

    try:
        run(every(windows[:2]))
        began = time.perf_counter()
        run(every(windows))
        seconds = time.perf_counter() - began
    finally:
        run(model.shutdown())
    tokens = sum(len(w) for w in windows)
    return {"tokens": tokens, "windows": len(windows), "seconds": seconds,
            "tokens_per_s": tokens / seconds, **peak_rss()}  # fmt: skip


def bytes_per_token(dictionary: Path, rows: Any, top_k: int) -> dict[str, Any]:
    """What crosses from where the rows live, per corpus token, measured on the first windows'
    rows (the atlas reducer applied to each window as a worker would): the dense fp32
    activations against the reducer's one sparse entry per window."""
    from ie_core.atlas.dictionary import read_dictionary
    from ie_core.reduce import AtlasTopK, Context

    sae = read_dictionary(dictionary)
    reducer = AtlasTopK(sae.key, top_k, 4, (4, -10, 10), 0, sae)
    sent = sum(t.nbytes for window in rows for t in reducer.apply_at(window, 0, Context()).values())
    tokens = int(rows.shape[0] * rows.shape[1])
    return {"dense_fp32": 4 * sae.d_sae, "atlas_topk": round(sent / tokens, 1),
            "atlas_topk_bound": round(reducer.row_bytes(0) / int(rows.shape[1]), 1),
            "measured_on_windows": int(rows.shape[0])}  # fmt: skip


def run_child(cmd: list[str]) -> dict[str, Any]:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        return {"error": f"exit {done.returncode}: " + " | ".join(tail)}
    return json.loads(lines[-1])


def prepare(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """The dictionary, documents and windows every variant reads (tokenized once, here)."""
    from ie_core import load_model
    from ie_core.harvest import make_windows
    from ie_core.models import resolve_model_path

    folder = resolve_model_path(MODEL)
    if folder is None:
        raise SystemExit(f"{MODEL} is not available offline here")
    source, docs = documents()
    model = load_model(str(folder), backend="eager", dtype="float32")
    made = make_windows(docs, model.to_tokens, context=args.context, max_tokens=args.tokens)
    windows = [list(w.tokens) for w in made]
    (tmp / "documents.json").write_text(json.dumps(docs))
    (tmp / "windows.json").write_text(json.dumps(windows))
    from ie_core.runner import run

    some = [w for w in windows[:8] if len(w) == len(windows[0])]
    point = f"resid_post.{args.layer}"
    rows = run(model.capture(some, [point]))[point]
    dictionary = write_dictionary(tmp / "sae", rows, args.width, args.layer, args.firing)
    crossing = bytes_per_token(dictionary, rows, args.top_k)
    return {"model": str(folder), "dictionary": str(dictionary), "corpus": source,
            "documents": str(tmp / "documents.json"), "windows": str(tmp / "windows.json"),
            "tokens": args.tokens, "context": args.context, "top_k": args.top_k,
            "batch_windows": args.batch_windows, "width": args.width, "layer": args.layer,
            "firing": args.firing,
            "saedashboard_features": args.saedashboard_features,
            "bytes_per_token": crossing}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--width", type=int, default=16384)
    ap.add_argument("--layer", type=int, default=15)
    ap.add_argument("--top-k", type=int, default=20)
    ap.add_argument("--firing", type=float, default=0.005, help="each feature's firing rate")
    ap.add_argument("--batch-windows", type=int, default=16)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--saedashboard-python", help="python of an environment with sae-dashboard")
    ap.add_argument(
        "--saedashboard-features",
        type=int,
        default=256,
        help="features SAEDashboard computes (its time scaled to --width)",
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, json.loads(args.config))))
        return 0
    chosen = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = set(chosen) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)}; choose from {VARIANTS}")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = prepare(args, Path(tmp))
        for variant in chosen:
            print(f"[atlas bench] {variant} ...", flush=True)
            if variant == "saedashboard":
                results[variant] = saedashboard(args, cfg)
            else:
                me = [sys.executable, str(Path(__file__).resolve()), "--child", variant]
                results[variant] = run_child([*me, "--config", json.dumps(cfg)])
            print(f"[atlas bench] {variant}: {results[variant]}", flush=True)
    record = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "processor": platform.processor()},
        "config": {
            k: v
            for k, v in cfg.items()
            if k not in ("documents", "windows", "dictionary", "bytes_per_token")
        },
        "bytes_per_token": cfg["bytes_per_token"],
        "results": results,
        "ratios": ratios(results),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "atlas_throughput.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


def saedashboard(args: argparse.Namespace, cfg: dict[str, Any]) -> dict[str, Any]:
    if not args.saedashboard_python:
        return {"error": "not run: pass --saedashboard-python (sae-dashboard 0.8.0 pins its own "
                         "sae-lens / transformer-lens, so it runs from its own environment)"}  # fmt: skip
    script = HERE / "atlas_saedashboard.py"
    return run_child([args.saedashboard_python, str(script), "--config", json.dumps(cfg)])


def ratios(results: dict[str, Any]) -> dict[str, float]:
    def rate(v: str) -> float | None:
        return results.get(v, {}).get("tokens_per_s")

    out = {}
    for v in ("ie-eager", "vllm", "vllm-static"):
        if rate(v) and rate("vllm-prefill"):
            out[f"{v} / vllm-prefill"] = round(rate(v) / rate("vllm-prefill"), 3)  # type: ignore[operator]
        if rate(v) and rate("saedashboard"):
            out[f"{v} / saedashboard"] = round(rate(v) / rate("saedashboard"), 3)  # type: ignore[operator]
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    raise SystemExit(main())
