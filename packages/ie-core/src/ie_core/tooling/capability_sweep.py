"""Confirm a backend's capability claims by capturing them, and sweep the synthetic families.

`check_claims` is the one checker: every point claimed served must capture a finite tensor of the
documented shape at every claimed layer, and every address claimed refused must raise the
backend's refusal with the reason the claim gives. The sweep writes a backend's committed file
(`ie_core/data/capabilities/<backend>.json`) only when every claim of every family checks out.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from ie_core.backend_plugin import BackendPlugin, backend_plugin
from ie_core.capabilities import (
    SYNTHETIC_PREFIX,
    Capabilities,
    CapabilityFile,
    PointCapability,
    same_reason,
)
from ie_core.errors import (
    BackendNotInstalledError,
    InterpError,
    PointUnavailableError,
    UnsupportedModelError,
)
from ie_core.grammar import FAMILIES, POINTS, Address, Serving, Width, get_point
from ie_core.ops import Additive, steer_at
from ie_core.runner import run

PROMPT = "The capital of France is"
# A refusal matches a claim when a tail of its message (after a ": ") of at least this many
# characters appears in the claimed reason; shorter tails would match almost anything.
MIN_REASON_MATCH = 20
_FIXED_WIDTHS = {Width.D, Width.H, Width.KV, Width.N, Width.E, Width.K, Width.VOCAB}


class SweepError(RuntimeError):
    """A backend's claims disagree with what it does; nothing is written."""


@dataclass(frozen=True)
class Mismatch:
    address: str
    problem: str

    def __str__(self) -> str:
        return f"{self.address}: {self.problem}"


def _addresses(name: str, layers: Iterable[int], per_layer: bool) -> list[Address]:
    return [Address(name, i) for i in layers] if per_layer else [Address(name)]


def _shape_problem(model: Any, address: Address, width: Width, t: Any, seq: int) -> str:
    shape = tuple(t.shape)
    if not bool(t.float().isfinite().all()):
        return "captured tensor has non-finite values"
    if width is Width.HQK:
        ok = len(shape) == 4 and shape[0] == 1 and shape[2] == shape[3] == seq
        return "" if ok else f"shape {shape}, expected [1, heads, {seq}, {seq}]"
    if shape[:2] != (1, seq):
        return f"shape {shape}, expected [1, {seq}, ...]"
    if width in _FIXED_WIDTHS:
        expected = (1, seq, model.point_width(address))
        return "" if shape == expected else f"shape {shape}, expected {list(expected)}"
    return ""


def _refusal_matches(address: Address, message: str, reason: str) -> bool:
    text = same_reason(address, message)
    tails = [text] + [text[i + 2 :] for i in range(len(text)) if text.startswith(": ", i)]
    return any(t in reason for t in tails if len(t) >= min(MIN_REASON_MATCH, len(text)))


def _check_refused(model: Any, ids: list[int], address: Address, cap: PointCapability) -> str:
    try:
        run(model.capture(ids, [address]))
    except PointUnavailableError as exc:
        if _refusal_matches(address, str(exc), cap.reason):
            return ""
        return f"refused with {exc!s}, claimed {cap.reason!r}"
    return f"claimed refused ({cap.reason!r}) but served"


def _check_served(model: Any, ids: list[int], served: list[Address]) -> list[Mismatch]:
    """One capture of every claimed address; on a refusal, each alone to name the culprits."""
    try:
        cache = run(model.capture(ids, served))
    except PointUnavailableError:
        if len(served) == 1:
            return [Mismatch(str(served[0]), "claimed served, but refused")]
        return [m for a in served for m in _check_served(model, ids, [a])]
    out = []
    for address in served:
        width = get_point(address.name).width
        problem = _shape_problem(model, address, width, cache[str(address)], len(ids))
        if problem:
            out.append(Mismatch(str(address), problem))
    return out


def _check_writable(model: Any, ids: list[int], address: Address, writable: bool) -> str:
    """A small additive write at `address` is accepted exactly when the claim says writable."""

    if get_point(address.name).width not in _FIXED_WIDTHS:
        return ""  # attention maps and stream stacks: no single vector to write
    row = run(model.capture(ids, [address]))[str(address)][0, -1]
    try:
        run(model.capture(ids, [address], steering=steer_at(address, Additive(row * 0 + 1e-3))))
    except InterpError as exc:
        return f"claimed writable, but a write was refused: {exc}" if writable else ""
    return "" if writable else "claimed capture-only, but a write was accepted"


def check_claims(model: Any, claims: Mapping[str, PointCapability]) -> list[Mismatch]:
    """Every disagreement between `claims` and what `model` does (empty: the claims hold)."""
    ids = model.to_tokens(PROMPT)
    out: list[Mismatch] = []
    served: list[Address] = []
    for point in POINTS:
        cap = claims.get(point.name)
        if cap is None:
            out.append(Mismatch(point.name, "no claim for this point"))
            continue
        if cap.served and point.per_layer and not cap.layers:
            out.append(Mismatch(point.name, "claimed served on no layer"))
        layers = set(cap.layers) if point.per_layer else ({None} if cap.served else set())
        for layer in range(model.n_layers) if point.per_layer else [None]:
            address = Address(point.name, layer)
            if layer in layers:
                served.append(address)
            elif problem := _check_refused(model, ids, address, cap):
                out.append(Mismatch(str(address), problem))
    out += _check_served(model, ids, served) if served else []
    if out:
        return out
    # Writability, once per point on its first served address (a write reaches every layer alike).
    firsts: dict[str, Address] = {}
    for address in served:
        firsts.setdefault(address.name, address)
    for name, address in firsts.items():
        if problem := _check_writable(model, ids, address, claims[name].writable):
            out.append(Mismatch(str(address), problem))
    return out


def sweep_command(backend: str) -> str:
    """The command a capability file names: the backend-wide sweep reproduces every entry."""
    return f"ie points --sweep --backend {backend}"


def _plugin(backend: str) -> BackendPlugin:
    plugin = backend_plugin(backend)
    if plugin is None:
        raise BackendNotInstalledError(f"backend {backend!r} is not installed; the sweep loads it")
    return plugin


def versions(backend: str) -> dict[str, str]:
    """The versions the backend's descriptor names, as installed (first installed distribution)."""
    out = {}
    for name, distributions in _plugin(backend).engine_packages.items():
        for dist in distributions:
            try:
                out[name] = version(dist)
                break
            except PackageNotFoundError:
                continue
    return out


def declared_of(backend: str) -> dict[str, Serving]:
    """Per point, how the backend's plugin is designed to reach it (empty where it declares none)."""
    serving = _plugin(backend).serving
    return {p.name: serving(p) for p in POINTS} if serving is not None else {}


def load_kwargs(backend: str) -> dict[str, Any]:
    """The keyword arguments the backend's descriptor asks the sweep to load with."""
    return dict(_plugin(backend).sweep_kwargs)


def sweep_family(backend: str, family: str, load: Callable[..., Any]) -> Capabilities:
    """Load `ie-synthetic/<family>`, ask its capabilities and confirm each by capture."""
    model = load(f"{SYNTHETIC_PREFIX}{family}", backend=backend, **load_kwargs(backend))
    try:
        caps = model.capabilities()
        problems = check_claims(model, caps)
    finally:
        run(model.shutdown())
    if problems:
        listed = "\n  ".join(str(p) for p in problems)
        raise SweepError(f"{family} on {backend}: the claims disagree with captures:\n  {listed}")
    return caps


def sweep(
    backend: str, families: Iterable[str], load: Callable[..., Any], command: str
) -> CapabilityFile:
    """Sweep `families`; a family that fails to load is left out (it renders "not verified")."""
    models: dict[str, tuple[str, Capabilities]] = {}
    for family in families:
        print(f"ie points --sweep: {family} on {backend}", file=sys.stderr)
        try:
            caps = sweep_family(backend, family, load)
        except SweepError:
            raise
        except UnsupportedModelError as exc:
            # The backend refuses this checkpoint by design: every point is refused, and the
            # answers say why (vLLM's own error, on the CPU build), never a check mark.
            print(f"  refused: {exc}", file=sys.stderr)
            caps = {p.name: PointCapability(False, False, (), str(exc)) for p in POINTS}
        except Exception as exc:  # a load failure is reported, not fatal
            print(f"  left out: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        models[f"{SYNTHETIC_PREFIX}{family}"] = (family, caps)
    return CapabilityFile(backend, command, versions(backend), models, declared_of(backend))


def synthetic_families() -> tuple[str, ...]:
    """The registry's families with a synthetic build (ie-eager builds them; a test there checks
    its recipes cover exactly these)."""
    return tuple(f.slug for f in FAMILIES if f.synthetic)
