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
    "VLLMModel": "host.backend",
    "create": "host.backend",
    "load_generate": "host.backend",
    "load_hooked": "host.backend",
    "require_engine": "entry",
    "SWEEP_MAX_MODEL_LEN": "entry",
    "VLLM_STACK": "entry",
    # host: the seam a backend composes
    "Engine": "host.engine",
    "on_cpu": "host.cpu_support",
    "check_cpu_support": "host.cpu_support",
    "exact_int8_dot": "host.cpu_support",
    "check_data_parallel": "host.parallel_support",
    "check_pipeline_parallel": "host.parallel_support",
    "Channel": "host.channel",
    "HookedChannel": "host.channel",
    "coalesced_drain": "host.channel",
    "SitePolicy": "host.policy",
    "RequestSpec": "specs",
    "SteerSpec": "specs",
    # how each point is reached (a hook, a recompute, or a refusal)
    "vllm_serving": "serving",
    # ie fit's prices every vLLM-based backend shares (vllm-static adds its buffers)
    "graph_pool_item": "memory_prices",
    "kv_item": "memory_prices",
    "RECOMPUTE_ATTN": "serving",
    # worker: points, batch layout, rows, the runner adapter
    "IEWorkerExtension": "worker.extension",
    "ATTN_POINTS": "worker.captures",
    "attention_rows": "worker.captures",
    "capture_sites": "worker.captures",
    "gather_captures": "worker.captures",
    "Keys": "worker.lifecycle",
    "Lifecycle": "worker.lifecycle",
    "Sites": "worker.lifecycle",
    "PointTable": "worker.point_table",
    "SiteDef": "worker.point_table",
    "BatchLayout": "worker.layout",
    "record_layout": "worker.runner_adapter",
    "carried": "worker.runner_adapter",
    "carried_arrivals": "worker.runner_adapter",
    "Rows": "worker.registry",
    "RETIRED_KEPT": "worker.lifecycle",
    "ReducerSpec": "specs",
    "gather_reduced": "worker.registry",
    "store_reduced": "worker.registry",
    "LoadedModel": "worker.runner_adapter",
    "loaded_model": "worker.runner_adapter",
    "buffer_rows": "worker.runner_adapter",
    "model_device": "worker.runner_adapter",
    "positions_buffer": "worker.runner_adapter",
    "runner_name": "worker.runner_adapter",
    "tp_rank": "worker.runner_adapter",
    "wrap_model_forward": "worker.runner_adapter",
    # pipeline stages: which layers this worker holds, and the host's merge of their answers
    "layer_range": "worker.stage",
    "merge_infos": "pipeline",
    "stage_of": "worker.stage",
    # host <-> device copies that do not stall the stream
    "Landing": "worker.transfer",
    "to_device": "worker.transfer",
    "to_host": "worker.transfer",
}
_MODULES = {
    "payload": "payload",
    "reducers": "worker.reducers",
}  # whole modules on the surface (`payload.encode` / `payload.decode`)

if TYPE_CHECKING:  # the same names, for type checkers (`tests` check both lists agree)
    from ie_vllm import payload as payload
    from ie_vllm.entry import SWEEP_MAX_MODEL_LEN as SWEEP_MAX_MODEL_LEN
    from ie_vllm.entry import VLLM_STACK as VLLM_STACK
    from ie_vllm.entry import require_engine as require_engine
    from ie_vllm.host.backend import VLLMModel as VLLMModel
    from ie_vllm.host.backend import create as create
    from ie_vllm.host.backend import load_generate as load_generate
    from ie_vllm.host.backend import load_hooked as load_hooked
    from ie_vllm.host.channel import Channel as Channel
    from ie_vllm.host.channel import HookedChannel as HookedChannel
    from ie_vllm.host.channel import coalesced_drain as coalesced_drain
    from ie_vllm.host.cpu_support import check_cpu_support as check_cpu_support
    from ie_vllm.host.cpu_support import exact_int8_dot as exact_int8_dot
    from ie_vllm.host.cpu_support import on_cpu as on_cpu
    from ie_vllm.host.engine import Engine as Engine
    from ie_vllm.host.parallel_support import check_data_parallel as check_data_parallel
    from ie_vllm.host.parallel_support import check_pipeline_parallel as check_pipeline_parallel
    from ie_vllm.host.policy import SitePolicy as SitePolicy
    from ie_vllm.memory_prices import graph_pool_item as graph_pool_item
    from ie_vllm.memory_prices import kv_item as kv_item
    from ie_vllm.pipeline import merge_infos as merge_infos
    from ie_vllm.serving import RECOMPUTE_ATTN as RECOMPUTE_ATTN
    from ie_vllm.serving import vllm_serving as vllm_serving
    from ie_vllm.specs import ReducerSpec as ReducerSpec
    from ie_vllm.specs import RequestSpec as RequestSpec
    from ie_vllm.specs import SteerSpec as SteerSpec
    from ie_vllm.worker import reducers as reducers
    from ie_vllm.worker.captures import ATTN_POINTS as ATTN_POINTS
    from ie_vllm.worker.captures import attention_rows as attention_rows
    from ie_vllm.worker.captures import capture_sites as capture_sites
    from ie_vllm.worker.captures import gather_captures as gather_captures
    from ie_vllm.worker.extension import IEWorkerExtension as IEWorkerExtension
    from ie_vllm.worker.layout import BatchLayout as BatchLayout
    from ie_vllm.worker.lifecycle import RETIRED_KEPT as RETIRED_KEPT
    from ie_vllm.worker.lifecycle import Keys as Keys
    from ie_vllm.worker.lifecycle import Lifecycle as Lifecycle
    from ie_vllm.worker.lifecycle import Sites as Sites
    from ie_vllm.worker.point_table import PointTable as PointTable
    from ie_vllm.worker.point_table import SiteDef as SiteDef
    from ie_vllm.worker.registry import Rows as Rows
    from ie_vllm.worker.registry import gather_reduced as gather_reduced
    from ie_vllm.worker.registry import store_reduced as store_reduced
    from ie_vllm.worker.runner_adapter import LoadedModel as LoadedModel
    from ie_vllm.worker.runner_adapter import buffer_rows as buffer_rows
    from ie_vllm.worker.runner_adapter import carried as carried
    from ie_vllm.worker.runner_adapter import carried_arrivals as carried_arrivals
    from ie_vllm.worker.runner_adapter import loaded_model as loaded_model
    from ie_vllm.worker.runner_adapter import model_device as model_device
    from ie_vllm.worker.runner_adapter import positions_buffer as positions_buffer
    from ie_vllm.worker.runner_adapter import record_layout as record_layout
    from ie_vllm.worker.runner_adapter import runner_name as runner_name
    from ie_vllm.worker.runner_adapter import tp_rank as tp_rank
    from ie_vllm.worker.runner_adapter import wrap_model_forward as wrap_model_forward
    from ie_vllm.worker.stage import layer_range as layer_range
    from ie_vllm.worker.stage import stage_of as stage_of
    from ie_vllm.worker.transfer import Landing as Landing
    from ie_vllm.worker.transfer import to_device as to_device
    from ie_vllm.worker.transfer import to_host as to_host


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(f"ie_vllm.{_MODULES[name]}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ie_vllm' has no attribute {name!r}")
    return getattr(importlib.import_module(f"ie_vllm.{module}"), name)


__all__ = [
    "ATTN_POINTS",
    "RECOMPUTE_ATTN",
    "RETIRED_KEPT",
    "SWEEP_MAX_MODEL_LEN",
    "VLLM_STACK",
    "BatchLayout",
    "Channel",
    "Engine",
    "HookedChannel",
    "IEWorkerExtension",
    "Keys",
    "Landing",
    "Lifecycle",
    "LoadedModel",
    "PointTable",
    "ReducerSpec",
    "RequestSpec",
    "Rows",
    "SiteDef",
    "SitePolicy",
    "Sites",
    "SteerSpec",
    "VLLMModel",
    "__version__",
    "attention_rows",
    "buffer_rows",
    "capture_sites",
    "carried",
    "carried_arrivals",
    "check_cpu_support",
    "check_data_parallel",
    "check_pipeline_parallel",
    "coalesced_drain",
    "create",
    "exact_int8_dot",
    "gather_captures",
    "gather_reduced",
    "graph_pool_item",
    "kv_item",
    "layer_range",
    "load_generate",
    "load_hooked",
    "loaded_model",
    "merge_infos",
    "model_device",
    "on_cpu",
    "payload",
    "positions_buffer",
    "record_layout",
    "reducers",
    "require_engine",
    "runner_name",
    "stage_of",
    "store_reduced",
    "to_device",
    "to_host",
    "tp_rank",
    "vllm_serving",
    "wrap_model_forward",
]
