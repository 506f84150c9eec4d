"""The CUDA worker class vllm-static names in `worker_cls` (the `vllm` wheel)."""

from __future__ import annotations

from vllm.v1.worker.gpu_worker import Worker

from ie_static.worker import StaticWorkerMixin


class StaticGPUWorker(StaticWorkerMixin, Worker):
    """vLLM's GPU worker with taps installed right after the weights load."""
