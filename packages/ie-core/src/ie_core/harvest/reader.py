"""Reading a harvest folder: its shards as torch tensors in order, or a shuffled buffer of rows
for training. The layout is plain safetensors + JSON (docs/HARVEST.md), so any reader works."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ie_core.grammar import format_address, to_address
from ie_core.harvest.errors import HarvestError
from ie_core.harvest.manifest import Manifest, read_manifest
from ie_core.harvest.shards import load_shard

__all__ = ["HarvestDataset", "open_harvest"]


@dataclass(frozen=True)
class HarvestDataset:
    """A harvest folder as its manifest lists it (only complete shards)."""

    folder: Path
    manifest: Manifest

    @property
    def points(self) -> tuple[str, ...]:
        return tuple(self.manifest.spec["points"])

    @property
    def tokens(self) -> int:
        return self.manifest.tokens

    @property
    def complete(self) -> bool:
        return self.manifest.complete

    def shard_paths(self) -> list[Path]:
        return [self.folder / s.file for s in self.manifest.shards]

    def _names(self, points: Sequence[Any] | None) -> list[str] | None:
        if points is None:
            return None
        names = [format_address(to_address(p)) for p in points]
        unknown = [n for n in names if n not in self.points]
        if unknown:
            raise HarvestError(f"{self.folder} holds {list(self.points)}, not {unknown}")
        return names

    def iter_shards(self, points: Sequence[Any] | None = None) -> Iterator[dict[str, Any]]:
        """Each shard's tensors in order: index columns and `[n, width]` per point."""
        names = self._names(points)
        for path in self.shard_paths():
            yield load_shard(path, names)

    def shuffled(
        self, point: Any, batch_size: int, *, buffer_tokens: int = 262144, seed: int = 0
    ) -> Iterator[Any]:
        """`[batch_size, width]` batches of `point`'s rows in a seeded shuffled order: shards are
        visited in a shuffled order and mixed in a buffer of about `buffer_tokens` rows."""
        import torch

        name = self._names([point])
        assert name is not None
        generator = torch.Generator().manual_seed(seed)
        order = torch.randperm(len(self.manifest.shards), generator=generator).tolist()
        buffer: list[Any] = []
        held = 0
        for i in order:
            rows = load_shard(self.shard_paths()[i], name)[name[0]]
            buffer.append(rows)
            held += len(rows)
            if held >= buffer_tokens:
                yield from self._drain(buffer, batch_size, generator, keep=buffer_tokens // 2)
                held = sum(len(b) for b in buffer)
        yield from self._drain(buffer, batch_size, generator, keep=0)

    @staticmethod
    def _drain(buffer: list[Any], batch_size: int, generator: Any, keep: int) -> Iterator[Any]:
        import torch

        rows = torch.cat(buffer)
        rows = rows[torch.randperm(len(rows), generator=generator)]
        cut = max(0, len(rows) - keep)
        cut -= cut % batch_size if keep else 0
        for start in range(0, cut, batch_size):
            yield rows[start : min(start + batch_size, cut)]
        buffer[:] = [rows[cut:]] if cut < len(rows) else []


def open_harvest(folder: str | Path) -> HarvestDataset:
    """The harvest in `folder` (refused when it has no manifest)."""
    path = Path(folder)
    manifest = read_manifest(path)
    if manifest is None:
        raise HarvestError(f"{path} holds no manifest.json; it is not a harvest folder")
    return HarvestDataset(path, manifest)
