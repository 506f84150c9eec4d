"""Capture overhead of `resid_post` at every layer against a plain forward, on the same weights:
plain torch hooks, ie-eager (direct and through the async protocol), TransformerLens 4.x
(`TransformerBridge.run_with_cache` with a name filter) and nnsight 0.8 (`trace` + `.save()`).

Each method runs round-robin with the others (so drift hits all alike); figures are medians of
the repeats; ratios divide by the plain HF forward's median. Results go to JSON and markdown.

    uv run python packages/ie-eager/benchmarks/capture_overhead.py --threads 2 --repeats 30
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from ie_core.tooling.load_sampling import LoadSampler

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "capture_overhead"


def _hf(folder: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(
        folder, attn_implementation="eager", dtype=torch.float32
    )
    return model.eval(), AutoTokenizer.from_pretrained(folder)


def _ids(tok: Any, n: int) -> torch.Tensor:
    text = "The capital of France is Paris, and the capital of Japan is Tokyo. " * 64
    ids = tok(text)["input_ids"][:n]
    assert len(ids) == n, f"prompt too short for {n} tokens"
    return torch.tensor([ids])


def methods(
    folder: Path, peers: bool
) -> tuple[dict[str, Callable[[torch.Tensor], Any]], dict[str, str]]:
    from ie_core.runner import run
    from ie_eager.backend import load

    hf, tok = _hf(folder)
    n_layers = hf.config.num_hidden_layers
    eager = load(hf, tokenizer=tok, name=str(folder))
    addresses = [f"resid_post.{i}" for i in range(n_layers)]
    versions: dict[str, str] = {}

    def plain(ids: torch.Tensor) -> Any:
        with torch.no_grad():
            return hf(input_ids=ids, use_cache=False).logits

    def hooks(ids: torch.Tensor) -> Any:
        saved: list[torch.Tensor] = []
        handles = [
            layer.register_forward_hook(
                lambda m, a, o: saved.append(o[0] if isinstance(o, tuple) else o)
            )
            for layer in hf.model.layers
        ]
        try:
            with torch.no_grad():
                hf(input_ids=ids, use_cache=False)
        finally:
            for h in handles:
                h.remove()
        return saved

    def ie_direct(ids: torch.Tensor) -> Any:
        return eager.forward_with_cache(ids.tolist(), addresses)[1]

    def ie_protocol(ids: torch.Tensor) -> Any:
        return run(eager.capture(ids.tolist(), addresses))

    table: dict[str, Callable[[torch.Tensor], Any]] = {
        "hf_forward": plain,
        "torch_hooks": hooks,
        "ie_eager": ie_direct,
        "ie_eager_protocol": ie_protocol,
    }
    if peers:
        table.update(_transformer_lens(folder, n_layers, versions))
        table.update(_nnsight(folder, n_layers, versions))
    return table, versions


def _attention_of(model: Any) -> str:
    """The attention implementation an HF model runs (kernels differ: a ratio must say which)."""
    config = getattr(model, "config", None)
    return str(getattr(config, "_attn_implementation", "unknown"))


def _transformer_lens(folder: Path, n_layers: int, versions: dict[str, str]) -> dict[str, Callable]:
    try:
        import transformer_lens
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError as exc:
        print(f"TransformerLens not available: {exc}")
        return {}
    versions["transformer_lens"] = getattr(transformer_lens, "__version__", "?")
    bridge = TransformerBridge.boot_transformers(str(folder), device="cpu", dtype=torch.float32)
    versions["transformer_lens_attention"] = _attention_of(getattr(bridge, "original_model", None))
    names = {f"blocks.{i}.hook_resid_post" for i in range(n_layers)}

    def tl_forward(ids: torch.Tensor) -> Any:
        with torch.no_grad():
            return bridge(ids)

    def tl_cache(ids: torch.Tensor) -> Any:
        with torch.no_grad():
            return bridge.run_with_cache(ids, names_filter=lambda n: n in names)

    return {"transformer_lens_forward": tl_forward, "transformer_lens": tl_cache}


def _nnsight(folder: Path, n_layers: int, versions: dict[str, str]) -> dict[str, Callable]:
    try:
        import nnsight
        from nnsight import LanguageModel
    except ImportError as exc:
        print(f"nnsight not available: {exc}")
        return {}
    versions["nnsight"] = getattr(nnsight, "__version__", "?")
    # The same attention kernels as the reference forward (nnsight would load sdpa by default).
    lm = LanguageModel(str(folder), dispatch=True, dtype=torch.float32, attn_implementation="eager")
    versions["nnsight_attention"] = _attention_of(getattr(lm, "_model", None))

    def nn_capture(ids: torch.Tensor) -> Any:
        # nnsight compiles the with-body from source: keep the trace as its own with statement.
        saved: list[Any] = []
        with lm.trace(ids):
            for i in range(n_layers):
                saved.append(lm.model.layers[i].output.save())
        return saved

    return {"nnsight": nn_capture}


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def measure(
    table: dict[str, Callable], ids: torch.Tensor, repeats: int, warmup: int, clock: str
) -> dict[str, list[float]]:
    tick = CLOCKS[clock]
    times: dict[str, list[float]] = {name: [] for name in table}
    for _ in range(warmup):
        for fn in table.values():
            fn(ids)
    for _ in range(repeats):
        for name, fn in table.items():
            start = tick()
            fn(ids)
            times[name].append(tick() - start)
    return times


def median_interval(values: list[float]) -> tuple[float, float]:
    """A distribution-free 95% interval for the median: the order statistics n/2 -+ 0.98 sqrt(n)."""
    ordered, n = sorted(values), len(values)
    half = 0.98 * math.sqrt(n)
    lo, hi = max(0, math.floor(n / 2 - half)), min(n - 1, math.ceil(n / 2 + half))
    return ordered[lo], ordered[hi]


def summarize(times: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    base = statistics.median(times["hf_forward"])
    out = {}
    for name, values in times.items():
        med = statistics.median(values)
        # Paired: each repeat's time over the plain forward's in the same round (drift cancels).
        ratios = [v / b for v, b in zip(values, times["hf_forward"], strict=True)]
        lo, hi = median_interval(ratios)
        out[name] = {
            "median_ms": med * 1e3,
            "ratio_vs_hf_forward": med / base,
            "paired_ratio_median": statistics.median(ratios),
            "paired_ratio_ci95": [lo, hi],
            "extra_ms_vs_hf_forward": (med - base) * 1e3,
            "repeats": len(values),
        }
    return out


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# Capture overhead: resid_post at every layer ({result['model']})",
        "",
        f"{result['when']}, {result['machine']}, torch {result['torch']}, {result['threads']} threads, "
        f"{result['clock']} clock, "
        f"fp32, medians of {result['repeats']} round-robin repeats. Ratio = median / plain HF forward.",
        "",
    ]
    for n, rows in result["lengths"].items():
        lines += [
            f"## {n} tokens",
            "",
            "| method | median ms | ratio of medians | median paired ratio | 95% interval | extra ms |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for name, row in rows.items():
            lo, hi = row["paired_ratio_ci95"]
            lines.append(
                f"| {name} | {row['median_ms']:.2f} | {row['ratio_vs_hf_forward']:.3f} | "
                f"{row['paired_ratio_median']:.3f} | {lo:.3f}-{hi:.3f} | "
                f"{row['extra_ms_vs_hf_forward']:+.2f} |"
            )
        load = result["load"][n]
        lines += ["", f"Load: {_load_line(load)}.", ""]
    lines.append(f"Command: `{result['command']}`")
    if not result.get("quiet", False):
        lines.append("")
        lines.append("**Measured while other work shared the machine: not a performance figure.**")
    return "\n".join(lines) + "\n"


def _load_line(load: dict[str, Any]) -> str:
    foreign = load.get("foreign_mean")
    other = "not counted" if foreign is None else f"{foreign:.2f} on average"
    return (
        f"1-minute load {load['before_1m']:.2f} before, {load['min_1m']}-{load['max_1m']} during; "
        f"other processes' runnable threads {other}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    p.add_argument("--lengths", type=int, nargs="+", default=[16, 256])
    p.add_argument("--repeats", type=int, default=40)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall time, or process CPU time (robust on a shared, overloaded machine; use --threads 1)",
    )
    p.add_argument("--no-peers", action="store_true", help="skip TransformerLens and nnsight")
    p.add_argument("--out", type=Path, default=None, help="path stem for .json and .md")
    args = p.parse_args(argv)
    if args.out is None:
        args.out = DEFAULT_OUT.with_name(f"{DEFAULT_OUT.name}-{args.clock}-{args.threads}t")
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(
        False
    )  # every method is inference; nnsight's trace has no no_grad of its own
    from ie_core.models import resolve_model_path

    folder = resolve_model_path(args.model) or Path(args.model)
    table, versions = methods(Path(folder), peers=not args.no_peers)
    _, tok = _hf(Path(folder))
    result: dict[str, Any] = {
        "model": args.model,
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {platform.processor() or platform.platform()}",
        "torch": torch.__version__,
        "versions": versions,
        "threads": args.threads,
        "clock": args.clock,
        "repeats": args.repeats,
        "command": "python packages/ie-eager/benchmarks/capture_overhead.py "
        + " ".join(argv or []),
        "lengths": {},
        "load": {},
    }
    quiet = True
    for n in args.lengths:
        before = os.getloadavg()[0]
        with LoadSampler() as sampler:
            times = measure(table, _ids(tok, n), args.repeats, args.warmup, args.clock)
        result["lengths"][str(n)] = summarize(times)
        result["load"][str(n)] = {"before_1m": round(before, 2)} | sampler.summary()
        quiet = quiet and sampler.quiet() is True
        print(f"{n} tokens:", json.dumps(result["lengths"][str(n)], indent=1))
    result["quiet"] = quiet
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(result))
    print(f"wrote {args.out.with_suffix('.json')} and {args.out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
