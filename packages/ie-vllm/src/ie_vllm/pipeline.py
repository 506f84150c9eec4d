"""Pipeline stages on the host: one view of every stage's answers.

Under `pipeline_parallel_size=N` each stage's worker serves the points of its own layers
(`ie_vllm.worker.stage`); the host merges the stages' answers (`merge_infos`, `merge_stats`). Register and collect already go to every worker (each installs
only its own sites, `Engine.rpc_payload` merges rows by address), so no other code knows stages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ie_core.grammar import to_address
from ie_core.model_info import ModelInfo

__all__ = ["merge_infos", "merge_stats"]


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
