"""Shared fixtures: synthetic families loaded once per session, fp32 on CPU."""

from __future__ import annotations

import pytest
from eager_support import FAMILY_SLUGS, synthetic_model
from ie_eager.backend import EagerModel


@pytest.fixture(params=FAMILY_SLUGS)
def family_model(request: pytest.FixtureRequest) -> EagerModel:
    return synthetic_model(request.param)
