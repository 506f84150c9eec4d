"""Read models for the pages and the JSON API, built from the database rows only."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace
from typing import Any

from ie_core.capabilities import NOT_VERIFIED, PointCapability, family_capabilities
from ie_core.errors import AddressError
from ie_core.grammar import parse_address
from ie_core.tooling.benchmark_load import CellLoad, cell_load
from sqlmodel import Session, col, select

from ie_dashboard.notes import point_note
from ie_dashboard.tables import (
    ArchitecturePointRow,
    ArchitectureRow,
    ArchitectureTraitRow,
    BenchmarkCellRow,
    PointRow,
    TraitRow,
    WorkloadRow,
)

BACKENDS = ("eager", "vllm", "vllm-static", "vllm-generate")
VARIANT_ORDER = ("eager", "vllm", "vllm-static", "vllm-eager", "vllm-generate")
# (workload, metric) behind the two throughput columns; names from benchmarks' spec.
ONE_STREAM = ("generate", "decode_tok_s")
CONCURRENT = ("generate_x8", "aggregate_tok_s")
HOOK_NOTE = "hook in the vLLM worker, sliced per request (enforce_eager)"
TAP_NOTE = (
    "custom-op tap kept through torch.compile and CUDA graphs; declare it at load (static_points)"
)
GENERATE_REFUSAL = (
    "vllm-generate runs vLLM untouched; load backend='vllm' or 'vllm-static' to capture"
)


class NotFound(LookupError):
    """A page asked for something the database does not hold; the message says what exists."""


# ---------------------------------------------------------------- registry


@dataclass(frozen=True)
class PointPresence:
    point: PointRow
    present: bool
    reason: str


@dataclass(frozen=True)
class Architecture:
    row: ArchitectureRow
    traits: tuple[tuple[str, str], ...]  # (trait, note)
    presence: dict[str, PointPresence]

    @property
    def slug(self) -> str:
        return self.row.slug

    @property
    def name(self) -> str:
        return self.row.name

    @property
    def examples(self) -> list[str]:
        return self.row.examples.split()

    @property
    def hf_classes(self) -> list[str]:
        return self.row.hf_classes.split()

    @property
    def point_count(self) -> int:
        return sum(p.present for p in self.presence.values())

    def has(self, point: str) -> bool:
        return self.presence[point].present

    def trait_names(self) -> set[str]:
        return {t for t, _ in self.traits}


def _memo(session: Session, key: object, build: Any) -> Any:
    """Registry reads cached for the session's life: the static export renders ~1,200 pages in one."""
    cache = session.info.setdefault("ie_dashboard_registry", {})
    if key not in cache:
        cache[key] = build()
    return cache[key]


def list_points(session: Session) -> list[PointRow]:
    return _memo(
        session,
        "points",
        lambda: list(session.exec(select(PointRow).order_by(col(PointRow.position)))),
    )


def list_architectures(session: Session) -> list[ArchitectureRow]:
    return _memo(
        session,
        "archs",
        lambda: list(session.exec(select(ArchitectureRow).order_by(col(ArchitectureRow.position)))),
    )


def get_architecture(session: Session, slug: str) -> Architecture:
    return _memo(session, ("arch", slug), lambda: _load_architecture(session, slug))


def _load_architecture(session: Session, slug: str) -> Architecture:
    row = session.get(ArchitectureRow, slug)
    if row is None:
        known = ", ".join(a.slug for a in list_architectures(session))
        raise NotFound(f"unknown architecture {slug!r}; known: {known}")
    notes = {t.name: t.note for t in session.exec(select(TraitRow))}
    traits = tuple(
        (t.trait, notes.get(t.trait, ""))
        for t in session.exec(
            select(ArchitectureTraitRow).where(ArchitectureTraitRow.architecture == slug)
        )
    )
    points = {p.name: p for p in list_points(session)}
    rows = session.exec(
        select(ArchitecturePointRow).where(ArchitecturePointRow.architecture == slug)
    )
    presence = {r.point: PointPresence(points[r.point], r.present, r.reason) for r in rows}
    ordered = {name: presence[name] for name in points if name in presence}
    return Architecture(row, tuple(sorted(traits)), ordered)


# `name[.layer][.stream-N]` in ASCII digits without leading zeros; `int()` would also take '²'.
_POINT_PARAM = re.compile(
    r"[a-z][a-z0-9_]{0,63}(?:\.(?:0|[1-9][0-9]{0,99}))?(?:\.stream-(?:0|[1-9][0-9]{0,3}))?",
    re.ASCII,
)
# The registry holds families, not checkpoints, so a card cannot know the reader's depth; it
# refuses layers past any released model of these families (Llama 3.1 405B has 126 layers).
CARD_LAYERS = 256


def _shown(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")


def parse_point_param(
    text: str | None, known: dict[str, PointPresence]
) -> tuple[str | None, int | None]:
    """`resid_post.9` -> ("resid_post", 9); raises NotFound naming the known points."""
    if not text:
        return None, None
    if not _POINT_PARAM.fullmatch(text):
        raise NotFound(
            f"bad point {_shown(text)}: write a point name, optionally '.LAYER' (e.g. resid_post.9)"
        )
    try:
        address = parse_address(text)
    except (AddressError, ValueError) as exc:
        raise NotFound(f"bad point {_shown(text)}: {exc}") from None
    if address.name not in known:
        raise NotFound(f"unknown point {address.name!r}; known points: {', '.join(known)}")
    point = known[address.name].point
    if point.scope == "trunk" and address.layer is not None:
        raise NotFound(
            f"{address.name!r} is a trunk point and takes no layer; write '{address.name}'"
        )
    if address.layer is not None and address.layer >= CARD_LAYERS:
        raise NotFound(
            f"no such point: {address.name}.{address.layer} names layer {address.layer}, and no "
            f"model of these families has more than {CARD_LAYERS} layers"
        )
    return address.name, address.layer


def parse_point_stream(text: str | None) -> int:
    """The `.stream-N` of a deep link (`resid_post.3.stream-1` -> 1); 0 without one."""
    if not text or ".stream-" not in text:
        return 0
    stream = parse_address(text).stream
    return 0 if stream is None else stream


@dataclass(frozen=True)
class BackendServing:
    backend: str
    served: bool
    service: str  # how it is served; "refused" or "not verified" otherwise
    reason: str
    layers: tuple[int, ...] = ()  # the layers the answer serves (per-layer points)
    writable: bool = False  # a steering write reaches it on this backend

    @property
    def verified(self) -> bool:
        return self.service != NOT_VERIFIED


def _layers_note(cap: PointCapability, point: PointRow) -> str:
    if point.scope != "layer" or not cap.reason:
        return ""
    return f"; served on layers {', '.join(map(str, cap.layers))} only ({cap.reason})"


def _answer(backend: str, arch_slug: str, point: PointRow, how: str, note: str) -> BackendServing:
    """One backend's committed answer (ie_core's capability sweep) for this point and family."""
    answers = family_capabilities(backend, arch_slug)
    cap = answers.get(point.name) if answers is not None else None
    if cap is None:
        return BackendServing(
            backend,
            False,
            NOT_VERIFIED,
            f"no committed answer: no sweep of {backend} loaded this family (it needs a "
            f"synthetic build and `ie points --sweep --backend {backend}`), so nothing is claimed",
        )
    if not cap.served:
        return BackendServing(backend, False, "refused", cap.reason)
    note += _layers_note(cap, point)
    return BackendServing(backend, True, how, note, cap.layers, cap.writable)


def serving(presence: PointPresence, arch_slug: str) -> list[BackendServing]:
    """Which backends produce this point on this architecture, and why not where they don't:
    the backends' own committed answers, never the registry's expectations."""
    p = presence.point
    vllm_how = "recompute" if p.vllm_service == "recompute" else "hook"
    vllm_note = p.vllm_reason if vllm_how == "recompute" else HOOK_NOTE
    return [
        _answer("eager", arch_slug, p, "hook", "forward hook on the real HF module"),
        _answer("vllm", arch_slug, p, vllm_how, vllm_note),
        _answer("vllm-static", arch_slug, p, "static tap", TAP_NOTE),
        BackendServing("vllm-generate", False, "not served", GENERATE_REFUSAL),
    ]


def peer_names(point: PointRow, layer: int | None) -> list[tuple[str, str | None]]:
    fill = "{L}" if layer is None else str(layer)
    names = [
        ("TransformerLens", point.tl_name),
        ("nnsight", point.nnsight_name),
        ("nnterp", point.nnterp_name),
    ]
    return [(engine, n.replace("{L}", fill) if n else None) for engine, n in names]


@dataclass(frozen=True)
class CompareRow:
    point: PointRow
    left: PointPresence
    right: PointPresence
    left_note: str
    right_note: str

    @property
    def differs(self) -> bool:
        """Present on one side only, or present on both but holding a different tensor."""
        if self.left.present != self.right.present:
            return True
        return self.left.present and self.left_note != self.right_note

    @property
    def kind(self) -> str:
        if not self.differs:
            return ""
        return "presence" if self.left.present != self.right.present else "meaning"


def compare(left: Architecture, right: Architecture) -> list[CompareRow]:
    lt, rt = left.trait_names(), right.trait_names()
    return [
        CompareRow(p.point, p, right.presence[name], point_note(name, lt), point_note(name, rt))
        for name, p in left.presence.items()
    ]


# ---------------------------------------------------------------- throughput


@dataclass(frozen=True)
class Figure:
    variant: str
    cell_id: int
    started: str
    env_label: str
    one_stream: float | None
    concurrent: float | None
    one_status: str  # ok | unsupported | error | missing
    concurrent_status: str
    one_mult: float | None = None
    concurrent_mult: float | None = None
    env_differs: bool = False  # the eager baseline came from another environment
    cell_status: str = "ok"  # the producer's cell status: ok | partial | error | running
    load_label: str = ""  # the highest 1-minute load the cell recorded ("" when it recorded none)
    loaded: bool = False  # that load exceeds the publish gate's bound: not a headline figure


@dataclass(frozen=True)
class ModelThroughput:
    """One model under one benchmark profile (the profile fixes prompt, new tokens, concurrency)."""

    model: str
    profile: str
    concurrency: int | None
    figures: list[Figure]
    environments: list[str]

    @property
    def peak(self) -> float:
        values = [v for f in self.figures for v in (f.one_stream, f.concurrent) if v]
        return max(values, default=0.0)


def metric(
    cell: BenchmarkCellRow, workloads: dict[str, WorkloadRow], spec: tuple[str, str]
) -> tuple[float | None, str]:
    row = workloads.get(spec[0])
    if row is None:
        # A cell that failed before this workload says so; otherwise it was not measured.
        return None, "error" if cell.status == "error" else "not measured"
    value = json.loads(row.metrics_json).get(spec[1])
    if row.status != "ok":
        return None, row.status
    if not isinstance(value, int | float):
        return None, "not measured"
    # Ingest refuses these now; a row stored before that shows as invalid, never as a bar.
    if not math.isfinite(value) or value < 0:
        return None, "invalid"
    return float(value), "ok"


def variant_key(variant: str) -> tuple[int, str]:
    return (
        VARIANT_ORDER.index(variant) if variant in VARIANT_ORDER else len(VARIANT_ORDER),
        variant,
    )


def stored_cell_load(raw: Any) -> CellLoad | None:
    """The load a stored cell recorded; None for a cell too old or too partial to say."""
    try:
        return cell_load(raw)
    except (KeyError, TypeError, ValueError, IndexError):
        return None


def latest_cells(session: Session) -> dict[tuple[str, str, str], BenchmarkCellRow]:
    """The latest cell per (model, profile, variant): what every throughput figure is read from."""
    latest: dict[tuple[str, str, str], BenchmarkCellRow] = {}
    for cell in session.exec(select(BenchmarkCellRow).order_by(col(BenchmarkCellRow.started))):
        latest[(cell.model, cell.profile, cell.variant)] = cell
    return latest


def cell_workloads(session: Session, cell: BenchmarkCellRow) -> dict[str, WorkloadRow]:
    return {
        w.workload: w
        for w in session.exec(select(WorkloadRow).where(WorkloadRow.cell_id == cell.id))
    }


def throughput(session: Session) -> list[ModelThroughput]:
    """Per (model, profile), the latest cell of each variant and its multipliers over eager."""
    latest = latest_cells(session)
    groups: dict[tuple[str, str], list[Figure]] = {}
    concurrency: dict[tuple[str, str], set[int]] = {}
    for (model, profile, variant), cell in sorted(
        latest.items(), key=lambda kv: (kv[0][0], kv[0][1], variant_key(kv[0][2]))
    ):
        workloads = cell_workloads(session, cell)
        one, one_status = metric(cell, workloads, ONE_STREAM)
        conc, conc_status = metric(cell, workloads, CONCURRENT)
        assert cell.id is not None
        groups.setdefault((model, profile), []).append(
            Figure(
                variant,
                cell.id,
                cell.started,
                cell.env_label,
                one,
                conc,
                one_status,
                conc_status,
                cell_status=cell.status or "ok",
            )
        )
        raw = json.loads(cell.raw_json)
        load = stored_cell_load(raw)
        if load is not None:
            fig = groups[(model, profile)][-1]
            groups[(model, profile)][-1] = replace(
                fig, load_label=load.label(), loaded=not load.within_bound
            )
        n = raw.get("profile", {}).get("concurrency")
        if isinstance(n, int):
            concurrency.setdefault((model, profile), set()).add(n)
    out = []
    for (model, profile), figures in groups.items():
        eager = next((f for f in figures if f.variant == "eager"), None)
        with_mult = []
        for f in figures:
            if eager is None:
                with_mult.append(f)
                continue
            # Ratios of unrounded figures, as the benchmark report computes them.
            one_mult = (
                f.one_stream / eager.one_stream if f.one_stream and eager.one_stream else None
            )
            conc_mult = (
                f.concurrent / eager.concurrent if f.concurrent and eager.concurrent else None
            )
            with_mult.append(
                Figure(
                    **{**f.__dict__, "one_mult": one_mult, "concurrent_mult": conc_mult,
                       "env_differs": f.env_label != eager.env_label}
                )
            )  # fmt: skip
        envs = sorted({f.env_label for f in figures})
        ns = concurrency.get((model, profile), set())
        n = next(iter(ns)) if len(ns) == 1 else None
        out.append(ModelThroughput(model, profile, n, with_mult, envs))
    return out
