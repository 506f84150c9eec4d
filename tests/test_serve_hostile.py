"""`ie serve` under hostile and careless clients (issue 31): every refusal a 4xx, the key on
every path, steering never silently dropped, text bounded before tokenizing, answers bounded
before running, a gone client's generation aborted, and a schema-driven fuzz run with no 5xx.

One real server (tests/conftest.py's `llama_server`, shared with test_serve_http: ie-synthetic/llama,
CPU engine, fp32, an API key, its whole 512-token context so a generation runs long enough to be
cancelled mid-way). Each test names the finding it covers.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections import Counter
from typing import Any

import httpx
import pytest
import torch

pytest.importorskip("vllm")

from ie_core import Additive, PositionMask, steer_at
from ie_core.wire import STEERING_XARG, decode_tensors, encode_tensors, steering_to_wire
from serve_process import LLAMA, LLAMA_CONTEXT, LLAMA_KEY

pytestmark = [pytest.mark.slow]

MODEL, KEY = LLAMA, LLAMA_KEY
AUTH = {"Authorization": f"Bearer {KEY}"}
CONTEXT = LLAMA_CONTEXT  # the synthetic model's positions
# Examples per operation (the run's request count is printed); the long form fuzzes more.
FUZZ_EXAMPLES = 40 if os.environ.get("IE_FULL_SUITE") == "1" else 6
TOL = 1e-5


@pytest.fixture(scope="module")
def server(llama_server: str) -> str:
    return llama_server


def _post(server: str, path: str, **kw: Any) -> httpx.Response:
    headers = {**AUTH, **kw.pop("headers", {})}
    return httpx.post(f"{server}{path}", headers=headers, timeout=120, **kw)


def _message(r: httpx.Response) -> str:
    return str(r.json()["error"]["message"])


def _info(server: str) -> dict[str, Any]:
    return httpx.get(f"{server}/v1/ie/info", headers=AUTH, timeout=60).json()


# --- finding 1: three 500s ------------------------------------------------------------------

DEEP = "[" * 1000 + "]" * 1000


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/ie/capture", '{"prompts": ' + DEEP + ', "addresses": ["resid_post.1"]}'),
        ("/v1/ie/generate", '{"prompt": [1], "steering": ' + DEEP + "}"),
        ("/v1/completions", '{"model": "m", "prompt": ' + DEEP + "}"),
        ("/v1/chat/completions", '{"model": "m", "messages": ' + DEEP + "}"),
    ],
)
def test_deeply_nested_json_is_a_400(server: str, path: str, body: str) -> None:
    r = _post(server, path, content=body.encode(), headers={"content-type": "application/json"})
    assert r.status_code == 400, (path, r.status_code, r.text[:300])


@pytest.mark.parametrize("path", ["/v1/ie/generate", "/v1/ie/generate_stream"])
def test_sampling_outside_vllms_range_is_a_400(server: str, path: str) -> None:
    body = {"prompt": [1, 2, 3], "sampling": {"temperature": 2.5, "max_new_tokens": 2}}
    r = _post(server, path, json=body)
    assert r.status_code == 400 and "temperature" in _message(r), r.text
    body = {**body, "addresses": ["resid_post.1"]}
    r = _post(server, "/v1/ie/capture_generation", json=body)
    assert r.status_code == 400 and "temperature" in _message(r), r.text


@pytest.mark.parametrize("path", ["/v1/ie/decode_residuals", "/v1/ie/lens_topk?k=3"])
def test_float8_and_integer_rows_are_a_400(server: str, path: str) -> None:
    d = _info(server)["d_model"]
    for rows in (torch.zeros(2, d).to(torch.float8_e4m3fn), torch.zeros(2, d, dtype=torch.int64)):
        r = _post(server, path, content=encode_tensors({"rows": rows}))
        assert r.status_code == 400 and "'rows' must be one of" in _message(r), r.text


# --- finding 2: generation without the key ---------------------------------------------------


def test_every_path_but_the_liveness_probes_needs_the_key(server: str) -> None:
    completion = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 2}
    for method, path in [
        ("POST", "/invocations"),
        ("GET", "/openapi.json"),
        ("GET", "/docs"),
        ("GET", "/metrics"),
        ("POST", "/tokenize"),
        ("POST", "/detokenize"),
    ]:
        r = httpx.request(method, f"{server}{path}", json=completion, timeout=60)
        assert r.status_code == 401, (path, r.status_code, r.text[:200])
    assert httpx.get(f"{server}/health", timeout=60).status_code == 200
    r = _post(server, "/invocations", json=completion)
    assert r.status_code == 200 and len(r.json()["choices"][0]["text"]) > 0, r.text


# --- finding 3: steering silently dropped ----------------------------------------------------


def _steering(d_model: int) -> str:
    vector = torch.ones(d_model)
    return json.dumps(steering_to_wire([steer_at("resid_post.1", Additive(vector))]))


def test_steering_or_a_key_is_refused_off_the_rewritten_routes(server: str) -> None:
    xargs = {STEERING_XARG: _steering(_info(server)["d_model"])}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    bodies = {
        "/invocations": {"model": MODEL, "prompt": [1, 2], "max_tokens": 2, "vllm_xargs": xargs},
        "/v1/chat/completions/batch": {
            "model": MODEL,
            "messages": [chat["messages"]],
            "max_tokens": 2,
            "vllm_xargs": xargs,
        },
    }
    for path, body in bodies.items():
        r = _post(server, path, json=body)
        assert r.status_code == 400 and STEERING_XARG in _message(r), (path, r.text[:300])
    keyed = {"vllm_xargs": {"ie_key": "someone-elses"}}
    for path, body in {
        "/invocations": {"model": MODEL, "prompt": [1, 2], "max_tokens": 2, **keyed},
        "/v1/responses": {"model": MODEL, "input": "hi", **keyed},
        "/v1/messages": {**chat, **keyed},
        "/v1/completions": {"model": MODEL, "prompt": [1, 2], "max_tokens": 2, **keyed},
    }.items():
        r = _post(server, path, json=body)
        assert r.status_code == 400 and "ie_key" in _message(r), (path, r.text[:300])


# --- finding 4: a text prompt freezes the server --------------------------------------------


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/v1/ie/generate"])
def test_a_16_mb_text_prompt_is_refused_before_tokenizing(server: str, path: str) -> None:
    # /v1/ie/generate tokenized it on the event loop (the finding); vLLM's own two routes
    # already refused it by a character bound, and now meet ie's byte bound first.
    text = "lorem ipsum " * (16 * 2**20 // 12)
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 1, "prompt": text}
    if path == "/v1/chat/completions":
        body = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": text}]}
    r = _post(server, path, json=body)
    assert r.status_code == 400 and "refused before tokenizing" in _message(r), r.text[:300]
    # A text that fits is still tokenized and served.
    small = {**body, "prompt": "lorem ipsum"} if "prompt" in body else None
    if small is not None:
        assert _post(server, path, json=small).status_code == 200


# --- finding 5: no limit on what comes back --------------------------------------------------


def test_an_over_budget_answer_is_refused_before_running(server: str) -> None:
    info = _info(server)
    addresses = [a for a in info["widths"] if a.startswith(("resid_post.", "attn_probs."))]
    prompts = [[1] * 511] * 200  # ~2 GB of rows, from a 0.6 MB body
    r = _post(server, "/v1/ie/capture", json={"prompts": prompts, "addresses": addresses})
    assert r.status_code == 413, r.text[:300]
    assert re.search(r"would return [0-9.]+ MiB", _message(r)) and "256" in _message(r)
    rows = torch.zeros(60_000, info["d_model"])  # top-k over the whole vocabulary: ~350 MiB
    r = _post(
        server, f"/v1/ie/lens_topk?k={info['vocab_size']}", content=encode_tensors({"rows": rows})
    )
    assert r.status_code == 413 and "MiB" in _message(r), r.text[:300]
    stats = httpx.get(f"{server}/v1/ie/stats", headers=AUTH, timeout=60).json()
    assert stats["registered"] == 0


def test_an_error_does_not_echo_unbounded_input(server: str) -> None:
    d = _info(server)["d_model"]
    mask = PositionMask(positions=tuple(range(10, 100_010)))  # none inside a 3-token prompt
    spec = steer_at("resid_post.1", Additive(torch.ones(d)), mask=mask)
    body = {"prompt": [1, 2, 3], "steering": steering_to_wire([spec])}
    r = _post(server, "/v1/ie/generate", json=body)
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    assert len(r.content) < 2000, len(r.content)


# --- finding 6: a gone client's non-streaming request keeps running -------------------------


def _metric(server: str, name: str) -> float:
    text = httpx.get(f"{server}/metrics", headers=AUTH, timeout=60).text
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name)]
    return sum(values)


async def _abandon(server: str, path: str, body: dict[str, Any]) -> None:
    """Send `body`, wait until the engine runs it, then close the connection."""
    async with httpx.AsyncClient(headers=AUTH, timeout=600) as client:
        task = asyncio.create_task(client.post(f"{server}{path}", json=body))
        while _metric(server, "vllm:num_requests_running") < 1:
            assert not task.done(), "the request finished before it was seen running"
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


# Long form only: on a loaded 2-core box the 496 tokens can finish before the disconnect is seen
# (it failed once in a fresh-clone run beside other engines); IE_FULL_SUITE=1 runs it.
@pytest.mark.full
@pytest.mark.parametrize("path", ["/v1/ie/generate", "/v1/ie/capture_generation"])
def test_a_gone_clients_generation_is_aborted(server: str, path: str) -> None:
    new = CONTEXT - 16
    body: dict[str, Any] = {
        "prompt": [1, 2, 3, 4],
        "sampling": {"max_new_tokens": new, "stop_at_eos": False},
    }
    if path.endswith("capture_generation"):
        body["addresses"] = ["resid_post.1"]
    before = _metric(server, "vllm:generation_tokens_total")
    asyncio.run(_abandon(server, path, body))
    while _metric(server, "vllm:num_requests_running") > 0:  # the abort reaches the engine
        asyncio.run(asyncio.sleep(0.05))
    generated = _metric(server, "vllm:generation_tokens_total") - before
    assert generated < new, f"{generated} of {new} tokens were generated for a gone client"
    stats = httpx.get(f"{server}/v1/ie/stats", headers=AUTH, timeout=60).json()
    assert stats["registered"] == 0


# --- the fuzz run -------------------------------------------------------------------------------

FUZZED = ("/v1/ie/", "/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize")
SENT: Counter[str] = Counter()


def _capture(server: str) -> torch.Tensor:
    body = {"prompts": [[1, 5, 9, 13, 17]], "addresses": ["resid_post.1"]}
    r = _post(server, "/v1/ie/capture", json=body)
    assert r.status_code == 200, r.text
    return decode_tensors(r.content)[0]["resid_post.1"]


def _bounded(case: Any) -> None:
    """Generation lengths and choice counts capped, so a fuzzed request costs milliseconds."""
    if isinstance(case.body, dict):
        for field in ("max_tokens", "max_completion_tokens", "n", "best_of"):
            if isinstance(case.body.get(field), int):
                case.body[field] = max(min(case.body[field], 4), -1)


def test_a_schema_driven_fuzz_run_finds_no_5xx(server: str) -> None:
    import schemathesis
    from hypothesis import HealthCheck, given, settings

    before = _capture(server)
    schema = schemathesis.openapi.from_url(f"{server}/openapi.json", headers=AUTH)
    schema.config.generation.update(
        modes=["positive", "negative"], max_examples=FUZZ_EXAMPLES, deterministic=True
    )
    failures: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        if not operation.path.startswith(FUZZED):
            continue

        @given(case=operation.as_strategy())
        @settings(
            max_examples=FUZZ_EXAMPLES,
            derandomize=True,
            database=None,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )
        def one(case: Any) -> None:
            _bounded(case)
            response = case.call(base_url=server, headers=AUTH, timeout=120)
            SENT[f"{case.method} {case.path}"] += 1
            if response.status_code >= 500:
                failures.append(f"{case.method} {case.path} {response.status_code}")

        one()
    print(f"serve fuzz: {sum(SENT.values())} requests over {len(SENT)} operations")
    assert not failures, failures[:20]
    assert httpx.get(f"{server}/health", timeout=60).status_code == 200
    after = _capture(server)
    torch.testing.assert_close(after, before, atol=TOL, rtol=0)
    stats = httpx.get(f"{server}/v1/ie/stats", headers=AUTH, timeout=60).json()
    assert stats["registered"] == 0
