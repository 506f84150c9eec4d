"""`ie serve ie-synthetic/llama --data-parallel-size 2`: two engine replicas behind vLLM's own
balancer (and, by vLLM's default, two API-server processes in front of them).

Cost: one server with two CPU replicas (about one engine start, ~3 min on a quiet 2-core
machine). References: eager on the same folder in-process (an independent engine, fp32, 1e-4) and
the same server's serial answers: 32 concurrent clients of four kinds (capture, steered capture,
steered generation, steered OpenAI completion) must each equal their serial run to 1e-5, both
replicas must have run forwards, and neither may hold a registration afterwards. Last, one
replica's engine process is killed mid-request: the caller gets a named error, never a hang or an
empty tensor (vLLM's balanced client then stops the whole server; docs/SERVING.md says so).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch

pytest.importorskip("vllm")

from ie_core import Additive, SamplingParams, load_model, steer_at
from ie_core.runner import run
from ie_core.wire import STEERING_XARG, steering_to_wire
from serve_process import engine_process, ie_serve

pytestmark = [pytest.mark.slow]

MODEL = "ie-synthetic/llama"
TOL_EAGER = 1e-4
TOL_SERIAL = 1e-5
PROMPT = "The quick brown fox jumps over the lazy dog"
CLIENTS = 32


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("serve_dp2") / "server.log"
    args = ["--data-parallel-size", "2", "--max-model-len", "256", "--disable-uvicorn-access-log"]
    with ie_serve(MODEL, args, log) as url:
        yield url


@pytest.fixture(scope="module")
def remote(server: str) -> Any:
    return load_model(server, backend="remote")


@pytest.fixture(scope="module")
def ref() -> Any:
    return load_model(MODEL, backend="eager", device="cpu", dtype="float32")


def _spec(width: int, seed: int, coeff: float = 8.0) -> Any:
    vector = torch.randn(width, generator=torch.Generator().manual_seed(seed))
    return steer_at("resid_post.1", Additive(vector, coeff))


def _stats(server: str) -> dict[str, Any]:
    return httpx.get(f"{server}/v1/ie/stats", timeout=60).json()


async def _completion(server: str, ids: list[int], spec: Any, max_tokens: int = 6) -> list[int]:
    body = {
        "model": MODEL,
        "prompt": ids,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "return_token_ids": True,
        "vllm_xargs": {STEERING_XARG: json.dumps(steering_to_wire(spec))},
    }
    async with httpx.AsyncClient(timeout=600) as client:
        r = await client.post(f"{server}/v1/completions", json=body)
    r.raise_for_status()
    return list(r.json()["choices"][0]["token_ids"])


def test_replicas_serve_captures_and_steering_equal_to_eager(
    server: str, remote: Any, ref: Any
) -> None:
    assert len(_stats(server)["replicas"]) == 2
    ids = ref.to_tokens(PROMPT)
    addresses = [a for a in remote.info.widths if not a.startswith("attn_scores")]
    want = run(ref.capture([ids], addresses))
    spec = _spec(ref.d_model, seed=1)
    expected = run(ref.capture([ids], ["resid_post.3"], steering=spec))["resid_post.3"]
    # Four of each, so vLLM's balancer gives both replicas some (checked by their forwards).
    for _ in range(4):
        got = run(remote.capture([ids], addresses))
        worst = max(float((got[a] - want[a]).abs().max()) for a in addresses)
        assert worst <= TOL_EAGER, worst
        steered = run(remote.capture([ids], ["resid_post.3"], steering=spec))["resid_post.3"]
        assert float((steered - expected).abs().max()) <= TOL_EAGER
        assert float((steered - want["resid_post.3"]).abs().max()) > 100 * TOL_EAGER
    params = SamplingParams(max_new_tokens=6, stop_at_eos=False)
    want_ids = list(run(ref.generate(ids, params, steering=spec)).token_ids)
    assert list(run(remote.generate(ids, params, steering=spec)).token_ids) == want_ids
    assert list(run(remote.generate(ids, params)).token_ids) != want_ids
    # The lens reads rows you pass on one replica (a stateless call), the same answer as eager.
    h = want[f"resid_post.{ref.n_layers - 1}"][0]
    got_top, want_top = (
        run(remote.decode_residuals_topk(h, 3)),
        run(ref.decode_residuals_topk(h, 3)),
    )
    assert torch.equal(got_top.ids, want_top.ids)
    assert float((got_top.probs - want_top.probs).abs().max()) <= TOL_EAGER


def test_32_mixed_clients_over_both_replicas_equal_their_serial_runs(
    server: str, remote: Any, ref: Any
) -> None:
    ids = ref.to_tokens(PROMPT)
    params = SamplingParams(max_new_tokens=4, stop_at_eos=False)
    captured = ["resid_post.2", "mlp_out.1"]

    def jobs() -> list[Any]:
        out = []
        for i in range(CLIENTS):
            spec = _spec(ref.d_model, seed=10 + i, coeff=4.0 + i)
            kind = i % 4
            if kind == 0:
                out.append(lambda s=spec: remote.capture([ids], captured, steering=s))
            elif kind == 1:
                out.append(lambda: remote.capture([ids], captured))
            elif kind == 2:
                out.append(lambda s=spec: remote.generate(ids, params, steering=s))
            else:
                out.append(lambda s=spec: _completion(server, ids, s))
        return out

    before = [r["forwards"] for r in _stats(server)["replicas"]]
    serial = [run(job()) for job in jobs()]

    async def together() -> list[Any]:
        return list(await asyncio.gather(*(job() for job in jobs())))

    concurrent = asyncio.run(together())
    for i, (a, b) in enumerate(zip(serial, concurrent, strict=True)):
        if i % 4 in (0, 1):
            for address in captured:
                assert float((a[address] - b[address]).abs().max()) <= TOL_SERIAL, (i, address)
        elif i % 4 == 2:
            assert a.token_ids == b.token_ids, i
        else:
            assert a == b, i
    # Negative control: steered and unsteered captures differ, so equality is meaningful.
    assert float((serial[0]["resid_post.2"] - serial[1]["resid_post.2"]).abs().max()) > 1.0
    stats = _stats(server)
    ran = [r["forwards"] - f for r, f in zip(stats["replicas"], before, strict=True)]
    print(f"forwards per replica during the serial and concurrent runs: {ran}")
    assert all(n > 0 for n in ran), ran
    assert stats["registered"] == 0 and stats["hooks"] == {}, stats
    assert all(r["registered"] == 0 and r["hooks"] == {} for r in stats["replicas"]), stats


def test_a_killed_replica_gives_its_callers_a_named_error(
    server: str, remote: Any, ref: Any
) -> None:
    """Runs last: vLLM stops the whole server once a replica dies."""
    from ie_core.errors import EngineDeadError

    ids = ref.to_tokens(PROMPT)
    victim = engine_process(server, "EngineCore_DP1")
    # Stopped first, so the requests are surely in flight when it dies: a registration waits
    # for every replica, and vLLM's balancer gives the stopped one its share.
    victim.suspend()

    async def four_then_kill() -> list[Any]:
        jobs = [asyncio.ensure_future(remote.capture([ids], ["resid_post.2"])) for _ in range(4)]
        done, _ = await asyncio.wait(jobs, timeout=10)
        assert not done, f"{len(done)} of 4 finished while replica 1 was stopped"
        victim.kill()
        return list(await asyncio.gather(*jobs, return_exceptions=True))

    started = time.monotonic()
    results = asyncio.run(four_then_kill())
    print(f"{time.monotonic() - started:.1f} s:", [repr(r)[:160] for r in results])
    for error in results:  # never a hang, an empty tensor or an anonymous failure
        assert isinstance(error, EngineDeadError), repr(error)[:500]
        assert "engine process died" in str(error)
    try:  # vLLM's balanced client stops every replica after one dies (docs/SERVING.md)
        after = httpx.get(f"{server}/health", timeout=10).status_code
    except httpx.HTTPError as exc:
        after = repr(exc)
    print("after the kill, /health:", after)
