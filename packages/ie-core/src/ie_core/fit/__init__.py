"""`ie fit`: a model's memory on a backend, from config.json and the safetensors headers only
(no weight download), against a GPU or this machine; the Python side of `ie fit` and the
dashboard's model page. Torch-free."""

from ie_core.fit.attribution import DEFAULT_L0, node_count
from ie_core.fit.checkpoint import Checkpoint, FitSourceError, read_checkpoint
from ie_core.fit.items import GIB, Item, Workload
from ie_core.fit.report import FitReport
from ie_core.fit.shape import ConfigFieldError, ModelShape, model_shape
from ie_core.fit.sizing import fit
from ie_core.fit.targets import GPU_MIB, Target

__all__ = [
    "DEFAULT_L0",
    "GIB",
    "GPU_MIB",
    "Checkpoint",
    "ConfigFieldError",
    "FitReport",
    "FitSourceError",
    "Item",
    "ModelShape",
    "Target",
    "Workload",
    "fit",
    "model_shape",
    "node_count",
    "read_checkpoint",
]
