"""`ie points --backend B --family F [--committed]` and `ie points --sweep --backend B`."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from ie_core.capabilities import (
    BACKENDS,
    SYNTHETIC_PREFIX,
    Capabilities,
    CapabilityFile,
    capability_path,
    family_capabilities,
    parse_capabilities,
    verdict,
)
from ie_core.grammar import POINTS

__all__ = ["capabilities_command", "format_capabilities"]


def format_capabilities(backend: str, family: str, caps: Capabilities | None) -> str:
    """One line per point: served (layers, writable) or refused with the backend's reason."""
    if caps is None:
        return f"{family} on {backend}: not verified (no committed answer for this family)\n"
    lines = [
        f"{family} on {backend} (measured on {SYNTHETIC_PREFIX}{family}, a small random build: "
        "the layer lists are that build's; a real checkpoint has the same points on its own layers):"
    ]
    for p in POINTS:
        cap = caps.get(p.name)
        text = verdict(cap)
        if cap is not None and cap.served:
            where = f"layers {', '.join(map(str, cap.layers))}" if p.per_layer else "trunk"
            text = f"served ({where}; {'writable' if cap.writable else 'capture only'})"
            if cap.reason:
                text += f"; refused on other layers: {cap.reason}"
        lines.append(f"  {p.name:22} {text}")
    return "\n".join(lines) + "\n"


def _live(backend: str, family: str) -> Capabilities:
    from ie_core.loading import load_model
    from ie_core.runner import run
    from ie_core.tooling.capability_sweep import load_kwargs

    print(
        f"ie points: loading {SYNTHETIC_PREFIX}{family} on {backend} to ask its resolver "
        "(--committed prints the committed answer without loading)",
        file=sys.stderr,
    )
    model = load_model(f"{SYNTHETIC_PREFIX}{family}", backend=backend, **load_kwargs(backend))
    try:
        return model.capabilities()
    finally:
        run(model.shutdown())


def _sweep(args: argparse.Namespace, argv: list[str]) -> int:
    import json

    from ie_core.loading import load_model
    from ie_core.tooling.capability_sweep import sweep, sweep_command, synthetic_families

    out = args.out or Path(str(capability_path(args.backend)))
    families = args.family or list(synthetic_families())
    result = sweep(args.backend, families, load_model, shlex.join(argv))
    if args.family and out.exists():
        # A partial sweep updates its families and keeps the others' answers; the file names the
        # backend-wide command, which reproduces all of them.
        old = parse_capabilities(json.loads(out.read_text()))
        models = {**old.models, **result.models}
        command = sweep_command(args.backend)
        result = CapabilityFile(args.backend, command, result.versions, models, result.declared)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(result.dumps())
    for model, (_family, caps) in result.models.items():
        served = sum(c.served for c in caps.values())
        print(f"{model}: {served} served, {len(caps) - served} refused", file=sys.stderr)
    print(f"wrote {out}")
    return 0


def capabilities_command(
    parser: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str]
) -> int:
    if args.backend is None and (args.sweep or not args.family):
        parser.error(f"--sweep and --committed need --backend ({', '.join(BACKENDS)})")
    if args.sweep:
        return _sweep(args, argv)
    if not args.family:
        parser.error("name a family with --family (e.g. --family llama)")
    _check_families(parser, args.family)
    # No --backend: every backend's committed answer (nothing is loaded).
    backends = [args.backend] if args.backend else list(BACKENDS)
    for family in args.family:
        for backend in backends:
            caps = (
                _live(backend, family)
                if args.backend and not args.committed
                else family_capabilities(backend, family)
            )
            print(format_capabilities(backend, family, caps), end="")
    return 0


def _check_families(parser: argparse.ArgumentParser, families: list[str]) -> None:
    import difflib

    from ie_core.grammar import FAMILIES

    known = sorted({f.slug for f in FAMILIES})
    for family in families:
        if family not in known:
            near = difflib.get_close_matches(family, known, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            parser.error(f"unknown family {family!r}; {hint}known: {', '.join(known)}")
