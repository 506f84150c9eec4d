"""Helpers the eager tests import: the synthetic families, loaded once per session, fp32 on CPU.

A module of its own (not conftest.py), so that `import` finds it by a name no other package's
tests use."""

from __future__ import annotations

import functools

import pytest
import torch
from ie_core.errors import PointUnavailableError
from ie_eager.backend import EagerModel, load
from ie_eager.resolve import Resolver
from ie_eager.synthetic import FAMILIES, build

torch.set_num_threads(min(2, torch.get_num_threads()))

# Families whose trunk or attention needs invariants of its own (test_eager_new_families.py):
# a multi-stream residual, linear-attention (and Mamba2) layers, latent attention, attention sinks.
SPECIAL_SLUGS = ("deepseek-v3", "deepseek-v4", "gpt-oss", "granitemoehybrid", "lfm2", "qwen3-next")
FAMILY_SLUGS = sorted(set(FAMILIES) - set(SPECIAL_SLUGS))
PROMPT = "The capital of France is Paris, and the capital of Japan is"


@functools.cache
def synthetic_model(slug: str) -> EagerModel:
    # The built folder directly, so these tests do not depend on the entry-point install.
    return load(str(build(slug)), device="cpu", dtype="float32")


def refusal_reason(resolver: Resolver, address: str) -> str:
    """The reason `resolver` refuses `address` with, after checking the message's whole form."""
    with pytest.raises(PointUnavailableError) as info:
        resolver.resolve(address)
    assert str(info.value) == (
        f"{address.split('.')[0]} is not available on this model: {info.value.reason}"
    )
    return info.value.reason
