"""The `ie` command. Packages add subcommands through the `ie.commands` entry-point group; each
value is a callable `(argv: list[str]) -> int`."""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Callable, Mapping
from importlib.metadata import PackageNotFoundError, entry_points, version
from pathlib import Path
from typing import NoReturn

from ie_core.capabilities import BACKENDS
from ie_core.errors import InterpError

# Subcommands other packages provide, so a partial install can name what to install.
COMMAND_PACKAGES = {
    "demo": "ie-eager (pip install 'ie-eager[smollm2]')",
    "dashboard": "ie-dashboard (pip install ie-dashboard)",
    "bench": "ie-bench (pip install 'ie-bench[eager]')",
    "validate": "ie-validator (pip install 'ie-validator[peers]')",
}
DEBUG_FLAG = "--debug"


class DefaultsHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """`--help` that ends each option's line with its default, when it has one worth naming
    (not None or False) and the help text does not already say it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            default is None
            or default is False
            or default is argparse.SUPPRESS
            or not action.option_strings
            or "default" in text
        ):
            return text
        return f"{text} (default: %(default)s)"


class SuggestingParser(argparse.ArgumentParser):
    """An ArgumentParser whose "unrecognized arguments" error names the nearest option."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        if message.startswith("unrecognized arguments:"):
            options = _options(self)
            for word in message.split(":", 1)[1].split():
                near = difflib.get_close_matches(word.split("=")[0], options, n=1)
                if near:
                    message += f" (did you mean {near[0]}?)"
                    break
        super().error(message)


def _options(parser: argparse.ArgumentParser) -> list[str]:
    """Every option string of `parser` and of its subcommands' parsers."""
    found: list[str] = []
    for action in parser._actions:
        found += action.option_strings
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _options(sub)
    return found


def tool_parser(
    prog: str, description: str, epilog: str | None, root_env: str, layout: str
) -> tuple[argparse.ArgumentParser, Callable[..., argparse.ArgumentParser]]:
    """The parser of a tool that reads and writes one folder (`ie bench`, `ie validate`): its
    `--root` option, and a function that adds a subcommand with the same help formatting."""
    parser = SuggestingParser(
        prog=prog, description=description, epilog=epilog, formatter_class=DefaultsHelpFormatter
    )
    parser.add_argument(
        "--root",
        type=Path,
        help=f"folder to read and write (default: ${root_env}, else the working directory; "
        f"inside a clone of interp-engine, its {layout}/ layout)",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, formatter_class=DefaultsHelpFormatter)

    return parser, command


USAGE = """usage: ie [--version] [--debug] <command> [args]

  --version  print the installed interp-engine packages and their versions
  --debug    show the full traceback when a command fails (also IE_DEBUG=1)
  <command> --help  describes each command and its options

  IE_PROGRESS=1 or 0 forces progress bars on or off (default: only when stderr is a terminal)
"""


def points_command(argv: list[str]) -> int:
    """`ie points`: the points cheat sheet as markdown, or what one backend serves on one family."""
    parser = SuggestingParser(
        prog="ie points",
        description="The 38 points as markdown; with --backend and --family, what that backend "
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
    parser.add_argument("--backend", choices=BACKENDS)
    parser.add_argument(
        "--family", action="append", help="a family slug (repeat to sweep several; default all)"
    )
    parser.add_argument(
        "--committed",
        action="store_true",
        help="print the committed answer without loading anything (no torch)",
    )
    parser.add_argument("--out", type=Path, help="--sweep: write here instead of ie-core's data")
    parser.add_argument(
        "--markdown", action="store_true", help="print the whole cheat sheet as markdown"
    )
    args = parser.parse_args(argv)
    if args.sweep or args.family or args.committed or args.backend:
        from ie_core.tooling.capability_cli import capabilities_command

        return capabilities_command(parser, args, ["ie", "points", *argv])
    from ie_core.tooling.docs import render_supported_points

    if not (args.write or args.check or args.markdown):
        print(points_summary(), end="")
        return 0
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


def points_summary() -> str:
    """`ie points` alone: one line per point, and where the details are."""
    from ie_core.grammar import POINTS

    lines = [f"{'point':22} {'scope':6} {'width':20} role"]
    lines += [f"{p.name:22} {p.scope.value:6} {p.width.value:20} {p.role.value}" for p in POINTS]
    lines += [
        "",
        "ie points --markdown: definitions, serving per backend, TransformerLens / nnsight names",
        "ie points --family F: what each backend serves on family F (committed answers)",
    ]
    return "\n".join(lines) + "\n"


def installed_versions() -> dict[str, str]:
    """The interp-engine distributions in this environment, name -> version."""
    names = {"ie-core", *(COMMAND_PACKAGES[n].split()[0] for n in COMMAND_PACKAGES)}
    names |= {"ie-vllm", "ie-static", "ie-remote"}
    found: dict[str, str] = {}
    for name in sorted(names):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def _print_help(commands: Mapping[str, object]) -> None:
    print(USAGE + "\ncommands:")
    for name in sorted(commands):
        print(f"  {name}")
    for name in sorted(set(COMMAND_PACKAGES) - set(commands)):
        print(f"  {name}  (not installed: {COMMAND_PACKAGES[name]})")


def _debug_requested(argv: list[str]) -> bool:
    """`--debug` anywhere on the line (it is removed) or IE_DEBUG=1 in the environment."""
    found = DEBUG_FLAG in argv
    while DEBUG_FLAG in argv:
        argv.remove(DEBUG_FLAG)
    return found or os.environ.get("IE_DEBUG", "") not in {"", "0"}


def describe_failure(name: str, exc: BaseException) -> str:
    """One line for a failed command: what failed, why (the error's own message), what to do.

    The project's errors already say what to do; anything else is unexpected, so the line asks
    for the traceback.
    """
    text = str(exc).strip()
    lines = text.splitlines()
    # Ours say what to do, maybe after a library's multi-line reason: keep all of it, on one line.
    why = " ".join(t.strip() for t in lines if t.strip()) if isinstance(exc, InterpError) else ""
    why = why or (lines[0] if lines else type(exc).__name__)
    line = f"ie {name}: {type(exc).__name__}: {why}"
    if not isinstance(exc, InterpError):
        line += f" (unexpected; rerun with {DEBUG_FLAG} for the traceback)"
    return line


def main(argv: list[str] | None = None) -> int:
    from ie_core.progress import quiet_third_party_progress

    argv = list(sys.argv[1:] if argv is None else argv)
    quiet_third_party_progress()  # before any command imports tqdm: logs get no bar redraws
    debug = _debug_requested(argv)
    commands = {ep.name: ep for ep in entry_points(group="ie.commands")}
    if argv[:1] == ["--version"]:
        for dist, number in installed_versions().items():
            print(f"{dist} {number}")
        return 0
    if not argv or argv[0] in {"-h", "--help"}:
        _print_help(commands)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in commands:
        hint = COMMAND_PACKAGES.get(name)
        near = difflib.get_close_matches(name, [*commands, *COMMAND_PACKAGES, "--version"], n=1)
        did = f"did you mean `ie {near[0]}`? " if near else ""
        msg = f"ie: unknown command {name!r}; {did}`ie --help` lists the commands"
        if hint:
            msg = f"ie: {name!r} is provided by {hint}, which is not installed"
        print(msg, file=sys.stderr)
        return 2
    try:
        return int(commands[name].load()(rest) or 0)
    except KeyboardInterrupt:
        print(f"ie {name}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if debug:
            raise
        print(describe_failure(name, exc), file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
