"""interp-engine static taps: capture and steering that survive torch.compile and CUDA graphs on vLLM.

The backend is `ie_static.backend.load` (entry point `vllm-static`); the taps are in `ie_static.ops`.
"""
