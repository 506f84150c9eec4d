"""Pipeline stages: which points a stage's worker serves, and the host's one view of them all.

Under `pipeline_parallel_size=N` vLLM gives each stage its own slice of the decoder layers and
puts `PPMissingLayer` placeholders in the others; the first stage alone runs the embedding and
the last alone the final norm and unembed. Each worker keeps the sites of what it runs
(`keep_stage`) and reports its layer range; the host merges the stages' answers
(`merge_infos`, `merge_stats`). Register and collect already go to every worker (each installs
only its own sites, `Engine.rpc_payload` merges rows by address), so no other code knows stages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ie_core.grammar import to_address
from ie_core.model_info import ModelInfo

from ie_vllm.worker.point_table import PointTable

__all__ = ["Stage", "keep_stage", "layer_range", "merge_infos", "merge_stats", "stage_of"]

MISSING = "PPMissingLayer"
FIRST_ONLY = "embeddings"  # a tied last stage holds the embedding's weights but never runs it
LAST_ONLY = "final_norm"


@dataclass(frozen=True)
class Stage:
    """This worker's pipeline stage: `rank` of `size` (0 of 1 without pipeline parallelism)."""

    rank: int = 0
    size: int = 1

    @property
    def first(self) -> bool:
        return self.rank == 0

    @property
    def last(self) -> bool:
        return self.rank == self.size - 1


def stage_of() -> Stage:
    """The calling worker's stage, from vLLM's pipeline group (one stage outside vLLM)."""
    try:
        from vllm.distributed import get_pp_group

        group = get_pp_group()
        return Stage(int(group.rank_in_group), int(group.world_size))
    except Exception:
        return Stage()


def keep_stage(table: PointTable, stage: Stage) -> None:
    """Drop the sites this stage does not run, with every address served through them."""
    dropped = {
        name
        for name, site in table.sites.items()
        if type(site.module).__name__ == MISSING
        or (name == FIRST_ONLY and not stage.first)
        or (name == LAST_ONLY and not stage.last)
    }
    for name in dropped:
        del table.sites[name]
    for address, site in list(table.addresses.items()):
        if site in dropped:
            del table.addresses[address]
            table.widths.pop(address, None)
            table.writable.discard(address)


def layer_range(table: PointTable) -> tuple[int, int] | None:
    """`[first, last + 1)` of the layers this table serves points of; None for none."""
    layers = [a.layer for a in map(to_address, table.widths) if a.layer is not None]
    return (min(layers), max(layers) + 1) if layers else None


def merge_infos(infos: Sequence[dict[str, Any]]) -> ModelInfo:
    """One model view from every rank's `ie_setup` answer (ranks in order: stage by stage).

    Each address is served by the stage holding it (the widths agree where tensor-parallel ranks
    repeat it); a refusal is kept only for what no stage serves.
    """
    if len(infos) == 1:
        return ModelInfo.from_wire(infos[0])
    merged = dict(infos[0])
    widths: dict[str, int] = {}
    writable: set[str] = set()
    heads: dict[Any, int] = {}
    for info in infos:
        for address, width in info.get("widths", {}).items():
            widths.setdefault(address, width)
        writable.update(info.get("writable", ()))
        heads.update(info.get("attn_heads", {}))
    served = {to_address(a).name for a in widths}
    refused: dict[str, str] = {}
    for info in infos:
        for key, reason in info.get("refused", {}).items():
            if key not in widths and key not in served:
                refused.setdefault(key, reason)
    merged.update(
        widths=widths, writable=sorted(writable), refused=refused, attn_heads=heads,
        stages=_one_per_stage(infos),
    )  # fmt: skip
    return ModelInfo.from_wire(merged)


def _one_per_stage(infos: Sequence[dict[str, Any]]) -> list[Any]:
    """Each stage once, in rank order: the tensor-parallel ranks of a stage report it each."""
    seen: dict[Any, Any] = {}
    for info in infos:
        stage = info.get("stage")
        if stage:
            seen.setdefault(stage.get("rank"), stage)
    return [seen[rank] for rank in sorted(seen)]


def merge_stats(stats: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Every rank's registry and hooks as one: per site the most hooks any rank holds (a site
    lives on one stage; tensor-parallel ranks repeat it), the most registered and forwards, and
    every registered key (sorted; the tests name a key a test left registered)."""
    hooks: dict[str, int] = {}
    for s in stats:
        for site, count in s.get("hooks", {}).items():
            hooks[site] = max(hooks.get(site, 0), int(count))
    return {
        "registered": max((int(s.get("registered", 0)) for s in stats), default=0),
        "keys": sorted({str(key) for s in stats for key in s.get("keys", ())}),
        "hooks": hooks,
        "forwards": max((int(s.get("forwards", 0)) for s in stats), default=0),
    }
