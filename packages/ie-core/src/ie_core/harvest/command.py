"""`ie harvest MODEL --data FILE... --points ... --out DIR`: the command over `harvest`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ie_core.harvest.windows import BOS_POLICIES, PACKINGS

__all__ = ["harvest_command"]

EPILOG = """Rerunning the same command resumes after the last complete shard; a different command on
the same folder is refused, naming the difference. Layout and reader: docs/HARVEST.md."""


def _parser() -> argparse.ArgumentParser:
    from ie_core.tooling.cli import DefaultsHelpFormatter

    p = argparse.ArgumentParser(
        prog="ie harvest",
        description="Capture points over a corpus into a folder of safetensors shards.",
        epilog=EPILOG,
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument("model", help="model id or folder (a server URL with --backend remote)")
    p.add_argument("--data", nargs="+", required=True, type=Path, help=".txt / .jsonl / .parquet")
    p.add_argument(
        "--points", required=True, help="comma-separated addresses: resid_post.10,mlp_out.3"
    )
    p.add_argument("--out", required=True, type=Path, help="output folder")
    p.add_argument("--backend", default="auto", help="eager, vllm, vllm-static, remote")
    p.add_argument("--column", default="text", help="the JSON-lines field / parquet column")
    p.add_argument("--context", type=int, default=128, help="rows per window")
    p.add_argument("--bos", choices=BOS_POLICIES, default="window", help="a BOS at each window")
    p.add_argument("--packing", choices=PACKINGS, default="packed", help="pack documents or not")
    p.add_argument("--max-tokens", type=int, help="stop after this many rows")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "fp16"), help="on disk")
    p.add_argument("--shard-tokens", type=int, default=65536, help="rows per shard (whole windows)")
    p.add_argument("--batch-windows", type=int, help="windows per capture call (eager 8, else 64)")
    p.add_argument("--max-model-len", type=int, help="vLLM backends: the engine's max_model_len")
    return p


def harvest_command(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    from ie_core.harvest.corpus import describe_files
    from ie_core.harvest.harvesting import harvest
    from ie_core.harvest.storage import prepare_folder
    from ie_core.loading import load_model
    from ie_core.runner import run

    files = describe_files(args.data)  # a missing file or unwritable folder fails before the load
    prepare_folder(args.out)
    if _already_done(args, files):
        return 0
    extra = {"max_model_len": args.max_model_len} if args.max_model_len else {}
    model = load_model(args.model, backend=args.backend, **extra)
    try:
        result = harvest(
            model, args.out, [p for p in args.points.split(",") if p],
            files=args.data, column=args.column, context=args.context, bos=args.bos,
            packing=args.packing, max_tokens=args.max_tokens, dtype=args.dtype,
            shard_tokens=args.shard_tokens, batch_windows=args.batch_windows,
            command=["ie", "harvest", *argv],
        )  # fmt: skip
    finally:
        run(model.shutdown())
    print(
        f"{result.out}: {result.tokens} tokens in {result.shards} shards "
        f"({result.resumed_shards} already there; {result.harvested_tokens} harvested now, "
        f"{result.tokens_per_s:,.0f} tokens/s)",
        file=sys.stdout,
    )
    return 0


def _already_done(args: argparse.Namespace, files: tuple[Any, ...]) -> bool:
    """Before the model loads: refuse a folder holding another harvest (naming the fields that
    differ), and report a complete one with nothing to do. The model's own fields (its revision,
    widths, tokenizer) are checked after the load, on resume."""
    from ie_core.grammar import format_address, to_address
    from ie_core.harvest.manifest import check_same_spec, read_manifest
    from ie_core.harvest.spec import command_fields

    manifest = read_manifest(args.out)
    if manifest is None:
        return False
    points = tuple(format_address(to_address(p)) for p in args.points.split(",") if p)
    fields = command_fields(
        points, files, backend=args.backend, column=args.column, context=args.context,
        bos=args.bos, packing=args.packing, max_tokens=args.max_tokens, dtype=args.dtype,
        shard_tokens=args.shard_tokens, batch_windows=args.batch_windows,
    )  # fmt: skip
    check_same_spec(args.out, {k: manifest.spec.get(k) for k in fields}, fields)
    if not manifest.complete or manifest.spec.get("model") != args.model:
        return False
    print(
        f"{args.out}: {manifest.tokens} tokens in {len(manifest.shards)} shards, complete "
        "(nothing to do; the model was not loaded)",
        file=sys.stdout,
    )
    return True
