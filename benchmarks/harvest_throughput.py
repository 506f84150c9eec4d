"""Tokens harvested per second: `resid_post` at one layer and at every layer, over the same
corpus windows, for ie's harvest on eager / hooked vLLM / vllm-static, a TransformerLens
`run_with_cache` loop, an nnsight `trace` loop, and vanilla vLLM prefill of the same windows
(`max_new_tokens=1`, the physical ceiling: the forward alone).

The ie variants run `ie_core.harvest.harvest` end to end (tokenized windows in, fp32 shards on
disk); the peer loops keep rows on the host and write nothing, so disk time counts against ie
only. One variant is loaded at a time (its engine shut down before the next). The corpus is
Newton's Opticks as shipped in the apache-tvm-ffi wheel, else a deterministic generated text.
Results: JSON + markdown under --out. Publish figures only from a run on an otherwise idle machine.

    uv run --locked python benchmarks/harvest_throughput.py --tokens 32768 --context 256
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import random
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from importlib.util import find_spec
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "harvest-results"
VARIANTS = ("vllm-prefill", "ie-eager", "vllm", "vllm-static", "transformer-lens", "nnsight")
OPTICKS = ("tvm_ffi", "3rdparty/libbacktrace/Isaac.Newton-Opticks.txt")


def corpus() -> tuple[str, list[str]]:
    """Paragraphs of the shipped Opticks text, or a deterministic stand-in."""
    spec = find_spec(OPTICKS[0])
    if spec and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))) / OPTICKS[1]
        if path.is_file():
            text = path.read_text(encoding="utf-8", errors="replace")
            return str(path), [p.strip() for p in text.split("\n\n") if p.strip()]
    rng = random.Random(0)
    words = [
        "light",
        "ray",
        "colour",
        "prism",
        "refraction",
        "glass",
        "lens",
        "the",
        "of",
        "and",
        "a",
        "is",
        "in",
        "by",
    ]
    docs = [" ".join(rng.choice(words) for _ in range(rng.randint(20, 200))) for _ in range(4000)]
    return "generated (seed 0)", docs


def windows_of(model: Any, docs: list[str], context: int, tokens: int) -> list[list[int]]:
    from ie_core.harvest import make_windows

    made = make_windows(docs, model.to_tokens, context=context, max_tokens=tokens)
    return [list(w.tokens) for w in made]


def _timed(fn: Callable[[], Any]) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def ie_variant(
    backend: str, folder: str, args: argparse.Namespace, docs: list[str]
) -> dict[str, Any]:
    from ie_core import load_model
    from ie_core.harvest import harvest
    from ie_core.runner import run

    kw = {"max_model_len": args.context + 8} if backend != "eager" else {}
    model = load_model(folder, backend=backend, **kw)
    out: dict[str, Any] = {}
    try:
        for label, points in _point_sets(model.n_layers).items():
            with tempfile.TemporaryDirectory() as tmp:
                common = {"documents": docs, "context": args.context, "progress": False}
                harvest(model, Path(tmp) / "warm", points, max_tokens=args.context * 2, **common)
                seconds = _timed(
                    functools.partial(
                        harvest, model, Path(tmp) / "h", points, max_tokens=args.tokens, **common
                    )
                )
            out[label] = args.tokens / seconds
    finally:
        run(model.shutdown())
    return out


def prefill_variant(folder: str, args: argparse.Namespace, docs: list[str]) -> dict[str, Any]:
    from ie_core import SamplingParams, load_model
    from ie_core.runner import run

    model = load_model(folder, backend="vllm-generate", max_model_len=args.context + 8)
    one = SamplingParams(max_new_tokens=1, stop_at_eos=False)
    try:
        windows = windows_of(model, docs, args.context, args.tokens)

        async def all_windows(ws: list[list[int]]) -> None:
            await asyncio.gather(*(model.generate(w, one) for w in ws))

        run(all_windows(windows[:2]))
        seconds = _timed(lambda: run(all_windows(windows)))
    finally:
        run(model.shutdown())
    rate = args.tokens / seconds
    return {"one layer": rate, "every layer": rate}


def _point_sets(n_layers: int) -> dict[str, list[str]]:
    return {
        "one layer": [f"resid_post.{n_layers // 2}"],
        "every layer": [f"resid_post.{i}" for i in range(n_layers)],
    }


def _batched(windows: list[list[int]], batch: int) -> list[Any]:
    import torch

    groups: dict[int, list[list[int]]] = {}
    for w in windows:
        groups.setdefault(len(w), []).append(w)
    return [
        torch.tensor(ws[i : i + batch]) for ws in groups.values() for i in range(0, len(ws), batch)
    ]


def _peer_loop(
    step: Callable[[Any, int], list[Any]], batches: list[Any], layers: list[int]
) -> float:
    import torch

    rows: list[Any] = []

    def loop() -> None:
        with torch.no_grad():
            for ids in batches:
                rows.extend(t.reshape(-1, t.shape[-1]).cpu() for t in step(ids, len(layers)))

    step(batches[0][:1], 1)
    return _timed(loop)


def transformer_lens_variant(
    folder: str, args: argparse.Namespace, windows: list[list[int]]
) -> dict[str, Any]:
    import torch
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers(folder, device="cpu", dtype=torch.float32)
    n_layers = bridge.cfg.n_layers
    out: dict[str, Any] = {}
    for label, points in _point_sets(n_layers).items():
        layers = [int(p.rsplit(".", 1)[1]) for p in points]
        names = {f"blocks.{i}.hook_resid_post" for i in layers}

        def step(ids: Any, _: int, names: set[str] = names) -> list[Any]:
            _, cache = bridge.run_with_cache(ids, names_filter=lambda n: n in names)
            return [cache[n] for n in sorted(names)]

        out[label] = args.tokens / _peer_loop(step, _batched(windows, args.batch_windows), layers)
    return out


def nnsight_variant(
    folder: str, args: argparse.Namespace, windows: list[list[int]]
) -> dict[str, Any]:
    import torch
    from nnsight import LanguageModel

    lm = LanguageModel(folder, dispatch=True, dtype=torch.float32, attn_implementation="eager")
    n_layers = lm.config.num_hidden_layers
    out: dict[str, Any] = {}
    for label, points in _point_sets(n_layers).items():
        layers = [int(p.rsplit(".", 1)[1]) for p in points]

        def step(ids: Any, _: int, layers: list[int] = layers) -> list[Any]:
            saved: list[Any] = []
            with lm.trace(ids):
                for i in layers:
                    saved.append(lm.model.layers[i].output.save())
            return [s[0] if isinstance(s, tuple) else s for s in saved]

        out[label] = args.tokens / _peer_loop(step, _batched(windows, args.batch_windows), layers)
    return out


def markdown(result: dict[str, Any]) -> str:
    rows = result["tokens_per_s"]
    ceiling = rows.get("vllm-prefill", {}).get("one layer")
    tl = rows.get("transformer-lens", {})
    lines = [
        f"# Harvest throughput: {result['model']}",
        "",
        f"{result['tokens']} tokens in windows of {result['context']} ({result['corpus']}); "
        f"{result['machine']}; {result['when']}.",
        "",
        "| variant | one layer tok/s | every layer tok/s | one layer / prefill | one layer / TL |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, r in rows.items():
        if "error" in r:
            lines.append(f"| {name} | error: {r['error'][:80]} | | | |")
            continue
        one, every = r["one layer"], r["every layer"]
        vs_ceiling = f"{one / ceiling:.2f}" if ceiling else "-"
        vs_tl = f"{one / tl['one layer']:.1f}" if "one layer" in tl else "-"
        lines.append(f"| {name} | {one:,.0f} | {every:,.0f} | {vs_ceiling} | {vs_tl} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--context", type=int, default=256)
    p.add_argument(
        "--batch-windows", type=int, default=8, help="windows per forward in the peer loops"
    )
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from ie_core.models import resolve_model_path

    folder = str(resolve_model_path(args.model) or args.model)
    source, docs = corpus()
    result: dict[str, Any] = {
        "model": args.model, "tokens": args.tokens, "context": args.context, "corpus": source,
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
        "when": datetime.now(UTC).isoformat(timespec="seconds"), "tokens_per_s": {},
    }  # fmt: skip
    windows: list[list[int]] | None = None
    for name in args.variants.split(","):
        print(f"{name} ...", flush=True)
        try:
            if name == "vllm-prefill":
                rates = prefill_variant(folder, args, docs)
            elif name in ("ie-eager", "vllm", "vllm-static"):
                rates = ie_variant(name.removeprefix("ie-"), folder, args, docs)
            else:
                if windows is None:
                    from ie_core import load_model

                    windows = windows_of(
                        load_model(folder, backend="eager"), docs, args.context, args.tokens
                    )
                peer = transformer_lens_variant if name == "transformer-lens" else nnsight_variant
                rates = peer(folder, args, windows)
        except Exception as exc:  # a variant that cannot run is reported, the others still run
            rates = {"error": f"{type(exc).__name__}: {exc}"}
        result["tokens_per_s"][name] = rates
        print(f"{name}: {rates}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "harvest_throughput.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "harvest_throughput.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
