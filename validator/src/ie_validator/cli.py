"""`ie validate ...`: run the sweep, render the matrix and pages, render the hook mappings."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ie_validator.results import RESULTS_DIR

VALIDATOR_DIR = Path(__file__).resolve().parents[2]
REPO_ROOT = VALIDATOR_DIR.parent
MAPPINGS_DOC = REPO_ROOT / "docs" / "ENGINE_HOOK_MAPPINGS.md"


def _run(args: argparse.Namespace) -> int:
    import torch

    from ie_validator.engines.registry import PEERS
    from ie_validator.models import default_models, synthetic_ids
    from ie_validator.render import render_all
    from ie_validator.sweep import sweep

    torch.set_num_threads(args.threads)
    models = args.models or (synthetic_ids() if args.synthetic else default_models())
    engines = args.engines.split(",") if args.engines else list(PEERS)
    sweep(models, engines, root=args.results)
    if not args.no_render:
        render_all(args.results, VALIDATOR_DIR)
    return 0


def _render(args: argparse.Namespace) -> int:
    from ie_validator.render import render_all

    render_all(args.results, VALIDATOR_DIR)
    print(f"rendered {VALIDATOR_DIR / 'README.md'} and {VALIDATOR_DIR / 'models'}/")
    return 0


def _mappings(args: argparse.Namespace) -> int:
    from ie_validator.render import render_mappings

    text = render_mappings()
    if args.check:
        if not MAPPINGS_DOC.exists() or MAPPINGS_DOC.read_text() != text:
            print(
                f"{MAPPINGS_DOC} is out of date; run `ie validate mappings --write`",
                file=sys.stderr,
            )
            return 1
        print(f"{MAPPINGS_DOC} is up to date")
    elif args.write:
        MAPPINGS_DOC.write_text(text)
        print(f"wrote {MAPPINGS_DOC}")
    else:
        print(text, end="")
    return 0


def _nnterp_env(_: argparse.Namespace) -> int:
    from ie_validator.engines.nnterp_engine import build_env

    print(build_env())
    return 0


def outside_checkout() -> str | None:
    """Why `ie validate` cannot run here, or None inside a clone of the repository.

    ie-validator is a repository tool (not published): results, the rendered matrix and the
    mappings doc live in the checkout, found from this package's location in `uv sync`'s install.
    """
    if (VALIDATOR_DIR / "pyproject.toml").is_file():
        return None
    return (
        f"ie validate: this ie-validator is not inside a clone of interp-engine ({VALIDATOR_DIR} "
        "is not its validator/ folder), and it writes results there; clone the repository, run "
        "`uv sync` at its root, then `uv run ie validate ...`"
    )


def validate_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="ie validate", description="Compare this project's tensors with other engines'."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="validate models against engines, write results, render")
    run.add_argument(
        "models", nargs="*", help="model ids (default: every synthetic family + SmolLM2)"
    )
    run.add_argument("--synthetic", action="store_true", help="only the synthetic families")
    run.add_argument(
        "--engines",
        help="comma-separated: transformer-lens,nnsight,nnterp,vllm,vllm-static "
        "(default: transformer-lens,nnsight,nnterp)",
    )
    run.add_argument("--results", type=Path, default=RESULTS_DIR, help="results folder")
    run.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    run.add_argument("--no-render", action="store_true", help="skip re-rendering README and pages")
    run.set_defaults(func=_run)
    render = sub.add_parser("render", help="render validator/README.md and validator/models/*.md")
    render.add_argument("--results", type=Path, default=RESULTS_DIR)
    render.set_defaults(func=_render)
    mappings = sub.add_parser("mappings", help="print or write docs/ENGINE_HOOK_MAPPINGS.md")
    group = mappings.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true")
    group.add_argument("--check", action="store_true")
    mappings.set_defaults(func=_mappings)
    env = sub.add_parser("nnterp-env", help="build the nnterp environment (uv, from PyPI)")
    env.set_defaults(func=_nnterp_env)
    args = parser.parse_args(argv)
    if (problem := outside_checkout()) is not None:
        print(problem, file=sys.stderr)
        return 2
    return int(args.func(args))
