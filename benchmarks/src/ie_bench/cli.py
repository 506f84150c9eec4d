"""`ie bench`: list the grid, run one cell, sweep the grid, render the report, publish.

ie bench list
ie bench sweep --profile cpu --models smollm2-135m      # cells -> report -> publish
ie bench cell --model smollm2-135m --variant eager --profile cpu --out cell.json
ie bench group --model smollm2-135m --variants eager,vllm --profile cpu   # interleaved, in-process
ie bench report [--no-publish]
ie bench publish [--check]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ie_bench.cells import (
    BENCH_DIR,
    CELLS_DIR,
    README,
    RESULTS_MD,
    THROUGHPUT_JSON,
    load_cells,
    profiles_present,
)
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

LOG_DIR = BENCH_DIR / ".logs"


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
    cell = run_cell(
        get_model(args.model),
        get_variant(args.variant),
        get_profile(args.profile),
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
    from ie_bench.sweep import run_sweep

    profile = get_profile(args.profile)
    models = [get_model(m) for m in _csv(args.models) or []]
    variants = [get_variant(v) for v in _csv(args.variants) or [v.key for v in VARIANTS]]
    workloads = _csv(args.workloads)
    for w in workloads or []:
        get_workload(w)
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


def _output_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cells-dir", default=str(CELLS_DIR), help="where cells are read/written")
    parser.add_argument("--results", default=str(RESULTS_MD), help="the report to write")
    parser.add_argument("--readme", default=str(README), help="file with THROUGHPUT markers")
    parser.add_argument("--json", default=str(THROUGHPUT_JSON), help="dashboard JSON ('' to skip)")


def _allow_loaded_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow-loaded",
        action="store_true",
        help="publish a sweep that fails the load gate, marked as measured under load "
        "(default: refuse it)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ie bench", description="The speed harness.")
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("list", help="models, variants, workloads, profiles").set_defaults(fn=_cmd_list)

    cell = sub.add_parser("cell", help="run one (model, variant) cell in this process")
    cell.add_argument("--model", required=True, help="spec key or model id")
    cell.add_argument("--variant", required=True)
    _profile_arg(cell, required=True)
    cell.add_argument("--out", required=True, help="cell JSON path")
    cell.add_argument("--workloads", help="comma-separated subset")
    cell.add_argument("--record-argv", action="store_true", help=argparse.SUPPRESS)
    cell.set_defaults(fn=_cmd_cell)

    group = sub.add_parser(
        "group", help="one model's variants in this process, round-robin over repeats"
    )
    group.add_argument("--model", required=True, help="spec key or model id")
    group.add_argument("--variants", required=True, help="comma-separated")
    _profile_arg(group, required=True)
    group.add_argument("--cells-dir", default=str(CELLS_DIR), help="where cells are written")
    group.add_argument("--workloads", help="comma-separated subset")
    group.set_defaults(fn=_cmd_group)

    sweep = sub.add_parser(
        "sweep",
        help="run the grid (one process per model, its variants interleaved), then report",
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
        "fit in memory together)",
    )
    sweep.add_argument(
        "--quiet-load",
        type=float,
        help="before each cell, wait until the 1-minute load average is at most this",
    )
    sweep.add_argument("--quiet-wait", type=float, default=600.0, help="give up waiting after s")
    sweep.add_argument("--log-dir", default=str(LOG_DIR), help="per-cell process logs")
    sweep.add_argument("--no-report", action="store_true", help="only write cells")
    sweep.add_argument("--no-publish", action="store_true", help="report, but leave README alone")
    _allow_loaded_arg(sweep)
    _output_args(sweep)
    sweep.set_defaults(fn=_cmd_sweep)

    report = sub.add_parser("report", help="cells -> results-latest.md -> publish")
    _profile_arg(report, required=False)
    report.add_argument("--no-publish", action="store_true")
    _allow_loaded_arg(report)
    _output_args(report)
    report.set_defaults(fn=_cmd_report)

    pub = sub.add_parser("publish", help="README throughput block and throughput.json from cells")
    _profile_arg(pub, required=False)
    pub.add_argument("--check", action="store_true", help="exit 1 if either has drifted")
    _allow_loaded_arg(pub)
    _output_args(pub)
    pub.set_defaults(fn=_cmd_publish)
    return parser


def outside_checkout() -> str | None:
    """Why `ie bench` cannot run here, or None inside a clone of the repository.

    ie-bench is a repository tool (not published): its cells, report and README tables live in
    the checkout, found from this package's own location in the editable install `uv sync` makes.
    """
    if (BENCH_DIR / "pyproject.toml").is_file():
        return None
    return (
        f"ie bench: this ie-bench is not inside a clone of interp-engine ({BENCH_DIR} does "
        "not exist), and it writes its cells and reports there; clone the repository, run "
        "`uv sync` at its root, then `uv run ie bench ...`"
    )


def bench_command(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if (problem := outside_checkout()) is not None:
        print(problem, file=sys.stderr)
        return 2
    if getattr(args, "json", None) == "":
        args.json = None
    try:
        return int(args.fn(args))
    except (KeyError, ValueError) as exc:
        print(f"ie bench: {exc}", file=sys.stderr)
        return 2
