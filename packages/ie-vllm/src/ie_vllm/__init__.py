"""interp-engine on vLLM: backends `vllm` (hooked) and `vllm-generate`, and the pieces a backend
with its own worker class (ie-static) builds on.

This is ie-vllm's public surface; the modules behind it are private. Names load on first use, so
`import ie_vllm` (entry points, `ie --version`) does not import torch or vLLM.
"""

from __future__ import annotations

import importlib
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

__version__ = version("ie-vllm")  # one source: the installed distribution's metadata

# public name -> the private module that defines it
_EXPORTS = {
    # host: the model and its loaders
    "VLLMModel": "backend",
    "create": "backend",
    "load_generate": "backend",
    "load_hooked": "backend",
    "require_engine": "entry",
    "SWEEP_MAX_MODEL_LEN": "entry",
    "VLLM_STACK": "entry",
    # host: the seam a backend composes
    "Engine": "engine",
    "on_cpu": "engine",
    "check_cpu_support": "cpu_support",
    "check_pipeline_parallel": "parallel_support",
    "Channel": "channel",
    "HookedChannel": "channel",
    "SitePolicy": "policy",
    "RequestSpec": "registry",
    "SteerSpec": "registry",
    # worker: points, batch layout, rows, the runner adapter
    "IEWorkerExtension": "worker",
    "ATTN_POINTS": "worker",
    "attention_rows": "worker",
    "capture_sites": "worker",
    "PointTable": "point_table",
    "SiteDef": "point_table",
    "BatchLayout": "layout",
    "record_layout": "layout",
    "Rows": "registry",
    "ReducerSpec": "reducers",
    "gather_reduced": "registry",
    "store_reduced": "registry",
    "LoadedModel": "runner_adapter",
    "loaded_model": "runner_adapter",
    "tp_rank": "runner_adapter",
    "wrap_model_forward": "runner_adapter",
}
_MODULES = (
    "payload",
    "reducers",
)  # whole modules on the surface (`payload.encode` / `payload.decode`)

if TYPE_CHECKING:  # the same names, for type checkers (`tests` check both lists agree)
    from ie_vllm import payload as payload
    from ie_vllm import reducers as reducers
    from ie_vllm.backend import VLLMModel as VLLMModel
    from ie_vllm.backend import create as create
    from ie_vllm.backend import load_generate as load_generate
    from ie_vllm.backend import load_hooked as load_hooked
    from ie_vllm.channel import Channel as Channel
    from ie_vllm.channel import HookedChannel as HookedChannel
    from ie_vllm.cpu_support import check_cpu_support as check_cpu_support
    from ie_vllm.engine import Engine as Engine
    from ie_vllm.engine import on_cpu as on_cpu
    from ie_vllm.entry import SWEEP_MAX_MODEL_LEN as SWEEP_MAX_MODEL_LEN
    from ie_vllm.entry import VLLM_STACK as VLLM_STACK
    from ie_vllm.entry import require_engine as require_engine
    from ie_vllm.layout import BatchLayout as BatchLayout
    from ie_vllm.layout import record_layout as record_layout
    from ie_vllm.parallel_support import check_pipeline_parallel as check_pipeline_parallel
    from ie_vllm.point_table import PointTable as PointTable
    from ie_vllm.point_table import SiteDef as SiteDef
    from ie_vllm.policy import SitePolicy as SitePolicy
    from ie_vllm.reducers import ReducerSpec as ReducerSpec
    from ie_vllm.registry import RequestSpec as RequestSpec
    from ie_vllm.registry import Rows as Rows
    from ie_vllm.registry import SteerSpec as SteerSpec
    from ie_vllm.registry import gather_reduced as gather_reduced
    from ie_vllm.registry import store_reduced as store_reduced
    from ie_vllm.runner_adapter import LoadedModel as LoadedModel
    from ie_vllm.runner_adapter import loaded_model as loaded_model
    from ie_vllm.runner_adapter import tp_rank as tp_rank
    from ie_vllm.runner_adapter import wrap_model_forward as wrap_model_forward
    from ie_vllm.worker import ATTN_POINTS as ATTN_POINTS
    from ie_vllm.worker import IEWorkerExtension as IEWorkerExtension
    from ie_vllm.worker import attention_rows as attention_rows
    from ie_vllm.worker import capture_sites as capture_sites


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(f"ie_vllm.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ie_vllm' has no attribute {name!r}")
    return getattr(importlib.import_module(f"ie_vllm.{module}"), name)


__all__ = [
    "ATTN_POINTS",
    "SWEEP_MAX_MODEL_LEN",
    "VLLM_STACK",
    "BatchLayout",
    "Channel",
    "Engine",
    "HookedChannel",
    "IEWorkerExtension",
    "LoadedModel",
    "PointTable",
    "ReducerSpec",
    "RequestSpec",
    "Rows",
    "SiteDef",
    "SitePolicy",
    "SteerSpec",
    "VLLMModel",
    "__version__",
    "attention_rows",
    "capture_sites",
    "check_cpu_support",
    "check_pipeline_parallel",
    "create",
    "gather_reduced",
    "load_generate",
    "load_hooked",
    "loaded_model",
    "on_cpu",
    "payload",
    "record_layout",
    "reducers",
    "require_engine",
    "store_reduced",
    "tp_rank",
    "wrap_model_forward",
]
