"""Harvesting activations from a corpus into a resumable folder of safetensors shards, and
reading them back. Importing this package never imports torch (docs/HARVEST.md)."""

from ie_core.harvest.errors import (
    CorpusError,
    HarvestError,
    HarvestMismatchError,
    MissingExtraError,
    OutputFolderError,
)
from ie_core.harvest.harvesting import HarvestResult, aharvest, harvest
from ie_core.harvest.manifest import MANIFEST, Manifest, ShardEntry, read_manifest
from ie_core.harvest.reader import HarvestDataset, open_harvest
from ie_core.harvest.windows import Window, make_windows

__all__ = [
    "MANIFEST",
    "CorpusError",
    "HarvestDataset",
    "HarvestError",
    "HarvestMismatchError",
    "HarvestResult",
    "Manifest",
    "MissingExtraError",
    "OutputFolderError",
    "ShardEntry",
    "Window",
    "aharvest",
    "harvest",
    "make_windows",
    "open_harvest",
    "read_manifest",
]
