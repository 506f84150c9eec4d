"""A checkpoint as `ie fit` reads it: config.json and the safetensors headers, no weights.

A safetensors file starts with an 8-byte little-endian length and that many bytes of JSON naming
each tensor's dtype and shape, so the weights' bytes are known exactly without reading them. A
local folder is read from disk (every `*.safetensors` file, or those its index names); a Hub id
through huggingface_hub's header fetch (`get_safetensors_metadata`: ranged requests for the
headers only) and config.json alone. Torch-free.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ie_core.errors import ModelNotFoundError

__all__ = ["DTYPE_BYTES", "Checkpoint", "FitSourceError", "Tensor", "read_checkpoint"]

# safetensors' dtype names -> bytes per element.
DTYPE_BYTES: Mapping[str, float] = {
    "F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2,
    "I16": 2, "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
    "F8_E8M0": 1, "F6_E2M3": 0.75, "F6_E3M2": 0.75, "F4": 0.5,
}  # fmt: skip
FLOATS = frozenset({"F64", "F32", "F16", "BF16"})
_MAX_HEADER = 100 * 2**20  # safetensors' own limit on a header


class FitSourceError(ModelNotFoundError):
    """The config or the safetensors headers could not be read; the message says what to give."""


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str  # safetensors' name: "BF16", "F32", ...
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return int(self.numel * DTYPE_BYTES[self.dtype])


@dataclass(frozen=True)
class Checkpoint:
    source: str  # the folder or Hub id read
    config: Mapping[str, Any]
    tensors: tuple[Tensor, ...]

    @property
    def file_bytes(self) -> int:
        """Bytes of the tensors as stored (the headers' dtype x shape)."""
        return sum(t.nbytes for t in self.tensors)

    def loaded_bytes(self, element_bytes: int | None) -> int:
        """Bytes once loaded with floating tensors cast to `element_bytes` each (None: as
        stored); integer tensors (packed quantized weights, indices) keep their dtype."""
        if element_bytes is None:
            return self.file_bytes
        return sum(t.numel * element_bytes if t.dtype in FLOATS else t.nbytes for t in self.tensors)

    @property
    def parameters(self) -> int:
        return sum(t.numel for t in self.tensors)


def read_header(path: Path) -> dict[str, Any]:
    """The JSON header of one safetensors file."""
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise FitSourceError(f"{path} is shorter than a safetensors header (8 bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > _MAX_HEADER:
            raise FitSourceError(f"{path}: a {n:,}-byte header is not a safetensors file")
        try:
            return dict(json.loads(f.read(n)))
        except ValueError as exc:
            raise FitSourceError(f"{path}: the safetensors header is not JSON ({exc})") from None


def _tensors(header: Mapping[str, Any], where: str) -> list[Tensor]:
    out = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = str(info.get("dtype", ""))
        if dtype not in DTYPE_BYTES:
            raise FitSourceError(f"{where}: tensor {name!r} has dtype {dtype!r}, unknown to ie fit")
        out.append(Tensor(name, dtype, tuple(int(d) for d in info.get("shape", ()))))
    return out


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / n for n in names]
    return sorted(folder.glob("*.safetensors"))


def read_folder(folder: Path) -> Checkpoint:
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise FitSourceError(f"{folder} has no config.json; ie fit reads the model's shape there")
    files = _weight_files(folder)
    if not files:
        raise FitSourceError(
            f"{folder} has no *.safetensors file; ie fit prices weights from safetensors headers "
            "(convert .bin checkpoints with safetensors' convert script)"
        )
    tensors = [t for f in files for t in _tensors(read_header(f), str(f))]
    return Checkpoint(str(folder), json.loads(config_path.read_text()), tuple(tensors))


def read_hub(repo_id: str, revision: str | None = None) -> Checkpoint:
    """config.json and the headers from the Hub; refused with what to do when it cannot answer."""
    import huggingface_hub

    try:
        config_path = huggingface_hub.hf_hub_download(repo_id, "config.json", revision=revision)
        meta = huggingface_hub.get_safetensors_metadata(repo_id, revision=revision)
    except Exception as exc:  # offline, unknown repo, gated, no safetensors: all end here
        offline = " (HF_HUB_OFFLINE is set)" if os.environ.get("HF_HUB_OFFLINE") else ""
        raise FitSourceError(
            f"could not read {repo_id!r}'s config.json and safetensors headers from the Hugging "
            f"Face Hub{offline}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}; "
            "give a local folder holding config.json and the *.safetensors files (only their "
            "headers are read), or run where huggingface.co is reachable"
        ) from None
    tensors = []
    for file_name, file_meta in sorted(meta.files_metadata.items()):
        header = {n: {"dtype": t.dtype, "shape": t.shape} for n, t in file_meta.tensors.items()}
        tensors.extend(_tensors(header, f"{repo_id}/{file_name}"))
    config = json.loads(Path(config_path).read_text())
    return Checkpoint(repo_id, config, tuple(tensors))


def read_checkpoint(model_id: str | os.PathLike[str], hub: bool = True) -> Checkpoint:
    """A local folder (or an id ie's model sources materialize: SmolLM2, `ie-synthetic/...`), a
    Hub id's snapshot in the local HF cache, else the Hub (only where `hub`: a web page must
    not wait on the Hub's retries)."""
    from ie_core.models import resolve_model_path

    path = resolve_model_path(model_id) or _cached(os.fspath(model_id))
    if path is not None:
        return read_folder(path)
    if not hub:
        raise FitSourceError(
            f"{os.fspath(model_id)!r} is neither a local folder nor in this machine's Hugging "
            f"Face cache, and this reader does not ask the Hub; run `ie fit {os.fspath(model_id)}` "
            "in a shell to read its headers from the Hub"
        )
    return read_hub(os.fspath(model_id))


def _cached(repo_id: str) -> Path | None:
    """The Hub id's snapshot in the local HF cache when it holds the config and weights."""
    import huggingface_hub

    try:
        folder = Path(huggingface_hub.snapshot_download(repo_id, local_files_only=True))
    except Exception:  # not cached (or not a valid id): the Hub is asked next
        return None
    if not (folder / "config.json").is_file():
        return None
    files = _weight_files(folder)  # every shard the index names, not a partial download
    return folder if files and all(f.is_file() for f in files) else None
