"""`ie validate ...`: run the sweep, render the matrix and pages, render the hook mappings.

Files go under --root (default: $IE_VALIDATOR_ROOT, else the working directory); inside a clone of
interp-engine, into its validator/ folder (ie_validator.layout).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ie_core.errors import BackendNotInstalledError
from ie_core.tooling.cli import tool_parser

from ie_validator.layout import ROOT_ENV, Layout, layout

# The module each engine imports and the install that provides it.
ENGINE_NEEDS = {
    "transformer-lens": ("transformer_lens", "pip install 'ie-validator[transformer-lens]'"),
    "nnsight": ("nnsight", "pip install 'ie-validator[nnsight]'"),
    "vllm": ("ie_vllm", "pip install 'ie-vllm[gpu]' (or 'ie-vllm[cpu]', see ie-vllm's README)"),
    "vllm-static": ("ie_static", "pip install ie-static 'ie-vllm[gpu]' (or 'ie-vllm[cpu]')"),
}


def check_engines(engines: Sequence[str]) -> None:
    """Refuse, before any work, an engine whose package is not installed, naming the install."""
    for name in engines:
        module, install = ENGINE_NEEDS.get(name, (None, ""))
        if module is not None and importlib.util.find_spec(module) is None:
            raise BackendNotInstalledError(
                f"engine {name!r} needs {module}, which is not installed; run {install} "
                "(or 'ie-validator[peers]' for both peers)"
            )


def _run(args: argparse.Namespace) -> int:
    import torch

    from ie_validator.engines.registry import PEERS
    from ie_validator.models import default_models, synthetic_ids
    from ie_validator.sweep import sweep

    models = args.models or (synthetic_ids() if args.synthetic else default_models())
    engines = args.engines.split(",") if args.engines else list(PEERS)
    check_engines(engines)
    torch.set_num_threads(args.threads)
    sweep(models, engines, root=args.results)
    if not args.no_render:
        _render(args)
    return 0


def _render(args: argparse.Namespace) -> int:
    from ie_validator.render import render_all

    where: Layout = args.layout
    render_all(args.results, where.pages_dir.parent, readme=where.matrix_md, pages=where.pages_dir)
    print(f"rendered {where.matrix_md} and {where.pages_dir}/")
    return 0


def _rescore(args: argparse.Namespace) -> int:
    from ie_validator.rescoring import rescore_all

    for hf_id, engine, old, new in rescore_all(args.results):
        print(f"{hf_id} / {engine}: {old} -> {new}")
    return _render(args)


def _mappings(args: argparse.Namespace) -> int:
    from ie_validator.render import render_mappings

    text = render_mappings()
    doc: Path | None = args.doc or args.layout.mappings_doc
    if (args.check or args.write) and doc is None:
        print("ie validate mappings: outside a clone, name the file with --doc", file=sys.stderr)
        return 2
    if args.check and doc is not None:
        if not doc.exists() or doc.read_text() != text:
            print(f"{doc} is out of date; run `ie validate mappings --write`", file=sys.stderr)
            return 1
        print(f"{doc} is up to date")
    elif args.write and doc is not None:
        doc.write_text(text)
        print(f"wrote {doc}")
    else:
        print(text, end="")
    return 0


def _nnterp_env(_: argparse.Namespace) -> int:
    from ie_validator.engines.nnterp_engine import build_env

    print(build_env())
    return 0


def _results_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--results",
        type=Path,
        help="results folder (default: ROOT/results; in a clone, validator/results)",
    )


def validate_command(argv: list[str]) -> int:
    parser, command = tool_parser(
        "ie validate",
        "Compare this project's tensors with other engines'.",
        __doc__,
        ROOT_ENV,
        "validator",
    )
    run = command("run", help="validate models against engines, write results, render")
    run.add_argument(
        "models", nargs="*", help="model ids (default: every synthetic family + SmolLM2)"
    )
    run.add_argument("--synthetic", action="store_true", help="only the synthetic families")
    run.add_argument(
        "--engines",
        help="comma-separated: transformer-lens,nnsight,nnterp,vllm,vllm-static "
        "(default: transformer-lens,nnsight,nnterp)",
    )
    _results_arg(run)
    run.add_argument("--threads", type=int, default=2, help="torch threads")
    run.add_argument("--no-render", action="store_true", help="skip re-rendering README and pages")
    run.set_defaults(func=_run)
    render = command(
        "render",
        help="render the matrix (validator/README.md in a clone, else validation.md) "
        "and one page per model",
    )
    _results_arg(render)
    render.set_defaults(func=_render)
    rescore = command(
        "rescore", help="re-apply the gates to the stored metrics of every result, then render"
    )
    _results_arg(rescore)
    rescore.set_defaults(func=_rescore)
    mappings = command("mappings", help="print or write docs/ENGINE_HOOK_MAPPINGS.md")
    group = mappings.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help="write the doc")
    group.add_argument("--check", action="store_true", help="exit 1 if the doc is out of date")
    mappings.add_argument(
        "--doc", type=Path, help="the doc (default: docs/ENGINE_HOOK_MAPPINGS.md in a clone)"
    )
    mappings.set_defaults(func=_mappings)
    env = command("nnterp-env", help="build the nnterp environment (uv, from PyPI)")
    env.set_defaults(func=_nnterp_env)
    args = parser.parse_args(argv)
    if args.root is not None:
        # The nnterp adapter resolves its environment from the same folder.
        os.environ[ROOT_ENV] = str(args.root.expanduser().resolve())
    args.layout = layout(args.root)
    if getattr(args, "results", "absent") is None:
        args.results = args.layout.results
    return int(args.func(args))
