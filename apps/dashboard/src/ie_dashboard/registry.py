"""Seed the registry tables (points, traits, architectures) from ie-core's registries."""

from __future__ import annotations

from ie_core.capabilities import NOT_VERIFIED, declared_serving
from ie_core.grammar import FAMILIES, POINTS, TRAIT_NOTES
from sqlalchemy import insert
from sqlmodel import Session, delete

from ie_dashboard.postgres import claim
from ie_dashboard.tables import (
    ArchitecturePointRow,
    ArchitectureRow,
    ArchitectureTraitRow,
    PointRow,
    TraitRow,
)


def _declared(backend: str, point: str, prefix: str | None = None) -> dict[str, str]:
    """How `backend` is designed to reach `point`, from its committed capability file (the
    dashboard runs without the backend installed); "not verified" where none was recorded."""
    serving = declared_serving(backend, point)
    key = prefix or backend
    if serving is None:
        return {f"{key}_service": NOT_VERIFIED, f"{key}_reason": f"no committed {backend} sweep"}
    return {f"{key}_service": serving.service.value, f"{key}_reason": serving.reason}


def seed_registry(session: Session) -> int:
    """Replace the registry rows with ie-core's current registry; returns the architecture count."""
    claim(session, "ie-dashboard registry")  # workers starting together refresh it in turn
    for table in (ArchitecturePointRow, ArchitectureTraitRow, ArchitectureRow, TraitRow, PointRow):
        session.exec(delete(table))  # type: ignore[arg-type]
    points = [
        {
            "name": p.name,
            "position": i,
            "scope": p.scope.value,
            "width": p.width.value,
            "role": p.role.value,
            "definition": p.definition,
            "requires": p.requires,
            **_declared("vllm", p.name),
            **_declared("vllm-static", p.name, prefix="static"),
            "tl_name": p.peers.transformer_lens,
            "nnsight_name": p.peers.nnsight,
            "nnterp_name": p.peers.nnterp,
        }
        for i, p in enumerate(POINTS)
    ]
    archs = [
        {
            "slug": f.slug,
            "position": i,
            "name": f.name,
            "hf_classes": " ".join(f.hf_classes),
            "significance": f.significance,
            "examples": " ".join(f.examples),
            "synthetic": f.synthetic,
        }
        for i, f in enumerate(FAMILIES)
    ]
    arch_traits = [{"architecture": f.slug, "trait": t.value} for f in FAMILIES for t in f.traits]
    arch_points = [
        {
            "architecture": f.slug,
            "point": p.name,
            "present": f.has_point(p),
            "reason": f.missing_reason(p),
        }
        for f in FAMILIES
        for p in POINTS
    ]
    # Core bulk inserts: one executemany per table instead of ~900 ORM objects.
    session.execute(insert(PointRow), points)
    # Every trait a family uses gets a row, noted or not, so the foreign keys always hold.
    traits = {t.value: TRAIT_NOTES.get(t, "") for f in FAMILIES for t in f.traits}
    traits.update({t.value: n for t, n in TRAIT_NOTES.items()})
    session.execute(insert(TraitRow), [{"name": k, "note": v} for k, v in sorted(traits.items())])
    session.execute(insert(ArchitectureRow), archs)
    session.execute(insert(ArchitectureTraitRow), arch_traits)
    session.execute(insert(ArchitecturePointRow), arch_points)
    return len(FAMILIES)
