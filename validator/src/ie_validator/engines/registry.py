"""Engine names the sweep knows, and how to build each adapter."""

from __future__ import annotations

from ie_validator.engines.base import Engine

REFERENCE = "eager"
PEERS = ("transformer-lens", "nnsight", "nnterp")
PROJECT = ("vllm", "vllm-static")
ALL = (*PEERS, *PROJECT)


def make_engine(name: str) -> Engine:
    if name in ("eager", "vllm", "vllm-static"):
        from ie_validator.engines.project import ProjectEngine

        return ProjectEngine(name)
    if name == "hf-hooks":
        from ie_validator.engines.hf_hooks import HFHooksEngine

        return HFHooksEngine()
    if name == "transformer-lens":
        from ie_validator.engines.transformer_lens_engine import TransformerLensEngine

        return TransformerLensEngine()
    if name == "nnsight":
        from ie_validator.engines.nnsight_engine import NNsightEngine

        return NNsightEngine()
    if name == "nnterp":
        from ie_validator.engines.nnterp_engine import NNterpEngine

        return NNterpEngine()
    raise ValueError(f"unknown engine {name!r}; known: {REFERENCE}, hf-hooks, {', '.join(ALL)}")
