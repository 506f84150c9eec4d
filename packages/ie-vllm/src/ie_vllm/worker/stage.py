"""This worker's pipeline stage and the points it serves there.

Under `pipeline_parallel_size=N` vLLM gives each stage its own slice of the decoder layers and
puts `PPMissingLayer` placeholders in the others; the first stage alone runs the embedding and
the last alone the final norm and unembed. Each worker keeps the sites of what it runs
(`keep_stage`) and reports its layer range; the host merges the answers (`ie_vllm.pipeline`).
Register and collect already go to every worker (each installs only its own sites), so no other
code knows stages.
"""

from __future__ import annotations

from dataclasses import dataclass

from ie_core.grammar import to_address

from ie_vllm.worker.point_table import PointTable

__all__ = ["Stage", "keep_stage", "layer_range", "stage_of"]

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
