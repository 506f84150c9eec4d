"""Free functions, the sync mirror, `steer` and backend dispatch, against a tiny in-test backend."""

from __future__ import annotations

import pytest
from ie_core import Additive, load_model, steer, steer_at
from ie_core.api import _with_active
from ie_core.cache import ActivationCache
from ie_core.errors import BackendNotInstalledError
from ie_core.runner import iterate, run


def test_cache_accepts_every_address_form() -> None:
    cache = ActivationCache({"resid_post.3": 1, ("embeddings", None): 2})
    assert cache["resid_post.3"] == cache[("resid_post", 3)] == 1
    assert "embeddings" in cache and "resid_post.4" not in cache
    with pytest.raises(KeyError, match=r"resid_post\.4 was not captured"):
        cache["resid_post.4"]


def test_steer_context_stacks_and_unwinds() -> None:
    model, other = object(), object()
    a = steer_at("resid_post.1", Additive([1.0]))
    b = steer_at("resid_post.2", Additive([2.0]))
    with steer(model, a):  # type: ignore[arg-type]
        with steer(model, b):  # type: ignore[arg-type]
            assert _with_active(model, None) == (a, b)  # type: ignore[arg-type]
            assert _with_active(other, None) == ()  # type: ignore[arg-type]
        assert _with_active(model, b) == (a, b)  # type: ignore[arg-type]
    assert _with_active(model, None) == ()  # type: ignore[arg-type]


def test_runner_runs_coroutines_and_async_iterators() -> None:
    async def double(x: int) -> int:
        return 2 * x

    async def count():  # type: ignore[no-untyped-def]
        for i in range(3):
            yield i

    assert run(double(21)) == 42
    assert list(iterate(count())) == [0, 1, 2]


def test_unknown_backend_is_refused_with_the_known_names() -> None:
    with pytest.raises(BackendNotInstalledError, match=r"unknown backend .tpu.*eager"):
        load_model("ie-synthetic/llama", backend="tpu")
