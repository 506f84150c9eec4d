"""What a harvest is asked to do: checked options, and the manifest's `spec` built from them and
the model (the fields a resume must match)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

from ie_core.backend_plugin import BackendPlugin, backend_plugin
from ie_core.grammar import POINTS_BY_NAME, Width, to_address
from ie_core.harvest.corpus import DataFile
from ie_core.harvest.errors import HarvestError
from ie_core.harvest.shards import canonical_dtype
from ie_core.harvest.windows import BOS_POLICIES, PACKINGS, bos_tokens

__all__ = ["HarvestOptions", "build_spec", "command_fields"]

# Tokenized into the spec's tokenizer fingerprint: a resume with another tokenizer is refused.
PROBE_TEXT = "The quick brown fox jumps over the lazy dog. 0123456789 éß漢字 \n\t<|x|>"


def _positive(name: str, value: int | None, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise HarvestError(f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class HarvestOptions:
    points: tuple[str, ...]
    widths: dict[str, int]
    files: tuple[str, ...]
    column: str
    context: int
    bos: str
    packing: str
    max_tokens: int | None
    dtype: str
    shard_tokens: int
    batch_windows: int

    @property
    def shard_windows(self) -> int:
        return max(1, self.shard_tokens // self.context)

    @classmethod
    def make(
        cls, model: Any, points: tuple[str, ...], files: tuple[str, ...], *, column: str = "text",
        context: int = 128, bos: str = "window", packing: str = "packed",
        max_tokens: int | None = None, dtype: str = "float32", shard_tokens: int = 65536,
        batch_windows: int | None = None,
    ) -> HarvestOptions:  # fmt: skip
        if not points:
            raise HarvestError("no points given; pass at least one address, e.g. resid_post.10")
        if len(set(points)) != len(points):
            raise HarvestError(f"points repeat: {list(points)}; name each once")
        for name, value in (("context", context), ("shard_tokens", shard_tokens)):
            _positive(name, value)
        _positive("max_tokens", max_tokens, allow_none=True)
        _positive("batch_windows", batch_windows, allow_none=True)
        if bos not in BOS_POLICIES or packing not in PACKINGS:
            raise HarvestError(f"bos must be one of {BOS_POLICIES}, packing one of {PACKINGS}")
        for p in points:
            point = POINTS_BY_NAME.get(to_address(p).name)
            if point is not None and point.width in (Width.HQK, Width.SD, Width.SS):
                raise HarvestError(
                    f"{p} gives {point.width} per token, not one row; harvest stores one row per "
                    "token (choose a residual, MLP or attention-output point)"
                )
        widths = {p: int(model.point_width(p)) for p in points}
        batch = batch_windows or _default_batch(model.backend)
        return cls(
            points, widths, files, column, context, bos, packing, max_tokens,
            canonical_dtype(dtype), shard_tokens, batch,
        )  # fmt: skip


def _default_batch(backend: str) -> int:
    plugin = backend_plugin(backend)
    return plugin.harvest_batch if plugin is not None else BackendPlugin.harvest_batch


def _revision(model: Any) -> str | None:
    found = getattr(model, "revision", None)
    if found is None:
        config = getattr(model, "config", None)
        found = getattr(config, "_commit_hash", None)
    return found if isinstance(found, str) else None


def _tokenizer(model: Any, bos: str) -> dict[str, Any]:
    ids = model.to_tokens(PROBE_TEXT, prepend_bos=False)
    tokenizer = getattr(model, "tokenizer", None)
    return {
        "name": getattr(tokenizer, "name_or_path", None) or model.model_id,
        "probe_sha256": hashlib.sha256(json.dumps(list(ids)).encode()).hexdigest(),
        "bos_ids": list(bos_tokens(model.to_tokens, bos)),
    }


def build_spec(model: Any, options: HarvestOptions, files: tuple[DataFile, ...]) -> dict[str, Any]:
    """The manifest's `spec`: everything that decides the folder's rows."""
    return {
        "model": model.model_id,
        "revision": _revision(model),
        "backend": model.backend,
        "points": list(options.points),
        "widths": dict(options.widths),
        "dtype": options.dtype,
        "tokenizer": _tokenizer(model, options.bos),
        "context": options.context,
        "bos": options.bos,
        "packing": options.packing,
        "column": options.column if files else None,
        "data": [asdict(f) for f in files] or "documents from Python (checked by token hashes)",
        "max_tokens": options.max_tokens,
        "shard_tokens": options.shard_tokens,
        "batch_windows": options.batch_windows,
    }


def command_fields(
    points: tuple[str, ...], files: tuple[DataFile, ...], *, backend: str, column: str,
    context: int, bos: str, packing: str, max_tokens: int | None, dtype: str, shard_tokens: int,
    batch_windows: int | None,
) -> dict[str, Any]:  # fmt: skip
    """The spec's fields a command fixes before its model loads (a folder's harvest can be
    refused, or found complete, without minutes of loading); `auto` backends and a default batch
    are left to the resume check after the load."""
    fields: dict[str, Any] = {
        "points": list(points), "dtype": canonical_dtype(dtype), "context": context, "bos": bos,
        "packing": packing, "column": column, "data": [asdict(f) for f in files],
        "max_tokens": max_tokens, "shard_tokens": shard_tokens,
    }  # fmt: skip
    if backend != "auto":
        fields["backend"] = backend
    if batch_windows is not None:
        fields["batch_windows"] = batch_windows
    return fields
