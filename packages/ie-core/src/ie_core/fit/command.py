"""`ie fit MODEL [--backend] [--points ...] [--static-writes ...] [--max-model-len N]
[--streams N] [--gpu NAME | --memory GiB] [--attribute TOKENS] [--json]`: the memory table of
`ie_core.fit.fit`, from config.json and the safetensors headers only."""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["fit_command"]


def _parser() -> argparse.ArgumentParser:
    from ie_core.fit.attribution import DEFAULT_L0
    from ie_core.fit.targets import GPU_MIB
    from ie_core.tooling.cli import DefaultsHelpFormatter

    p = argparse.ArgumentParser(
        prog="ie fit",
        description="Whether a model, its captures and its experiments fit in memory, priced "
        "from config.json and the safetensors headers (no weight download): weights, KV cache "
        "floor, graph pool, tap buffers and held rows, eager's logits and attention, an "
        "attribution graph.",
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument("model", help="model folder or Hugging Face Hub id")
    p.add_argument("--backend", default="vllm", help="eager, vllm or vllm-static")
    p.add_argument(
        "--points", nargs="*", default=[],
        help="captured (vllm-static: tapped) points: names (every layer), addresses, or all",
    )  # fmt: skip
    p.add_argument("--static-writes", nargs="*", default=[], help="vllm-static write sites")
    p.add_argument(
        "--max-model-len", type=int,
        help="tokens per sequence (eager: the prompt length); default the config's positions",
    )  # fmt: skip
    p.add_argument("--streams", type=int, default=1, help="sequences held at once")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--gpu", help=f"a GPU by name: {', '.join(GPU_MIB)}")
    where.add_argument("--memory", type=float, help="GiB of GPU memory")
    p.add_argument("--dtype", help="load dtype (default: float32 on CPU, else the config's)")
    p.add_argument(
        "--attribute", type=int, metavar="TOKENS", help="an attribution graph's prompt length"
    )
    p.add_argument(
        "--l0",
        type=float,
        default=DEFAULT_L0,
        help="transcoder features active per layer and token",
    )
    p.add_argument(
        "--max-feature-nodes", type=int, help="the attribution's feature cap (as ie trace)"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return p  # fmt: skip


def fit_command(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    from ie_core.errors import InterpError
    from ie_core.fit.sizing import fit

    try:
        report = fit(
            args.model, args.backend, points=args.points, static_writes=args.static_writes,
            max_model_len=args.max_model_len, streams=args.streams, gpu=args.gpu,
            memory_gib=args.memory, attribute_tokens=args.attribute, l0=args.l0,
            max_feature_nodes=args.max_feature_nodes,
            dtype=args.dtype,
        )  # fmt: skip
    except (InterpError, ValueError) as exc:
        print(f"ie fit: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report.to_json(), indent=1) if args.json else report.table())
    return 0 if report.fits else 1
