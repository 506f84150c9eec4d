"""The `ie` command. Packages add subcommands through the `ie.commands` entry-point group; each
value is a callable `(argv: list[str]) -> int`."""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import entry_points
from pathlib import Path

# Subcommands other packages provide, so a partial install can name what to install.
COMMAND_PACKAGES = {
    "demo": "ie-eager",
    "dashboard": "ie-dashboard",
    "bench": "the workspace's benchmarks/ (uv sync at the repo root)",
    "validate": "the workspace's validator/ (uv sync at the repo root)",
}


def points_command(argv: list[str]) -> int:
    """`ie points`: the points cheat sheet as markdown, or what one backend serves on one family."""
    parser = argparse.ArgumentParser(
        prog="ie points",
        description="The 34 points as markdown; with --backend and --family, what that backend "
        "serves on that family and why not; with --sweep, regenerate a backend's committed answers.",
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", type=Path, help="write the markdown to this file")
    group.add_argument("--check", type=Path, help="exit 1 if this file differs from the registry")
    group.add_argument(
        "--sweep",
        action="store_true",
        help="load each synthetic family on --backend, capture every point it claims, and write "
        "the backend's committed capability answers",
    )
    parser.add_argument("--backend", choices=("eager", "vllm", "vllm-static"))
    parser.add_argument(
        "--family", action="append", help="a family slug (repeat to sweep several; default all)"
    )
    parser.add_argument(
        "--committed",
        action="store_true",
        help="print the committed answer without loading anything (no torch)",
    )
    parser.add_argument("--out", type=Path, help="--sweep: write here instead of ie-core's data")
    args = parser.parse_args(argv)
    if args.sweep or args.family or args.committed or args.backend:
        from ie_core.capability_cli import capabilities_command

        return capabilities_command(parser, args, ["ie", "points", *argv])
    from ie_core.docs import render_supported_points

    text = render_supported_points()
    if args.write:
        args.write.write_text(text)
        print(f"wrote {args.write}")
    elif args.check:
        if not args.check.exists() or args.check.read_text() != text:
            print(
                f"{args.check} is out of date; run `ie points --write {args.check}`",
                file=sys.stderr,
            )
            return 1
        print(f"{args.check} is up to date")
    else:
        print(text, end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {ep.name: ep for ep in entry_points(group="ie.commands")}
    if not argv or argv[0] in {"-h", "--help"}:
        print("usage: ie <command> [args]\n\ncommands:")
        for name in sorted(commands):
            print(f"  {name}")
        missing = sorted(set(COMMAND_PACKAGES) - set(commands))
        for name in missing:
            print(f"  {name}  (not installed: {COMMAND_PACKAGES[name]})")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in commands:
        hint = COMMAND_PACKAGES.get(name)
        msg = f"ie: unknown command {name!r}"
        if hint:
            msg = f"ie: {name!r} is provided by {hint}, which is not installed"
        print(msg, file=sys.stderr)
        return 2
    return int(commands[name].load()(rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
