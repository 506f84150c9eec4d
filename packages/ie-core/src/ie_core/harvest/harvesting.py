"""`harvest`: a corpus's activations at some points, written to a resumable folder of shards.

A client of the public capture path (a capture plan through `ModelFront.reduce`), so it runs on
every backend that captures, the remote one included. Each batch of windows goes to one call per
window length (vLLM submits a call's windows together, so they are in flight at once; eager runs
them as one padded-free batch); rows are cast to the disk dtype where they live (the `Cast`
reducer: in the vLLM worker, half as many bytes cross at bf16).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ie_core.grammar import AddressLike, format_address, to_address
from ie_core.harvest.corpus import checked_documents, describe_files, iter_file_documents
from ie_core.harvest.errors import HarvestError
from ie_core.harvest.manifest import (
    Manifest,
    ShardEntry,
    check_same_spec,
    read_manifest,
    write_manifest,
)
from ie_core.harvest.progress_line import ProgressLine
from ie_core.harvest.shards import (
    index_tensors,
    shard_bytes,
    shard_name,
    shard_payload,
    tokens_digest,
)
from ie_core.harvest.spec import HarvestOptions, build_spec
from ie_core.harvest.storage import check_free_space, prepare_folder, write_atomic
from ie_core.harvest.windows import Window, make_windows
from ie_core.reduce import Cast, Reduction
from ie_core.runner import run
from ie_core.sync import unwrap

__all__ = ["HarvestResult", "aharvest", "harvest"]

BATCHES_IN_FLIGHT = 2


@dataclass(frozen=True)
class HarvestResult:
    """What a call did: the folder, its shards and rows, and how many were already there."""

    out: Path
    shards: int
    tokens: int
    resumed_shards: int
    harvested_tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.harvested_tokens / self.seconds if self.seconds > 0 else 0.0


def _documents(options: HarvestOptions, documents: Iterable[str] | None) -> Iterator[str]:
    if documents is not None:
        return checked_documents(documents)
    return iter_file_documents(options.files, options.column)


def _chunks(windows: Iterator[Window], size: int) -> Iterator[list[Window]]:
    while chunk := list(itertools.islice(windows, size)):
        yield chunk


async def _capture_group(
    model: Any, group: list[Window], points: Sequence[str], dtype: str
) -> list[dict[str, Any]]:
    reductions = [Reduction(point, Cast(dtype), point) for point in points]
    got = await model.reduce([list(w.tokens) for w in group], reductions)
    rows: list[dict[str, Any]] = [{} for _ in group]
    for point in points:
        tensor = got[point]["rows"]
        if tensor.dim() != 3:
            raise HarvestError(
                f"{point} gives {tuple(tensor.shape)} per batch, not [batch, seq, width] rows; "
                "harvest stores one row per token (choose a residual, MLP or attention-output point)"
            )
        for i in range(len(group)):
            rows[i][point] = tensor[i].detach().to("cpu")
    return rows


async def _capture_batch(
    model: Any, batch: list[Window], points: Sequence[str], dtype: str
) -> list[dict[str, Any]]:
    """Rows of each window of `batch`, in order: one capture call per window length, in flight
    together."""
    lengths = sorted({len(w.tokens) for w in batch})
    groups = [[i for i, w in enumerate(batch) if len(w.tokens) == n] for n in lengths]
    results = await asyncio.gather(
        *(_capture_group(model, [batch[i] for i in g], points, dtype) for g in groups)
    )
    out: list[dict[str, Any]] = [{} for _ in batch]
    for group, rows in zip(groups, results, strict=True):
        for i, row in zip(group, rows, strict=True):
            out[i] = row
    return out


async def _shard_tensors(
    model: Any, windows: list[Window], first: int, options: HarvestOptions
) -> dict[str, Any]:
    import torch

    # Two batches in flight: the next is submitted while the engine finishes the last one.
    gate = asyncio.Semaphore(BATCHES_IN_FLIGHT)

    async def one(batch: list[Window]) -> list[dict[str, Any]]:
        async with gate:
            return await _capture_batch(model, batch, options.points, options.dtype)

    step = options.batch_windows
    batches = [windows[i : i + step] for i in range(0, len(windows), step)]
    per_window = [row for rows in await asyncio.gather(*map(one, batches)) for row in rows]
    tensors = index_tensors(windows, first)
    for point in options.points:
        tensors[point] = torch.cat([rows[point] for rows in per_window], dim=0)
    return tensors


def _clean_orphans(folder: Path, manifest: Manifest) -> None:
    """Shard files the manifest does not list (a kill between rename and manifest) and
    temporary files go: the manifest is what the folder holds."""
    listed = {s.file for s in manifest.shards}
    for path in folder.glob("shard-*.safetensors"):
        if path.name not in listed:
            path.unlink()
    for path in folder.glob(".*.tmp"):
        with contextlib.suppress(OSError):
            path.unlink()


def _start(folder: Path, spec: dict[str, Any], command: list[str] | None) -> Manifest:
    found = read_manifest(folder)
    if found is None:
        if any(folder.glob("shard-*.safetensors")):
            raise HarvestError(
                f"{folder} holds shards but no manifest.json; pass an empty --out folder"
            )
        found = Manifest(spec=spec, command=command)
        write_manifest(folder, found)
        return found
    check_same_spec(folder, found.spec, spec)
    _clean_orphans(folder, found)
    return found


def _check_resumed(entry: ShardEntry, windows: list[Window], first: int) -> None:
    if entry.first_window != first or tokens_digest(windows) != entry.tokens_sha256:
        raise HarvestError(
            f"the corpus no longer yields the tokens of {entry.file} (windows from {first}); "
            "the data changed since this folder was written: pass another --out folder"
        )


async def aharvest(
    model: Any,
    out: str | Path,
    points: Sequence[AddressLike],
    *,
    files: Sequence[str | Path] = (),
    documents: Iterable[str] | None = None,
    command: list[str] | None = None,
    progress: bool | None = None,
    **options: Any,
) -> HarvestResult:
    """Harvest `points` over `files` (or `documents`) into `out`; rerun to resume. Options:
    `column`, `context`, `bos`, `packing`, `max_tokens`, `dtype`, `shard_tokens`, `batch_windows`."""
    model = unwrap(model)
    if documents is not None and files:
        raise HarvestError("pass data files or documents, not both")
    names = tuple(format_address(to_address(p)) for p in points)
    described = describe_files(files) if documents is None else ()
    opts = HarvestOptions.make(model, names, tuple(str(f) for f in files), **options)
    folder = prepare_folder(Path(out))
    manifest = _start(folder, build_spec(model, opts, described), command)
    if manifest.complete:
        return HarvestResult(
            folder, len(manifest.shards), manifest.tokens, len(manifest.shards), 0, 0.0
        )
    windows = make_windows(
        _documents(opts, documents), model.to_tokens, context=opts.context, bos=opts.bos,
        packing=opts.packing, max_tokens=opts.max_tokens,
    )  # fmt: skip
    bar = ProgressLine(opts.max_tokens, enabled=progress, already=manifest.tokens)
    resumed, began, harvested = len(manifest.shards), time.perf_counter(), 0
    first = 0
    for index, chunk in enumerate(_chunks(windows, opts.shard_windows)):
        if index < resumed:
            _check_resumed(manifest.shards[index], chunk, first)
        else:
            manifest = await _write_shard(model, folder, manifest, index, chunk, first, opts)
            harvested += manifest.shards[-1].tokens
            bar.update(manifest.shards[-1].tokens)
        first += len(chunk)
    manifest = Manifest(
        manifest.spec, manifest.command, manifest.shards, complete=True, info=manifest.info
    )
    write_manifest(folder, manifest)
    bar.close()
    seconds = time.perf_counter() - began
    return HarvestResult(folder, len(manifest.shards), manifest.tokens, resumed, harvested, seconds)


async def _write_shard(
    model: Any, folder: Path, manifest: Manifest, index: int, chunk: list[Window], first: int,
    opts: HarvestOptions,
) -> Manifest:  # fmt: skip
    needed = shard_bytes(chunk, opts.widths, opts.dtype)
    check_free_space(folder, needed)
    tensors = await _shard_tensors(model, chunk, first, opts)
    name = shard_name(index)
    payload = shard_payload(tensors, {"format": "ie-harvest/1", "first_window": str(first)})
    write_atomic(folder / name, payload)
    entry = ShardEntry(
        name, first, len(chunk), len(tensors["token_ids"]), len(payload), tokens_digest(chunk)
    )
    manifest = manifest.with_shard(entry)
    write_manifest(folder, manifest)
    return manifest


def harvest(
    model: Any, out: str | Path, points: Sequence[AddressLike], **kwargs: Any
) -> HarvestResult:
    """Synchronous `aharvest` (same arguments)."""
    return run(aharvest(model, out, points, **kwargs))
