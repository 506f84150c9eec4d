"""`merge_atlases`: join finished atlases of disjoint shards of one corpus into the atlas one run
gives, without a model: the states merge exactly (`state.merge`), and every context the merged
state keeps was kept by one of the inputs, so its per-token activations are copied from there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ie_core.atlas.errors import AtlasError
from ie_core.atlas.reader import AtlasData, open_atlas
from ie_core.atlas.state import merge
from ie_core.atlas.storage import (
    CONTEXTS,
    LOGITS,
    AtlasManifest,
    Checkpoint,
    check_folder,
    check_same_spec,
    read_manifest,
    write_checkpoint,
    write_manifest,
    write_tensors,
)
from ie_core.harvest.storage import prepare_folder

__all__ = ["merge_atlases"]

_PER_RUN = ("shard", "shards")


def _shards(spec: dict[str, Any]) -> list[tuple[int, int]]:
    if "shards" in spec:
        return [(int(i), int(n)) for i, n in spec["shards"]]
    i, n = spec["shard"]
    return [(int(i), int(n))]


def _check(a: AtlasData, b: AtlasData) -> list[tuple[int, int]]:
    common_a = {k: v for k, v in a.manifest.spec.items() if k not in _PER_RUN}
    common_b = {k: v for k, v in b.manifest.spec.items() if k not in _PER_RUN}
    check_same_spec(b.folder, common_a, common_b)
    shards = _shards(a.manifest.spec) + _shards(b.manifest.spec)
    if len({n for _, n in shards}) != 1 or len(set(shards)) != len(shards):
        raise AtlasError(
            f"{a.folder} and {b.folder} hold shards {shards}: merging needs disjoint shards i/n "
            "of one n (each window counted once)"
        )
    return sorted(shards)


def _pick(
    seq: torch.Tensor,
    pos: torch.Tensor,
    sources: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
) -> torch.Tensor:
    """For each slot (sequence, position) `[..., m]`, the activations row of the same feature's
    slot with that key among the sources' `(seq [..., j], pos [..., j], acts [..., j, C])`."""
    cand_seq = torch.cat([s for s, _, _ in sources], dim=-1)
    cand_pos = torch.cat([p for _, p, _ in sources], dim=-1)
    cand_acts = torch.cat([a for _, _, a in sources], dim=-2)
    match = (seq.unsqueeze(-1) == cand_seq.unsqueeze(-2)) & (
        pos.unsqueeze(-1) == cand_pos.unsqueeze(-2)
    )
    index = match.int().argmax(-1)  # an empty slot matches an empty candidate: zeros either way
    width = cand_acts.shape[-1]
    got = cand_acts.gather(-2, index.unsqueeze(-1).expand(*index.shape, width))
    return torch.where((seq >= 0).unsqueeze(-1), got, torch.zeros_like(got))


def _windows(a: AtlasData, b: AtlasData, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    seqs = torch.cat([a.contexts["window_sequence"], b.contexts["window_sequence"]])
    width = max(a.contexts["window_tokens"].shape[1], b.contexts["window_tokens"].shape[1])
    rows = [torch.nn.functional.pad(t, (0, width - t.shape[1]), value=-1)
            for t in (a.contexts["window_tokens"], b.contexts["window_tokens"])]  # fmt: skip
    tokens = torch.cat(rows)
    wanted = sorted(set(keep[keep >= 0].tolist()))
    first = {int(s): i for i, s in reversed(list(enumerate(seqs.tolist())))}
    return torch.tensor(wanted, dtype=torch.int64), tokens[[first[s] for s in wanted]]


def merge_atlases(
    a: str | Path, b: str | Path, out: str | Path, command: list[str] | None = None
) -> Path:
    """Merge finished atlas folders `a` and `b` (disjoint shards) into a new folder `out`."""
    folder = Path(out)
    check_folder(folder)
    if read_manifest(folder) is not None:
        raise AtlasError(f"{folder} already holds an atlas; merge into a new folder")
    left, right = open_atlas(a), open_atlas(b)
    shards = _check(left, right)
    state = merge(left.state, right.state)
    width = max(left.contexts["top_acts"].shape[-1], right.contexts["top_acts"].shape[-1])

    def padded(data: AtlasData, name: str) -> torch.Tensor:
        t = data.contexts[name]
        return torch.nn.functional.pad(t, (0, width - t.shape[-1]))

    top = _pick(state.top_sequence, state.top_position, [
        (d.state.top_sequence, d.state.top_position, padded(d, "top_acts")) for d in (left, right)
    ])  # fmt: skip
    sample = _pick(state.sample_sequence, state.sample_position, [
        (d.state.sample_sequence, d.state.sample_position, padded(d, "sample_acts"))
        for d in (left, right)
    ])  # fmt: skip
    keep = torch.cat([state.top_sequence.flatten(), state.sample_sequence.flatten()])
    window_sequence, window_tokens = _windows(left, right, keep)
    folder = prepare_folder(folder)
    spec = {k: v for k, v in left.manifest.spec.items() if k not in _PER_RUN}
    spec["shards"] = [list(s) for s in shards]
    manifest = AtlasManifest(spec, command)
    write_manifest(folder, manifest)
    write_checkpoint(folder, Checkpoint(state, -1, "merged"))
    contexts = {"top_acts": top, "sample_acts": sample, "window_tokens": window_tokens,
                "window_sequence": window_sequence}  # fmt: skip
    write_tensors(folder / CONTEXTS, contexts, {})
    if left.logits:
        write_tensors(folder / LOGITS, left.logits, {})
    info = {"windows": None, "tokens": state.tokens, "merged_from": [str(a), str(b)],
            "recompute_max_abs_diff": max(left.manifest.info.get("recompute_max_abs_diff", 0.0),
                                          right.manifest.info.get("recompute_max_abs_diff", 0.0))}  # fmt: skip
    write_manifest(folder, manifest.finished(**info))
    return folder
