"""An atlas folder: `atlas.json` (what was asked, whether the pass finished), `state.safetensors`
(the running state with the windows it has seen, replaced whole at each checkpoint) and, once
the pass is done, `contexts.safetensors` and `logits.safetensors` (docs/HARVEST.md, "Atlas").

Every file is written whole (harvest's `write_atomic`): a kill leaves the last checkpoint, and a
state file's metadata says exactly which windows it holds, so a resume never counts a window
twice. The writers and `open_atlas` are the only readers of this layout.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from ie_core.atlas.errors import AtlasError, AtlasMismatchError
from ie_core.atlas.state import AtlasState, Binning
from ie_core.harvest.manifest import MANIFEST as HARVEST_MANIFEST
from ie_core.harvest.manifest import spec_differences
from ie_core.harvest.storage import write_atomic

__all__ = [
    "ATLAS",
    "CONTEXTS",
    "FORMAT",
    "LOGITS",
    "STATE",
    "AtlasManifest",
    "Checkpoint",
    "check_folder",
    "check_same_spec",
    "read_checkpoint",
    "read_manifest",
    "read_tensors",
    "write_checkpoint",
    "write_manifest",
    "write_tensors",
]

ATLAS = "atlas.json"
STATE = "state.safetensors"
CONTEXTS = "contexts.safetensors"
LOGITS = "logits.safetensors"
FORMAT = "ie-atlas/1"


@dataclass(frozen=True)
class AtlasManifest:
    spec: dict[str, Any]
    command: list[str] | None = None
    complete: bool = False
    format: str = FORMAT
    info: dict[str, Any] = field(default_factory=dict)

    def finished(self, **info: Any) -> AtlasManifest:
        return replace(self, complete=True, info={**self.info, **info})

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"


@dataclass(frozen=True)
class Checkpoint:
    """A state and the windows it has seen: `windows` of the corpus's windows (this shard's
    among them), whose tokens hash to `tokens_sha256`."""

    state: AtlasState
    windows: int
    tokens_sha256: str


def write_manifest(folder: Path, manifest: AtlasManifest) -> None:
    write_atomic(folder / ATLAS, manifest.to_json().encode())


def read_manifest(folder: Path) -> AtlasManifest | None:
    path = Path(folder) / ATLAS
    if not path.exists():
        return None
    try:
        body = json.loads(path.read_text())
        if body.get("format") != FORMAT:
            raise AtlasError(
                f"{path} has format {body.get('format')!r}, not {FORMAT!r}; use another --out folder"
            )
        return AtlasManifest(
            body["spec"], body.get("command"), bool(body.get("complete")), info=body.get("info", {})
        )
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        raise AtlasError(
            f"{path} is not an atlas manifest ({exc}); use another --out folder"
        ) from None


def check_folder(folder: Path) -> None:
    """Refuse a folder another command wrote (a harvest, anything else), before any work."""
    folder = Path(folder)
    if not folder.is_dir() or (folder / ATLAS).exists():
        return
    if (folder / HARVEST_MANIFEST).exists():
        raise AtlasError(
            f"{folder} holds a harvest (manifest.json), not an atlas; pass another --out folder"
        )
    found = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
    if found:
        raise AtlasError(
            f"{folder} holds files but no {ATLAS} ({', '.join(found[:5])}); an atlas is written "
            "to an empty or new folder: pass another --out"
        )


def check_same_spec(folder: Path, old: dict[str, Any], new: dict[str, Any]) -> None:
    diff = spec_differences(old, new)
    if diff:
        named = "; ".join(
            f"{k}: folder has {a!r}, this command {b!r}" for k, (a, b) in diff.items()
        )
        raise AtlasMismatchError(
            f"{folder} holds a different atlas ({named}); rerun the original command to resume "
            "it, or pass another --out folder",
            diff,
        )


def write_tensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    from safetensors import torch as st

    payload = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    write_atomic(path, st.save(payload, metadata={"format": FORMAT, **metadata}))


def read_tensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        meta = handle.metadata() or {}
        if meta.get("format") != FORMAT:
            raise AtlasError(f"{path} is not an atlas file (format {meta.get('format')!r})")
        return {name: handle.get_tensor(name) for name in handle.keys()}, meta  # noqa: SIM118


def write_checkpoint(folder: Path, point: Checkpoint) -> None:
    s = point.state
    meta = {
        "windows": str(point.windows), "tokens_sha256": point.tokens_sha256,
        "tokens": str(s.tokens), "k": str(s.k), "samples": str(s.samples),
        "binning": json.dumps(s.binning.to_dict()),
    }  # fmt: skip
    write_tensors(folder / STATE, s.tensors(), meta)


def read_checkpoint(folder: Path, device: torch.device | str = "cpu") -> Checkpoint | None:
    path = Path(folder) / STATE
    if not path.exists():
        return None
    tensors, meta = read_tensors(path)
    state = AtlasState.from_tensors(
        {k: v.to(device) for k, v in tensors.items()}, k=int(meta["k"]),
        samples=int(meta["samples"]), binning=Binning(**json.loads(meta["binning"])),
        tokens=int(meta["tokens"]),
    )  # fmt: skip
    return Checkpoint(state, int(meta["windows"]), meta["tokens_sha256"])
