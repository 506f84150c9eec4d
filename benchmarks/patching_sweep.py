"""Benchmark: the full resid_pre patching grid on SmolLM2-135M (every layer x every position of a
14-token IOI pair), on ie-eager, TransformerLens, nnsight, hooked vLLM, vllm-static and the loop a
user writes without any of them (plain torch: one forward per layer, its positions batched), beside
vLLM's own floor for the same work (`vllm-prefill`: the corrupt prompt prefilled once per cell,
nothing patched).

Every engine computes the same 420 cells (metric: logit(" Mary") - logit(" John") at the last
position of the corrupt prompt with one clean row patched in), so the table carries each grid's
max |diff| against ie-eager's beside wall time and cells per second. Loading and one warm-up
sweep are excluded from the timing (the load, an engine's start included, is its own column). Run
it alone (nothing else on the machine):

    uv run --locked python benchmarks/patching_sweep.py --out benchmarks/results/patching_sweep.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
CLEAN = "When John and Mary went to the store, John gave a drink to"
CORRUPT = "When John and Mary went to the store, Mary gave a drink to"
ANSWER, WRONG = " Mary", " John"
ENGINES = (
    "eager",
    "torch-batched",
    "transformer-lens",
    "nnsight",
    "vllm",
    "vllm-static",
    "vllm-prefill",
)
# Not a sweep: the floor an engine sets for this grid, timed the same way but computing no cell.
FLOORS = ("vllm-prefill",)


def _ie(backend: str) -> tuple[Callable[[], torch.Tensor], Callable[[], None]]:
    from ie_core import load_model
    from ie_core.experiments.patching import logit_diff, patch_sweep
    from ie_core.runner import run

    kw: dict[str, Any] = {"dtype": "float32"}
    if backend == "vllm-static":
        kw["static_slots"] = 64
        kw["static_writes"] = [f"resid_pre.{i}" for i in range(30)]
        kw["static_points"] = [*kw["static_writes"], "resid_post.29"]  # writes are also reads
    model = load_model(MODEL, backend=backend, **kw)
    metric = logit_diff(ANSWER, WRONG)

    def sweep() -> torch.Tensor:
        return patch_sweep(model, CLEAN, CORRUPT, metric=metric).values

    return sweep, lambda: run(model.shutdown())


def _vllm_prefill() -> tuple[Callable[[], torch.Tensor], Callable[[], None]]:
    """vLLM's own speed on this grid's work: the corrupt prompt prefilled once per cell (one new
    token each, all in flight together) with nothing patched or captured."""
    import asyncio

    from ie_core import load_model
    from ie_core.protocol import SamplingParams
    from ie_core.runner import run

    model = load_model(MODEL, backend="vllm", dtype="float32")
    ids = model.to_tokens(CORRUPT)
    one = SamplingParams(max_new_tokens=1)

    async def prefill_all() -> None:
        await asyncio.gather(*(model.generate(ids, one) for _ in range(30 * len(ids))))

    def sweep() -> torch.Tensor:
        run(prefill_all())
        return torch.full((30, len(ids)), float("nan"))  # no cell values: a floor

    return sweep, lambda: run(model.shutdown())


def _folder() -> str:
    from ie_eager.smollm2 import source

    return str(source(MODEL))


def _ids(tokenizer: Any, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _transformer_lens() -> tuple[Callable[[], torch.Tensor], Callable[[], None]]:
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers(_folder(), device="cpu", dtype=torch.float32)
    tok = bridge.tokenizer
    clean, corrupt = torch.tensor([_ids(tok, CLEAN)]), torch.tensor([_ids(tok, CORRUPT)])
    a, w = _ids(tok, ANSWER)[0], _ids(tok, WRONG)[0]
    n_layers, seq = bridge.cfg.n_layers, clean.shape[1]

    def sweep() -> torch.Tensor:
        out = torch.zeros(n_layers, seq)
        with torch.no_grad():
            _, cache = bridge.run_with_cache(
                clean, names_filter=lambda n: n.endswith("hook_resid_pre")
            )
            for layer in range(n_layers):
                name = f"blocks.{layer}.hook_resid_pre"
                for p in range(seq):

                    def hook(
                        x: torch.Tensor, hook: Any, p: int = p, name: str = name
                    ) -> torch.Tensor:
                        x[:, p] = cache[name][:, p]
                        return x

                    logits = bridge.run_with_hooks(corrupt, fwd_hooks=[(name, hook)])
                    out[layer, p] = logits[0, -1, a] - logits[0, -1, w]
        return out

    return sweep, lambda: None


def _torch_batched() -> tuple[Callable[[], torch.Tensor], Callable[[], None]]:
    """The best a user writes by hand: a batch of `seq` corrupt copies per layer, row p patched at
    position p by one forward pre-hook on that layer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = _folder()
    tok = AutoTokenizer.from_pretrained(folder)
    hf = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    )
    hf.eval()
    clean, corrupt = torch.tensor([_ids(tok, CLEAN)]), torch.tensor([_ids(tok, CORRUPT)])
    a, w = _ids(tok, ANSWER)[0], _ids(tok, WRONG)[0]
    layers = hf.model.layers
    n_layers, seq = len(layers), clean.shape[1]

    def sweep() -> torch.Tensor:
        out = torch.zeros(n_layers, seq)
        saved: list[torch.Tensor] = []
        grab = [
            blk.register_forward_pre_hook(lambda m, args: saved.append(args[0][0].clone()))
            for blk in layers
        ]
        with torch.no_grad():
            hf(clean)
        for h in grab:
            h.remove()
        rows = torch.arange(seq)
        for layer in range(n_layers):

            def patch(m: Any, args: tuple, layer: int = layer) -> tuple:
                x = args[0].clone()
                x[rows, rows] = saved[layer][rows]
                return (x, *args[1:])

            handle = layers[layer].register_forward_pre_hook(patch)
            with torch.no_grad():
                logits = hf(corrupt.expand(seq, -1)).logits[:, -1]
            handle.remove()
            out[layer] = logits[:, a] - logits[:, w]
        return out

    return sweep, lambda: None


def _nnsight() -> tuple[Callable[[], torch.Tensor], Callable[[], None]]:
    from nnsight import LanguageModel

    lm = LanguageModel(_folder(), dispatch=True, dtype=torch.float32, attn_implementation="eager")
    tok = lm.tokenizer
    clean, corrupt = torch.tensor([_ids(tok, CLEAN)]), torch.tensor([_ids(tok, CORRUPT)])
    a, w = _ids(tok, ANSWER)[0], _ids(tok, WRONG)[0]
    layers = lm.model.layers
    n_layers, seq = len(layers), clean.shape[1]

    def sweep() -> torch.Tensor:
        out = torch.zeros(n_layers, seq)
        with torch.no_grad():
            saved = []
            with lm.trace(clean):  # nnsight runs this block's source: no comprehension scopes
                for i in range(n_layers):
                    saved.append(layers[i].input.clone().save())
            for layer in range(n_layers):
                for p in range(seq):
                    with lm.trace(corrupt):
                        layers[layer].input[:, p] = saved[layer][:, p]
                        logits = lm.output.logits[0, -1].save()
                    out[layer, p] = logits[a] - logits[w]
        return out

    return sweep, lambda: None


def _measure(engine: str) -> dict[str, Any]:
    peers = {
        "transformer-lens": _transformer_lens,
        "nnsight": _nnsight,
        "torch-batched": _torch_batched,
        "vllm-prefill": _vllm_prefill,
    }
    make = peers.get(engine)
    try:
        t0 = time.perf_counter()
        sweep, close = make() if make else _ie(engine)
        setup = time.perf_counter() - t0
        sweep()  # warm-up (compilation, caches)
        start = time.perf_counter()
        grid = sweep()
        wall = time.perf_counter() - start
        close()
    except Exception as exc:  # a peer that cannot run this is a row that says why
        return {"engine": engine, "error": f"{type(exc).__name__}: {exc}"[:400]}
    return {
        "engine": engine,
        "wall_s": wall,
        "setup_s": setup,
        "cells": grid.numel(),
        "cells_per_s": grid.numel() / wall,
        "grid": grid.tolist(),
    }


def _diff(row: dict[str, Any]) -> str:
    if row["engine"] in FLOORS:
        return "no cells (a floor)"
    return f"{row.get('max_abs_diff_vs_eager', float('nan')):.2e}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/patching_sweep.json"))
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    rows = []
    for engine in args.engines.split(","):
        load_before = os.getloadavg()[0]
        row = _measure(engine)
        row["load_avg_1m_before"] = round(load_before, 2)
        row["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "grid"}), flush=True)
    if args.out.exists():  # a rerun of some engines keeps the others' rows
        kept = {r["engine"]: r for r in json.loads(args.out.read_text())["rows"]}
        kept.update({r["engine"]: r for r in rows})
        rows = [kept[e] for e in ENGINES if e in kept]
    ref = next((r for r in rows if r["engine"] == "eager" and "grid" in r), None)
    hand = next((r for r in rows if r["engine"] == "torch-batched" and "grid" in r), None)
    for r in rows:
        if r["engine"] in FLOORS:
            r.pop("grid", None)  # it computed no cell
        if "wall_s" not in r:
            continue
        if ref is not None:
            r["speedup_vs_eager"] = ref["wall_s"] / r["wall_s"]
            if "grid" in r:
                diff = (torch.tensor(r["grid"]) - torch.tensor(ref["grid"])).abs().max()
                r["max_abs_diff_vs_eager"] = float(diff)
        if hand is not None:
            r["speedup_vs_torch_batched"] = hand["wall_s"] / r["wall_s"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"model": MODEL, "clean": CLEAN, "corrupt": CORRUPT, "rows": rows}, indent=1)
        + "\n"
    )
    lines = [
        "| engine | wall s | cells/s | x eager | x torch-batched | max abs diff vs eager | load s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['engine']} | refused: {r['error']} | | | | | |")
        else:
            nan = float("nan")
            lines.append(
                f"| {r['engine']} | {r['wall_s']:.1f} | {r['cells_per_s']:.1f} | "
                f"{r.get('speedup_vs_eager', nan):.2f} | {r.get('speedup_vs_torch_batched', nan):.2f} | "
                f"{_diff(r)} | {r.get('setup_s', nan):.1f} |"
            )
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
