"""Two independent `ie serve` replicas (the layout docs/SERVING.md recommends where one replica's
death must not stop the others): a replica killed mid-request gives its caller a named error
while the other keeps serving, its answers still equal to eager.

Long form only (IE_FULL_SUITE=1): two engine starts. `--data-parallel-size` cannot show this:
vLLM's balanced client stops every replica once one dies (tests/test_serve_dp2.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

pytest.importorskip("vllm")

from ie_core import load_model
from ie_core.errors import EngineDeadError
from ie_core.runner import run
from serve_process import engine_process, ie_serve

pytestmark = [pytest.mark.slow, pytest.mark.full]

MODEL = "ie-synthetic/llama"
TOL_EAGER = 1e-4
PROMPT = "The quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    folder = tmp_path_factory.mktemp("replicas")
    args = ["--max-model-len", "256", "--disable-uvicorn-access-log"]
    with contextlib.ExitStack() as stack:
        a = stack.enter_context(ie_serve(MODEL, args, folder / "a.log"))
        b = stack.enter_context(ie_serve(MODEL, args, folder / "b.log"))
        yield a, b


def test_one_replica_dies_and_the_other_keeps_serving(servers: tuple[str, str]) -> None:
    a, b = (load_model(url, backend="remote") for url in servers)
    ref = load_model(MODEL, backend="eager", device="cpu", dtype="float32")
    ids = ref.to_tokens(PROMPT)
    want = run(ref.capture([ids], ["resid_post.2"]))["resid_post.2"]
    for replica in (a, b):
        got = run(replica.capture([ids], ["resid_post.2"]))["resid_post.2"]
        assert float((got - want).abs().max()) <= TOL_EAGER

    victim = engine_process(servers[0])
    victim.suspend()  # the request is surely in flight when the engine dies

    async def in_flight_then_kill() -> Any:
        job = asyncio.ensure_future(a.capture([ids], ["resid_post.2"]))
        done, _ = await asyncio.wait([job], timeout=5)
        assert not done
        victim.kill()
        return (await asyncio.gather(job, return_exceptions=True))[0]

    error = asyncio.run(in_flight_then_kill())
    assert isinstance(error, EngineDeadError), repr(error)
    for _ in range(3):  # the other replica: whole, right answers, nothing left registered
        got = run(b.capture([ids], ["resid_post.2"]))["resid_post.2"]
        assert float((got - want).abs().max()) <= TOL_EAGER
    assert run(b.stats())["registered"] == 0
    assert httpx.get(f"{servers[1]}/health", timeout=10).status_code == 200
