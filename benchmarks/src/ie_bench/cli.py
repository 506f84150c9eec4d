"""`ie bench`: list the grid, run one cell, sweep the grid, render the report, publish.

ie bench list
ie bench sweep --profile cpu --models smollm2-135m      # cells -> report -> publish
ie bench cell --model ie-synthetic/llama --variant eager --profile tiny   # -> cells/tiny/...
ie bench group --model smollm2-135m --variants eager,vllm --profile cpu   # interleaved, in-process
ie bench report [--no-publish]
ie bench publish [--check]

Files go under --root (default: $IE_BENCH_ROOT, else the working directory); inside a clone of
interp-engine, into its benchmarks/ folder and the README's throughput block (ie_bench.layout).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ie_core.tooling.cli import tool_parser

from ie_bench.cells import cell_path, load_cells, profiles_present
from ie_bench.layout import ROOT_ENV, Layout, layout
from ie_bench.spec import (
    MODELS,
    PROFILES,
    VARIANTS,
    WORKLOADS,
    get_model,
    get_profile,
    get_variant,
    get_workload,
)


def _csv(text: str | None) -> list[str] | None:
    return [t.strip() for t in text.split(",") if t.strip()] if text else None


def _profile_arg(parser: argparse.ArgumentParser, required: bool) -> None:
    names = ", ".join(p.name for p in PROFILES)
    parser.add_argument(
        "--profile",
        required=required,
        help=f"workload sizes ({names}); `gpu` is the seed's 512/128 sizes, `cpu` the shrunk ones",
    )


def _cmd_list(_: argparse.Namespace) -> int:
    print("models:")
    for m in MODELS:
        print(f"  {m.key:18} {m.model_id}")
    print("variants:")
    for v in VARIANTS:
        print(f"  {v.key:18} backend={v.backend:14} {v.description}")
    print("workloads:")
    for w in WORKLOADS:
        print(f"  {w.key:18} {w.description}")
    print("profiles:")
    for p in PROFILES:
        print(f"  {p.name:18} {p.description}")
    return 0


def _cmd_cell(args: argparse.Namespace) -> int:
    from ie_bench.cell import run_cell

    workloads = _csv(args.workloads)
    for w in workloads or []:
        get_workload(w)
    model, variant, profile = (
        get_model(args.model),
        get_variant(args.variant),
        get_profile(args.profile),
    )
    if args.out is None:
        args.out = str(cell_path(Path(args.cells_dir), profile.name, model.key, variant.key))
    cell = run_cell(
        model,
        variant,
        profile,
        Path(args.out),
        workloads,
        command=["ie", "bench", "cell", *sys.argv[1:]] if args.record_argv else None,
    )
    print(f"{cell['cell_id']}: {cell['status']} -> {args.out}")
    return 0 if cell["status"] != "error" else 1


def _cmd_group(args: argparse.Namespace) -> int:
    from ie_bench.group import run_group

    workloads = _csv(args.workloads)
    for w in workloads or []:
        get_workload(w)
    variants = [get_variant(v) for v in _csv(args.variants) or []]
    cells = run_group(
        get_model(args.model),
        variants,
        get_profile(args.profile),
        Path(args.cells_dir),
        workloads,
        command=["ie", "bench", "group", *sys.argv[1:]],
    )
    for cell in cells:
        print(f"{cell['cell_id']}: {cell['status']}")
    return 0 if all(c["status"] != "error" for c in cells) else 1


def _select_cells(cells_dir: Path, profile: str | None) -> list[dict]:
    cells = load_cells(cells_dir, profile)
    present = profiles_present(cells)
    if profile is None and len(present) > 1:
        raise SystemExit(f"ie bench: {cells_dir} holds profiles {present}; pass --profile")
    return cells


def _write_report(args: argparse.Namespace) -> int:
    from ie_bench.publish import drift, publish
    from ie_bench.report import render_report

    cells = _select_cells(Path(args.cells_dir), args.profile)
    if not cells:
        print(f"ie bench: no cells under {args.cells_dir}", file=sys.stderr)
        return 1
    Path(args.results).write_text(render_report(cells))
    print(f"wrote {args.results}")
    if args.no_publish:
        return 0
    json_path = Path(args.json) if args.json else None
    changed = publish(cells, Path(args.readme), json_path, allow_loaded=args.allow_loaded)
    for path in changed:
        print(f"published {path}")
    return 1 if drift(cells, Path(args.readme), json_path) else 0


def _cmd_report(args: argparse.Namespace) -> int:
    return _write_report(args)


def _cmd_publish(args: argparse.Namespace) -> int:
    from ie_bench.publish import drift, publish

    cells = _select_cells(Path(args.cells_dir), args.profile)
    json_path = Path(args.json) if args.json else None
    if args.check:
        problems = drift(cells, Path(args.readme), json_path)
        for p in problems:
            print(p, file=sys.stderr)
        if not problems:
            print("published benchmark figures match the cells")
        return 1 if problems else 0
    for path in publish(cells, Path(args.readme), json_path, allow_loaded=args.allow_loaded):
        print(f"published {path}")
    return 0


def _cmd_sweep(args: argparse.Namespace) -> int:
    from ie_bench.sweep import dropped_workloads, run_sweep

    profile = get_profile(args.profile)
    models = [get_model(m) for m in _csv(args.models) or []]
    variants = [get_variant(v) for v in _csv(args.variants) or [v.key for v in VARIANTS]]
    workloads = _csv(args.workloads)
    for w in workloads or []:
        get_workload(w)
    lost = dropped_workloads(Path(args.cells_dir), profile, models, variants, workloads)
    if lost:
        listed = "; ".join(f"{p.name}: {', '.join(w)}" for p, w in lost.items())
        raise SystemExit(
            f"ie bench: a --workloads run rewrites whole cells, and these hold workloads it "
            f"would drop ({listed}); run every workload, or write elsewhere with --cells-dir"
        )
    runs = run_sweep(
        models,
        variants,
        profile,
        Path(args.cells_dir),
        Path(args.log_dir),
        workloads,
        args.timeout,
        quiet_load=args.quiet_load,
        quiet_wait_s=args.quiet_wait,
        separate=args.separate,
    )
    failed = [r for r in runs if r.status == "error"]
    print(f"{len(runs)} cells, {len(failed)} failed (see the report's 'What failed')")
    if args.no_report:
        return 0
    args.profile = profile.name
    return _write_report(args)


def _cells_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cells-dir",
        help="where cells are read/written (default: ROOT/cells; in a clone, benchmarks/cells)",
    )


def _output_args(parser: argparse.ArgumentParser) -> None:
    _cells_arg(parser)
    parser.add_argument(
        "--results",
        help="the report to write (default: ROOT/results-latest.md; in a clone, "
        "benchmarks/results-latest.md)",
    )
    parser.add_argument(
        "--readme",
        help="file with THROUGHPUT markers to publish into (default: none; in a clone, its "
        "README.md)",
    )
    parser.add_argument(
        "--json",
        help="dashboard JSON, '' to skip (default: ROOT/throughput.json; in a clone, "
        "benchmarks/throughput.json)",
    )


def _fill_paths(args: argparse.Namespace, where: Layout) -> None:
    """Paths the user did not give, from the layout (`--json ''` stays: it means skip)."""
    defaults = {
        "cells_dir": where.cells_dir,
        "results": where.results_md,
        "readme": where.readme,
        "json": where.throughput_json,
        "log_dir": where.log_dir,
    }
    for name, value in defaults.items():
        if hasattr(args, name) and getattr(args, name) is None:
            setattr(args, name, None if value is None else str(value))


def _allow_loaded_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow-loaded",
        action="store_true",
        help="publish a sweep that fails the load gate, marked as measured under load "
        "(default: refuse it)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser, command = tool_parser("ie bench", "The speed harness.", __doc__, ROOT_ENV, "benchmarks")
    command("list", help="models, variants, workloads, profiles").set_defaults(fn=_cmd_list)

    cell = command("cell", help="run one (model, variant) cell in this process")
    cell.add_argument("--model", required=True, help="spec key or model id")
    cell.add_argument("--variant", required=True, help="variant key (`ie bench list`)")
    _profile_arg(cell, required=True)
    cell.add_argument(
        "--out", help="cell JSON path (default: CELLS_DIR/<profile>/<model>__<variant>.json)"
    )
    _cells_arg(cell)
    cell.add_argument("--workloads", help="comma-separated subset (default: all)")
    cell.add_argument("--record-argv", action="store_true", help=argparse.SUPPRESS)
    cell.set_defaults(fn=_cmd_cell)

    group = command("group", help="one model's variants in this process, round-robin over repeats")
    group.add_argument("--model", required=True, help="spec key or model id")
    group.add_argument("--variants", required=True, help="comma-separated")
    _profile_arg(group, required=True)
    _cells_arg(group)
    group.add_argument("--workloads", help="comma-separated subset (default: all)")
    group.set_defaults(fn=_cmd_group)

    sweep = command(
        "sweep", help="run the grid (one process per model, its variants interleaved), then report"
    )
    sweep.add_argument("--models", required=True, help="comma-separated spec keys or model ids")
    sweep.add_argument("--variants", help="comma-separated (default: all)")
    _profile_arg(sweep, required=True)
    sweep.add_argument("--workloads", help="comma-separated subset (default: all)")
    sweep.add_argument("--timeout", type=float, help="cap per cell in seconds (default: profile's)")
    sweep.add_argument(
        "--separate",
        action="store_true",
        help="one process per cell, variants not interleaved (when one model's engines do not "
        "fit in memory together; always so on the gpu profile)",
    )
    sweep.add_argument(
        "--quiet-load",
        type=float,
        help="before each cell, wait until the 1-minute load average is at most this",
    )
    sweep.add_argument(
        "--quiet-wait", type=float, default=600.0, help="give up waiting after this many seconds"
    )
    sweep.add_argument(
        "--log-dir",
        help="per-cell process logs (default: ROOT/.logs; in a clone, benchmarks/.logs)",
    )
    sweep.add_argument("--no-report", action="store_true", help="only write cells")
    sweep.add_argument("--no-publish", action="store_true", help="report, but leave README alone")
    _allow_loaded_arg(sweep)
    _output_args(sweep)
    sweep.set_defaults(fn=_cmd_sweep)

    report = command("report", help="cells -> results-latest.md -> publish")
    _profile_arg(report, required=False)
    report.add_argument("--no-publish", action="store_true", help="write only the report")
    _allow_loaded_arg(report)
    _output_args(report)
    report.set_defaults(fn=_cmd_report)

    pub = command("publish", help="README throughput block and throughput.json from cells")
    _profile_arg(pub, required=False)
    pub.add_argument("--check", action="store_true", help="exit 1 if either has drifted")
    _allow_loaded_arg(pub)
    _output_args(pub)
    pub.set_defaults(fn=_cmd_publish)
    return parser


def bench_command(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.root is not None:
        # Child `ie bench cell` processes and the git stamp resolve the same folder.
        os.environ[ROOT_ENV] = str(args.root.expanduser().resolve())
    _fill_paths(args, layout(args.root))
    if getattr(args, "json", None) == "":
        args.json = None
    try:
        return int(args.fn(args))
    except (KeyError, ValueError) as exc:
        print(f"ie bench: {exc}", file=sys.stderr)
        return 2
