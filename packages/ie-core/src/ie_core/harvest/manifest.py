"""`manifest.json`: the single source of what a harvest folder holds.

The `spec` says what was asked (model, points, widths, dtype, tokenizer, windows, data, limits):
a rerun with the same spec resumes, any other is refused naming the fields that differ. `shards`
lists the complete shards in order; a shard file it does not list is not part of the dataset.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ie_core.harvest.errors import HarvestError, HarvestMismatchError
from ie_core.harvest.storage import write_atomic

__all__ = ["FORMAT", "MANIFEST", "Manifest", "ShardEntry", "read_manifest", "write_manifest"]

MANIFEST = "manifest.json"
FORMAT = "ie-harvest/1"


@dataclass(frozen=True)
class ShardEntry:
    """One complete shard: its file, the windows and rows it holds, and a hash of its token ids
    (a resume checks the corpus still yields the same tokens)."""

    file: str
    first_window: int
    windows: int
    tokens: int
    bytes: int
    tokens_sha256: str


@dataclass(frozen=True)
class Manifest:
    spec: dict[str, Any]
    command: list[str] | None = None
    shards: tuple[ShardEntry, ...] = ()
    complete: bool = False
    format: str = FORMAT
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    def with_shard(self, entry: ShardEntry) -> Manifest:
        return replace(self, shards=(*self.shards, entry))

    def to_json(self) -> str:
        body = asdict(self)
        body["tokens"] = self.tokens
        return json.dumps(body, indent=2, sort_keys=True) + "\n"


def write_manifest(folder: Path, manifest: Manifest) -> None:
    write_atomic(folder / MANIFEST, manifest.to_json().encode())


def read_manifest(folder: Path) -> Manifest | None:
    """The folder's manifest, or None when it has none yet."""
    path = Path(folder) / MANIFEST
    if not path.exists():
        return None
    try:
        body = json.loads(path.read_text())
        if body.get("format") != FORMAT:
            raise HarvestError(
                f"{path} has format {body.get('format')!r}, not {FORMAT!r}; use another --out folder"
            )
        shards = tuple(ShardEntry(**s) for s in body["shards"])
        return Manifest(
            spec=body["spec"],
            command=body.get("command"),
            shards=shards,
            complete=bool(body.get("complete")),
            info=body.get("info", {}),
        )
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        raise HarvestError(
            f"{path} is not a harvest manifest ({exc}); use another --out folder"
        ) from None


def spec_differences(old: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[object, object]]:
    keys = sorted(set(old) | set(new))
    return {k: (old.get(k), new.get(k)) for k in keys if old.get(k) != new.get(k)}


def check_same_spec(folder: Path, old: dict[str, Any], new: dict[str, Any]) -> None:
    """Refuse to resume a folder made by a different command, naming each difference."""
    diff = spec_differences(old, new)
    if diff:
        named = "; ".join(
            f"{k}: folder has {a!r}, this command {b!r}" for k, (a, b) in diff.items()
        )
        raise HarvestMismatchError(
            f"{folder} holds a different harvest ({named}); rerun the original command to "
            "resume it, or pass another --out folder",
            diff,
        )
