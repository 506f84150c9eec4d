"""Shard files: one safetensors file per shard holding, for `n` rows, one `[n, width]` tensor per
address (keyed by the address string) plus `token_ids`, `document`, `window` and `position`
(`int64 [n]`). Torch and safetensors are imported only when a shard is built or read."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ie_core.harvest.errors import HarvestError, MissingExtraError
from ie_core.harvest.windows import Window

__all__ = [
    "DTYPES",
    "INDEX_COLUMNS",
    "dtype_bytes",
    "load_shard",
    "shard_bytes",
    "shard_name",
    "tokens_digest",
]

DTYPES = {"float32": 4, "bfloat16": 2, "float16": 2}
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
INDEX_COLUMNS = ("token_ids", "document", "window", "position")


def canonical_dtype(name: str) -> str:
    canon = DTYPE_ALIASES.get(name, name)
    if canon not in DTYPES:
        raise HarvestError(f"dtype {name!r} unknown; choose bf16, fp16 or fp32")
    return canon


def dtype_bytes(name: str) -> int:
    return DTYPES[canonical_dtype(name)]


def shard_name(index: int) -> str:
    return f"shard-{index:06d}.safetensors"


def tokens_digest(windows: Sequence[Window]) -> str:
    digest = hashlib.sha256()
    for window in windows:
        digest.update(repr(window.tokens).encode())
    return digest.hexdigest()


def _torch() -> Any:
    try:
        import torch
        from safetensors import torch as st
    except ImportError:
        raise MissingExtraError(
            "harvest shards need torch and safetensors; run pip install 'ie-core[harvest]'"
        ) from None
    return torch, st


def shard_bytes(windows: Sequence[Window], widths: dict[str, int], dtype: str) -> int:
    """About what a shard of these windows takes on disk (for the free-space check)."""
    rows = sum(len(w.tokens) for w in windows)
    return rows * (sum(widths.values()) * dtype_bytes(dtype) + 8 * len(INDEX_COLUMNS)) + 4096


def index_tensors(windows: Sequence[Window], first_window: int) -> dict[str, Any]:
    torch, _ = _torch()
    columns: dict[str, list[int]] = {name: [] for name in INDEX_COLUMNS}
    for offset, window in enumerate(windows):
        columns["token_ids"].extend(window.tokens)
        columns["document"].extend(window.documents)
        columns["window"].extend([first_window + offset] * len(window.tokens))
        columns["position"].extend(range(len(window.tokens)))
    return {k: torch.tensor(v, dtype=torch.int64) for k, v in columns.items()}


def shard_payload(tensors: dict[str, Any], metadata: dict[str, str]) -> bytes:
    _, st = _torch()
    return st.save({k: v.contiguous() for k, v in tensors.items()}, metadata=metadata)


def load_shard(path: Path, addresses: Sequence[str] | None = None) -> dict[str, Any]:
    """A shard's tensors (every one, or the index columns plus `addresses`)."""
    _, st = _torch()
    if addresses is None:
        return st.load_file(str(path))
    from safetensors import safe_open

    wanted = (*INDEX_COLUMNS, *addresses)
    with safe_open(str(path), framework="pt") as handle:
        missing = [a for a in wanted if a not in handle.keys()]  # noqa: SIM118
        if missing:
            raise HarvestError(f"{path} holds no {missing}; it holds {sorted(handle.keys())}")
        return {name: handle.get_tensor(name) for name in wanted}
