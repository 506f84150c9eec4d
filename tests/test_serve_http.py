"""`ie serve` (vLLM's own OpenAI server with ie-vllm's worker extension) and the `remote` backend.

One real server on a loopback port (tests/conftest.py's `llama_server`, shared with
test_serve_hostile: ie-synthetic/llama on the CPU engine, fp32, an API key, one SAE),
driven by the `openai` package and by `load_model(url, backend="remote")`. References: eager on
the same folder (an independent engine, 1e-4) and the same server's serial answers (concurrent
requests must equal them to 1e-5; the worker registry is empty afterwards).
"""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

pytest.importorskip("vllm")
openai = pytest.importorskip("openai")

from ie_core import Additive, SamplingParams, load_model, steer_at  # noqa: E402
from ie_core.embedded import EmbeddedPrompt  # noqa: E402
from ie_core.experiments.patchscopes import read_patchscopes  # noqa: E402
from ie_core.runner import run  # noqa: E402
from ie_core.wire import STEERING_XARG, sampling_to_wire, steering_to_wire  # noqa: E402
from serve_process import LLAMA, LLAMA_KEY, SAE_NAME, SAE_POINT, SAE_WIDTH, sae_weights  # noqa: E402

pytestmark = [pytest.mark.slow]

MODEL, KEY = LLAMA, LLAMA_KEY
TOL_EAGER = 1e-4
TOL_SERIAL = 1e-5
PROMPT = "The quick brown fox jumps over the lazy dog"


def _local_sae() -> Any:
    from ie_core.experiments.saes import from_tensors

    return from_tensors(sae_weights(), address=SAE_POINT, b_dec_in=True)


@pytest.fixture(scope="module")
def server(llama_server: str) -> str:
    return llama_server


@pytest.fixture(scope="module")
def remote(server: str) -> Any:
    return load_model(server, backend="remote", api_key=KEY)


@pytest.fixture(scope="module")
def ref() -> Any:
    return load_model(MODEL, backend="eager", device="cpu", dtype="float32")


def _vector(width: int, seed: int) -> torch.Tensor:
    return torch.randn(width, generator=torch.Generator().manual_seed(seed))


def _spec(model: Any, seed: int = 0, coeff: float = 8.0) -> Any:
    return steer_at("resid_post.1", Additive(_vector(model.d_model, seed), coeff))


def _openai(server: str) -> Any:
    return openai.AsyncOpenAI(base_url=f"{server}/v1", api_key=KEY)


async def _completion(server: str, ids: list[int], steering: Any = None) -> list[int]:
    extra: dict[str, Any] = {"return_token_ids": True}
    if steering is not None:
        extra["vllm_xargs"] = {STEERING_XARG: json.dumps(steering_to_wire(steering))}
    async with _openai(server) as client:
        out = await client.completions.create(
            model=MODEL, prompt=ids, max_tokens=6, temperature=0.0, extra_body=extra
        )
    return list(out.choices[0].token_ids)  # type: ignore[attr-defined]


def test_remote_capture_equals_eager(remote: Any, ref: Any) -> None:
    ids = ref.to_tokens(PROMPT)
    assert remote.to_tokens(PROMPT) == ids
    addresses = [a for a in remote.info.widths if not a.startswith("attn_scores")]
    got = run(remote.capture([ids], addresses))
    want = run(ref.capture([ids], addresses))
    worst = max(float((got[a] - want[a]).abs().max()) for a in addresses)
    assert worst <= TOL_EAGER, worst
    spec = _spec(remote)
    steered = run(remote.capture([ids], ["resid_post.3"], steering=spec))["resid_post.3"]
    expected = run(ref.capture([ids], ["resid_post.3"], steering=spec))["resid_post.3"]
    assert float((steered - expected).abs().max()) <= TOL_EAGER
    # Negative control: the steering moved the tensor by far more than the tolerance.
    assert float((steered - want["resid_post.3"]).abs().max()) > 100 * TOL_EAGER
    # Per-prompt steering rides the plan: row 1 steered, row 0 not, in one request.
    rows = run(remote.capture([ids, ids], ["resid_post.3"], row_steering=[None, spec]))
    assert float((rows["resid_post.3"][0] - want["resid_post.3"][0]).abs().max()) <= TOL_EAGER
    assert float((rows["resid_post.3"][1] - expected[0]).abs().max()) <= TOL_EAGER


def test_probe_scores_over_remote_equal_eager(server: str, remote: Any, ref: Any) -> None:
    """`probe_scores` over `ie serve` scores in the server's worker (POST /v1/ie/probe_scores:
    only `scores` come back, no rows): the same numbers as eager's, steered too; bad probes are
    a 400 naming the problem."""
    from ie_core.experiments.probes import probe_scores
    from ie_core.wire import decode_tensors

    ids = ref.to_tokens(PROMPT)
    w = _vector(ref.d_model, 7)
    got = probe_scores(remote, [ids], "resid_post.2", w, bias=0.5)
    want = probe_scores(ref, [ids], "resid_post.2", w, bias=0.5)
    assert got.shape == want.shape == (1, len(ids))
    assert float((got - want).abs().max()) <= TOL_EAGER
    other = probe_scores(ref, [ids], "resid_post.3", w, bias=0.5)
    assert float((got - other).abs().max()) > 100 * TOL_EAGER  # negative control
    m = torch.stack([w, _vector(ref.d_model, 8)], dim=1)  # [width, 2], a sigmoid matrix probe
    spec = _spec(remote, seed=2)
    kw = {"bias": [0.1, -0.2], "activation": "sigmoid", "steering": spec}
    got = probe_scores(remote, [ids, ids], "resid_post.3", m, **kw)
    want = probe_scores(ref, [ids, ids], "resid_post.3", m, **kw)
    assert got.shape == want.shape == (2, len(ids), 2)
    assert float((got - want).abs().max()) <= TOL_EAGER
    # The route carries a capture plan whose reduction is the probe (`ie_core.reduce`).
    probe = {"kind": "probe", "weight": [[x] for x in w.tolist()], "bias": [0.5],
             "activation": "linear", "vector": True}  # fmt: skip

    def body(address: str = "resid_post.2", **bad: Any) -> dict[str, Any]:
        reduction = {"address": address, "label": "p", "last": False, "reducer": {**probe, **bad}}
        return {"prompts": [ids], "addresses": [], "reductions": [reduction]}

    r = _post(server, "/v1/ie/probe_scores", body())
    assert r.status_code == 200, r.text
    tensors, _ = decode_tensors(r.content)
    assert list(tensors) == ["p|scores"] and tensors["p|scores"].shape == (1, len(ids))
    assert len(r.content) < 1024  # the scores only: the rows would be len(ids) * d_model * 4 bytes
    for bad, word in ((body(weight=[[1.0]] * 7), "wide"), (body(weight="abc"), "numbers"),
                      (body(activation="softplus"), "activation"),
                      (body("resid_post.99"), "layer")):  # fmt: skip
        r = _post(server, "/v1/ie/probe_scores", bad)
        assert r.status_code == 400 and word in r.json()["error"]["message"], (bad, r.text)


def test_remote_generate_stream_and_lens_equal_eager(remote: Any, ref: Any) -> None:
    ids = ref.to_tokens("def add(a, b):")
    params = SamplingParams(max_new_tokens=5, stop_at_eos=False)
    spec = _spec(remote, seed=1)
    want = run(ref.generate(ids, params, steering=spec)).token_ids
    assert run(remote.generate(ids, params, steering=spec)).token_ids == want
    assert run(remote.generate(ids, params)).token_ids != want  # steering changed the tokens

    async def stream() -> list[int]:
        return [c.token_id async for c in remote.generate_stream(ids, params, steering=spec)]

    assert run(stream()) == list(want)
    captured = run(remote.capture_generation(ids, ["resid_post.2"], params, steering=spec))
    assert captured.generation.token_ids == want
    assert captured.cache["resid_post.2"].shape == (1, len(ids) + len(want) - 1, remote.d_model)
    h = run(ref.capture([ids], [f"resid_post.{ref.n_layers - 1}"]))[
        f"resid_post.{ref.n_layers - 1}"
    ][0]
    got, exp = run(remote.decode_residuals_topk(h, 3)), run(ref.decode_residuals_topk(h, 3))
    assert torch.equal(got.ids, exp.ids) and float((got.probs - exp.probs).abs().max()) <= TOL_EAGER
    logits = run(remote.decode_residuals(h))
    assert float((logits - run(ref.decode_residuals(h))).abs().max()) <= TOL_EAGER


def test_openai_client_gets_steered_completions(server: str, remote: Any, ref: Any) -> None:
    ids = ref.to_tokens("def add(a, b):")
    params = SamplingParams(max_new_tokens=6, stop_at_eos=False)
    spec = _spec(remote, seed=2)
    steered = asyncio.run(_completion(server, ids, spec))
    assert steered == list(run(ref.generate(ids, params, steering=spec)).token_ids)
    plain = asyncio.run(_completion(server, ids))
    assert plain == list(run(ref.generate(ids, params)).token_ids)
    assert plain != steered

    async def chat(stream: bool) -> str:
        extra = {"vllm_xargs": {STEERING_XARG: json.dumps(steering_to_wire(spec))}}
        async with _openai(server) as client:
            messages = [{"role": "user", "content": "hello"}]
            kw = {"model": MODEL, "messages": messages, "max_tokens": 4, "temperature": 0.0}
            if not stream:
                out = await client.chat.completions.create(**kw, extra_body=extra)
                return str(out.choices[0].message.content)
            parts = []
            async for chunk in await client.chat.completions.create(
                **kw, extra_body=extra, stream=True
            ):
                if chunk.choices and chunk.choices[0].delta.content:
                    parts.append(chunk.choices[0].delta.content)
            return "".join(parts)

    assert asyncio.run(chat(False)) == asyncio.run(chat(True))
    assert run(remote.stats())["registered"] == 0


def test_sixteen_concurrent_clients_equal_their_serial_runs(
    server: str, remote: Any, ref: Any
) -> None:
    ids = ref.to_tokens(PROMPT)
    params = SamplingParams(max_new_tokens=4, stop_at_eos=False)

    def jobs() -> list[Any]:
        out = []
        for i in range(16):
            spec = _spec(remote, seed=10 + i, coeff=4.0 + i)
            kind = i % 4
            if kind == 0:
                out.append(
                    lambda s=spec: remote.capture([ids], ["resid_post.2", "mlp_out.1"], steering=s)
                )
            elif kind == 1:
                out.append(lambda: remote.capture([ids], ["resid_post.2", "mlp_out.1"]))
            elif kind == 2:
                out.append(lambda s=spec: remote.generate(ids, params, steering=s))
            else:
                out.append(lambda s=spec: _completion(server, ids, s))
        return out

    serial = [run(job()) for job in jobs()]

    async def together() -> list[Any]:
        return list(await asyncio.gather(*(job() for job in jobs())))

    concurrent = asyncio.run(together())
    for i, (a, b) in enumerate(zip(serial, concurrent, strict=True)):
        if i % 4 in (0, 1):
            for address in ("resid_post.2", "mlp_out.1"):
                assert float((a[address] - b[address]).abs().max()) <= TOL_SERIAL, (i, address)
        elif i % 4 == 2:
            assert a.token_ids == b.token_ids, i
        else:
            assert a == b, i
    # Negative control: the steered and unsteered captures differ, so equality is meaningful.
    assert float((serial[0]["resid_post.2"] - serial[1]["resid_post.2"]).abs().max()) > 1.0
    stats = httpx.get(f"{server}/v1/ie/stats", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert stats["registered"] == 0 and stats["hooks"] == {}, stats


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        (
            "/v1/ie/capture",
            {"prompts": [[1, 2, 3]], "addresses": ["resid_post.99"]},
            400,
            "out of range",
        ),
        (
            "/v1/ie/capture",
            {"prompts": [[1, 2, 3]], "addresses": ["no_such_point.1"]},
            400,
            "no_such_point",
        ),
        ("/v1/ie/capture", {"addresses": ["resid_post.1"]}, 400, "lacks the field 'prompts'"),
        (
            "/v1/ie/generate",
            {
                "prompt": [1, 2],
                "steering": [
                    {
                        "point": "resid_post",
                        "layers": [1],
                        "ops": [{"kind": "additive", "vector": [1.0, 2.0], "coeff": 1.0}],
                    }
                ],
            },
            400,
            "width",
        ),
        (
            "/v1/ie/generate",
            {"prompt": [1, 2], "sampling": {"max_new_tokens": 0}},
            400,
            "max_new_tokens",
        ),
        (
            "/v1/completions",
            {"model": MODEL, "prompt": [1, 2], "vllm_xargs": {"ie_key": "someone-else"}},
            400,
            "set by the server",
        ),
        (
            "/v1/completions",
            {"model": MODEL, "prompt": [1, 2], "vllm_xargs": {STEERING_XARG: "{not json"}},
            400,
            "not valid JSON",
        ),
    ],
)
def test_bad_requests_get_a_4xx_with_a_sentence(
    server: str, path: str, body: Any, status: int, needle: str
) -> None:
    r = httpx.post(
        f"{server}{path}", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=120
    )
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]["message"]


def test_malformed_json_is_a_400(server: str) -> None:
    r = httpx.post(
        f"{server}/v1/ie/capture", content=b"{nope", headers={"Authorization": f"Bearer {KEY}"}
    )
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]


def _nan_steering(width: int) -> str:
    vector = ", ".join(["NaN"] + ["1.0"] * (width - 1))  # JSON as Python writes it: NaN is a token
    op = f'{{"kind": "additive", "vector": [{vector}], "coeff": 1.0}}'
    return f'[{{"point": "resid_post", "layers": [1], "ops": [{op}]}}]'


HOSTILE = [  # (path, raw body, needle): each must be a 4xx with a sentence, never a 5xx
    ("/v1/ie/capture", b"[1, 2]", "must be a JSON object"),
    ("/v1/ie/capture", b'{"prompts": [[1, 2]], "addresses": [1, 2]}', "list of strings"),
    ("/v1/ie/capture", b'{"prompts": [[-1, 2]], "addresses": ["resid_post.1"]}', ""),
    ("/v1/ie/capture", b'{"prompts": [[1.5]], "addresses": ["resid_post.1"]}', "integers"),
    ("/v1/ie/capture", b'{"prompts": 7, "addresses": ["resid_post.1"]}', "wrong type"),
    ("/v1/ie/capture", b'{"prompts": [[1, 2]], "addresses": ["resid_post.1"], "steering": 3}', ""),
    ("/v1/ie/generate", b'{"prompt": [1, 2], "sampling": {"temperature": "hot"}}', ""),
    ("/v1/ie/generate", b'{"prompt": [1, 2], "sampling": [1]}', "JSON object"),
    ("/v1/ie/generate", b'{"prompt": [1, 2], "sampling": {"bogus": 1}}', "unknown sampling"),
    ("/v1/ie/generate", b'{"prompt": [1, 2], "steering": [{"point": "resid_post"}]}', "ops"),
    ("/v1/ie/generate", b'{"prompt": [1, 2], "steering": [{"point": "nope", "ops": []}]}', ""),
    ("/v1/ie/generate_stream", b'{"prompt": []}', "empty"),
    ("/v1/ie/lens_topk?k=1000000000", b"", "vocabulary"),
    ("/v1/ie/lens_topk?k=-3", b"", "positive integer"),
    ("/v1/ie/decode_residuals", b"not safetensors", "safetensors"),
    ("/v1/ie/generate", b'{"prompt": {"ids": [1, 2], "vectors": [[5, [1.0]]]}}', "outside"),
    ("/v1/ie/generate", b'{"prompt": {"ids": [1, 2], "vectors": [[0, [NaN]]]}}', "finite"),
    ("/v1/ie/patchscope", b'{"source": [1, 2]}', "position"),
    ("/v1/ie/patchscope", b'{"source": [1, 2], "position": 0, "target": "nope"}', "presets"),
    ("/v1/ie/patchscope", b'{"source": [1, 2], "position": 0, "layers": [99]}', ""),
]


@pytest.mark.parametrize(("path", "body", "needle"), HOSTILE)
def test_hostile_input_is_a_4xx_never_a_5xx(
    server: str, path: str, body: bytes, needle: str
) -> None:
    headers = {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}
    r = httpx.post(f"{server}{path}", content=body, headers=headers, timeout=120)
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    assert needle in r.json()["error"]["message"], r.text


def test_nan_and_wrong_width_vectors_are_refused_on_every_route(server: str, remote: Any) -> None:
    headers = {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}
    nan = _nan_steering(remote.d_model)
    bodies = {
        "/v1/ie/generate": f'{{"prompt": [1, 2], "steering": {nan}}}',
        "/v1/ie/capture": f'{{"prompts": [[1, 2]], "addresses": ["resid_post.2"], "steering": {nan}}}',
        "/v1/completions": json.dumps(
            {"model": MODEL, "prompt": [1, 2], "vllm_xargs": {STEERING_XARG: nan}}
        ),
    }
    for path, body in bodies.items():
        r = httpx.post(f"{server}{path}", content=body.encode(), headers=headers, timeout=120)
        assert r.status_code == 400 and "NaN" in r.json()["error"]["message"], (path, r.text)
    rows = torch.zeros(2, remote.d_model + 1)
    from ie_core.wire import encode_tensors

    r = httpx.post(
        f"{server}/v1/ie/lens_topk?k=3",
        content=encode_tensors({"rows": rows}),
        headers={"Authorization": f"Bearer {KEY}"},
    )
    assert r.status_code == 400 and "d_model" in r.json()["error"]["message"], r.text
    assert run(remote.stats())["registered"] == 0


@pytest.mark.parametrize("path", ["/v1/ie/capture", "/v1/completions"])
def test_a_huge_request_is_a_413_before_its_body_is_read(server: str, path: str) -> None:
    host, port = server.removeprefix("http://").split(":")
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEY}\r\n"
        "Content-Type: application/json\r\nContent-Length: 1000000000000\r\n\r\n{"
    )
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(head.encode())
        reply = ""
        while "over the" not in reply:  # the status line and the JSON body may come apart
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk.decode("latin-1")
    assert reply.startswith("HTTP/1.1 413"), reply[:300]
    assert "over the" in reply
    # A prompt far longer than the model's positions: a 400 naming the limit.
    r = httpx.post(
        f"{server}/v1/ie/capture",
        json={"prompts": [[1] * 100_000], "addresses": ["resid_post.1"]},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=120,
    )
    assert r.status_code == 400, r.text


def test_the_api_key_is_enforced(server: str) -> None:
    for method, path in (
        ("GET", "/v1/ie/info"),
        ("POST", "/v1/ie/capture"),
        ("POST", "/v1/completions"),
    ):
        r = httpx.request(method, f"{server}{path}", json={})
        assert r.status_code == 401, (path, r.status_code)
    ok = httpx.get(f"{server}/v1/ie/info", headers={"Authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200 and ok.json()["n_layers"] == 4


def test_remote_patch_sweep_and_ablation_equal_eager(server: str, remote: Any, ref: Any) -> None:
    """Patch and Scale ride the steering wire; a Hook never leaves the client."""
    from ie_core.errors import UnsupportedOperationError
    from ie_core.experiments.patching import Metric, patch_sweep
    from ie_core.experiments.user_hooks import run_with_hooks
    from ie_core.ops import Scale

    clean, corrupt = (
        ref.to_tokens(PROMPT),
        ref.to_tokens("A slow grey cat walks under the busy dog"),
    )
    corrupt = corrupt[: len(clean)] + clean[len(corrupt) :]
    metric = Metric(
        "logit_0_minus_1", lambda logits, ids: logits[:, ids[0]] - logits[:, ids[1]], (5, 7)
    )
    got = patch_sweep(remote, clean, corrupt, metric=metric, layers=(0, 1))
    want = patch_sweep(ref, clean, corrupt, metric=metric, layers=(0, 1))
    assert float((got.values - want.values).abs().max()) <= TOL_EAGER * max(
        1.0, float(want.values.abs().max())
    )
    assert float((got.values - got.corrupt).abs().max()) > 100 * TOL_EAGER  # patching mattered
    zero = steer_at("mlp_out.0", Scale(0.0))
    a = run(remote.capture([clean], ["mlp_out.0", "resid_post.1"], steering=zero))
    assert float(a["mlp_out.0"].abs().max()) == 0.0
    with pytest.raises(UnsupportedOperationError, match="never sent to a server"):
        run_with_hooks(remote, [clean], [("resid_pre.1", lambda x, addr: x)])
    body = {
        "prompts": [clean],
        "addresses": ["resid_post.0"],
        "steering": [{"point": "resid_pre", "layers": [1], "ops": [{"kind": "hook"}]}],
    }
    r = httpx.post(
        f"{server}/v1/ie/capture",
        json=body,
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=120,
    )
    assert r.status_code == 400 and "unknown steering op" in r.json()["error"]["message"], r.text


def test_the_remote_key_can_come_from_the_environment(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the openai client reads OPENAI_API_KEY, the remote backend reads IE_API_KEY."""
    monkeypatch.setenv("IE_API_KEY", KEY)
    assert load_model(server, backend="remote").n_layers == 4
    monkeypatch.setenv("IE_API_KEY", "not-the-key")  # negative control: the variable is sent
    with pytest.raises(Exception, match=r"401|[Uu]nauthorized"):
        load_model(server, backend="remote")


def test_harvest_over_remote_equals_eager_captures(remote: Any, ref: Any, tmp_path: Path) -> None:
    from ie_core.harvest import harvest, open_harvest

    points = ["resid_post.1", "mlp_out.0"]
    docs = [f"{PROMPT} number {i} of a dozen." for i in range(12)]
    out = tmp_path / "remote-harvest"
    harvest(remote, out, points, documents=docs, context=24, shard_tokens=48, max_tokens=144)
    data = open_harvest(out)
    assert data.complete and data.manifest.spec["backend"] == "remote"
    assert len(data.manifest.shards) == 3 and data.tokens == 144
    want_ids = [t for d in docs for t in ref.to_tokens(d, prepend_bos=False)]
    got_ids = torch.cat([s["token_ids"][s["document"] >= 0] for s in data.iter_shards([])])
    assert got_ids.tolist() == want_ids[: len(got_ids)]
    for shard in data.iter_shards():
        for window in shard["window"].unique().tolist():
            rows = shard["window"] == window
            want = run(ref.capture([shard["token_ids"][rows].tolist()], points))
            for p in points:
                assert float((shard[p][rows] - want[p][0]).abs().max()) <= TOL_EAGER


# --- dictionaries served with --sae (issue 26) -----------------------------------------------


def _post(server: str, path: str, body: Any) -> httpx.Response:
    return httpx.post(
        f"{server}{path}", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=120
    )


def test_served_features_equal_eager_and_steer_by_name(remote: Any, ref: Any) -> None:
    from ie_core.experiments.features import feature_activations, feature_clamp, feature_steer

    sae = _local_sae()
    listed = run(remote.served_saes())[SAE_NAME]
    assert listed["address"] == SAE_POINT and listed["d_sae"] == SAE_WIDTH
    assert listed["key"] == sae.key  # the server loaded exactly these tensors
    ids = [ref.to_tokens(PROMPT), ref.to_tokens("Four score and seven years ago our fathers")]
    ids = [p[:8] for p in ids]
    got = feature_activations(remote, ids, SAE_NAME, k=5, stats=True)
    want = feature_activations(ref, ids, sae, k=5, stats=True)
    assert got.ids.shape == (2, 8, 5) and got.sq_error.shape == (2, 8)
    assert float((got.values - want.values).abs().max()) <= TOL_EAGER
    dense = feature_activations(remote, ids, {"a": SAE_NAME})["a"].acts
    assert float((dense - feature_activations(ref, ids, sae).acts).abs().max()) <= TOL_EAGER
    # Steering by name: the server's op is the one built here from the same dictionary.
    steer = remote.feature_op(SAE_NAME, 7, coeff=3.0)
    assert steer == feature_steer(sae, 7, 3.0)
    clamp = remote.feature_op(SAE_NAME, 7, value=2.0)
    assert clamp == feature_clamp(sae, 7, 2.0)
    spec = steer_at("resid_pre.1", clamp)
    steered = feature_activations(remote, ids, SAE_NAME, k=5, steering=steer_at(SAE_POINT, steer))
    expected = feature_activations(ref, ids, sae, k=5, steering=steer_at(SAE_POINT, steer))
    assert float((steered.values - expected.values).abs().max()) <= TOL_EAGER
    assert float((steered.values - want.values).abs().max()) > 100 * TOL_EAGER  # a control
    clamped = run(remote.capture(ids, ["resid_post.2"], steering=spec))["resid_post.2"]
    assert float((clamped - run(ref.capture(ids, ["resid_post.2"], steering=spec))["resid_post.2"]).abs().max()) <= TOL_EAGER  # fmt: skip
    # A named op inside a raw /v1/ie/capture request is resolved the same way.
    named = [{"point": "resid_pre", "layers": [1],
              "ops": [{"kind": "feature_clamp", "sae": SAE_NAME, "feature": 7, "value": 2.0}]}]  # fmt: skip
    r = _post(remote.server.url, "/v1/ie/capture", {"prompts": ids, "addresses": ["resid_post.2"], "steering": named})  # fmt: skip
    assert r.status_code == 200, r.text
    from ie_core.wire import decode_tensors

    assert torch.equal(decode_tensors(r.content)[0]["resid_post.2"], clamped)
    assert run(remote.stats())["registered"] == 0


def _features(name: str, **reducer: Any) -> dict[str, Any]:
    """A capture plan reading a served dictionary's features by name (the server's own point)."""
    wanted = {"kind": "sae", "dictionary": name, **reducer}
    reduction = {"address": "", "label": "f", "last": False, "reducer": wanted}
    return {"prompts": [[1, 2, 3]], "addresses": [], "reductions": [reduction]}


@pytest.mark.parametrize(
    ("path", "body", "needle"),
    [
        ("/v1/ie/features", _features("nope"), "served: res1"),
        ("/v1/ie/features", _features(SAE_NAME, k=97), "k must be"),
        (
            "/v1/ie/features",
            {"prompts": [[1, 2, 3]], "addresses": [], "reductions": SAE_NAME},
            "is a list",
        ),
        ("/v1/ie/feature_op", {"kind": "feature_steer", "sae": SAE_NAME, "feature": 96}, "outside"),
        ("/v1/ie/feature_op", {"kind": "additive", "sae": SAE_NAME, "feature": 1}, "'kind'"),
        (
            "/v1/ie/capture",
            {
                "prompts": [[1, 2]],
                "addresses": ["resid_post.1"],
                "steering": [
                    {
                        "point": "resid_post",
                        "layers": [1],
                        "ops": [{"kind": "feature_ablate", "sae": "nope", "feature": 1}],
                    }
                ],
            },
            "served: res1",
        ),
    ],
)
def test_bad_dictionary_requests_are_a_400_naming_the_problem(
    server: str, path: str, body: Any, needle: str
) -> None:
    r = _post(server, path, body)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]


def test_conditional_steering_over_http_equals_eager(server: str, remote: Any, ref: Any) -> None:
    """A Conditional travels as its wire form (the op nested) through the remote backend, the
    raw /v1/ie/capture route and the OpenAI completions route; a NaN threshold and a probe of the
    wrong width are a 400 naming the problem, before any forward."""
    from ie_core.ops import Conditional

    ids = ref.to_tokens(PROMPT)
    probe = _vector(ref.d_model, 5)
    rows = run(ref.capture([ids], ["resid_post.1"]))["resid_post.1"][0]
    scores = (rows.double() @ probe.double()).sort().values
    mid = len(scores) // 2
    op = Conditional(Additive(_vector(ref.d_model, 6), 8.0), probe, 0.0,
                     float(scores[mid - 1] + scores[mid]) / 2)  # fmt: skip
    assert 0 < int(op.holds(rows).sum()) < len(ids)
    spec = steer_at("resid_post.1", op)
    points = ["resid_post.1", "resid_post.3"]
    got = run(remote.capture([ids], points, steering=spec))
    want = run(ref.capture([ids], points, steering=spec))
    assert max(float((got[a] - want[a]).abs().max()) for a in points) <= TOL_EAGER
    plain = run(ref.capture([ids], ["resid_post.1"]))["resid_post.1"]
    moved = (got["resid_post.1"] - plain)[0].abs().amax(-1)
    assert ((moved > 1.0) == op.holds(rows)).all()  # steered exactly where the condition holds
    params = SamplingParams(max_new_tokens=6, stop_at_eos=False)
    want_tokens = list(run(ref.generate(ids, params, steering=spec)).token_ids)
    assert run(_completion(server, ids, spec)) == want_tokens
    headers = {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}
    wire = json.loads(json.dumps(steering_to_wire(spec)))
    bad_nan = json.dumps(wire).replace(
        '"threshold": ' + json.dumps(op.threshold), '"threshold": NaN'
    )
    narrow = json.loads(json.dumps(wire))
    narrow[0]["ops"][0]["probe"] = [1.0] * 7
    for body, word in ((bad_nan, "threshold"), (json.dumps(narrow), "probe")):
        r = httpx.post(f"{server}/v1/ie/capture", headers=headers, timeout=120,
                       content=f'{{"prompts": [{ids}], "addresses": ["resid_post.2"], "steering": {body}}}')  # fmt: skip
        assert r.status_code == 400 and word in r.json()["error"]["message"], r.text
    assert run(remote.stats())["registered"] == 0


def test_a_named_feature_condition_over_http_equals_eager(remote: Any, ref: Any) -> None:
    """`{"kind": "when_feature", "sae": NAME, ...}` resolves on the server into the Conditional
    that when_feature builds here from the same dictionary; an unknown feature index is a 400."""
    from ie_core.experiments.features import when_feature
    from ie_core.experiments.sae_math import encode
    from ie_core.wire import decode_tensors

    sae = _local_sae()
    ids = ref.to_tokens(PROMPT)
    acts = encode(run(ref.capture([ids], [SAE_POINT]))[SAE_POINT][0], sae.weights, sae.meta)
    f = int(((acts > 0).sum(0) - len(ids) / 2).abs().argmin())  # fires on about half the rows
    vec = _vector(ref.d_model, 8)
    op = when_feature(sae, f, Additive(vec, 8.0), 0.0)
    want = run(ref.capture([ids], ["resid_post.3"], steering=steer_at(SAE_POINT, op)))
    named = {"kind": "when_feature", "sae": SAE_NAME, "feature": f, "threshold": 0.0,
             "op": Additive(vec, 8.0).to_wire()}  # fmt: skip
    steering = [{"point": "resid_post", "layers": [1], "ops": [named]}]
    body = {"prompts": [ids], "addresses": ["resid_post.3"], "steering": steering}
    r = _post(remote.server.url, "/v1/ie/capture", body)
    assert r.status_code == 200, r.text
    got = decode_tensors(r.content)[0]["resid_post.3"]
    assert float((got - want["resid_post.3"]).abs().max()) <= TOL_EAGER
    plain = run(ref.capture([ids], ["resid_post.3"]))["resid_post.3"]
    assert float((got - plain).abs().max()) > 100 * TOL_EAGER  # a control: it steered
    bad = {**body, "steering": [{**steering[0], "ops": [{**named, "feature": SAE_WIDTH}]}]}
    r = _post(remote.server.url, "/v1/ie/capture", bad)
    assert r.status_code == 400 and "outside" in r.json()["error"]["message"], r.text
    # Judged at the dictionary's point, written two layers later (in the vLLM worker).
    later = [{"point": "resid_post", "layers": [3], "ops": [named]}]
    r = _post(remote.server.url, "/v1/ie/capture", {**body, "steering": later})
    assert r.status_code == 200, r.text
    want = run(ref.capture([ids], ["resid_post.3"], steering=steer_at("resid_post.3", op)))
    got = decode_tensors(r.content)[0]["resid_post.3"]
    assert float((got - want["resid_post.3"]).abs().max()) <= TOL_EAGER
    assert float((got - plain).abs().max()) > 100 * TOL_EAGER
    earlier = [{"point": "resid_post", "layers": [0], "ops": [named]}]  # judged after: refused
    r = _post(remote.server.url, "/v1/ie/capture", {**body, "steering": earlier})
    assert r.status_code == 400 and "not computed after" in r.json()["error"]["message"], r.text
    assert run(remote.stats())["registered"] == 0


def test_graph_interventions_over_http_equal_eager(server: str, remote: Any, ref: Any) -> None:
    """ie_core.circuits.intervene through the remote backend: each TranscoderClamp travels as
    its wire form (the read point with it), is judged at mlp_in.L on the server and gives eager's
    logits; an encoder of the wrong width is a 400 naming it, before any forward."""
    from ie_core.circuits import FeatureIntervention, TranscoderSet, intervene, random_transcoder
    from ie_core.circuits.interventions import clamp_steering

    ts = TranscoderSet.of(
        [random_transcoder(ref.d_model, 32, i, seed=40 + i) for i in range(ref.n_layers)]
    )
    ivs = [FeatureIntervention(0, 3, 6.0), FeatureIntervention(1, 4, 0.0, (1, 2))]
    got, want = intervene(remote, PROMPT, ts, ivs), intervene(ref, PROMPT, ts, ivs)
    assert float((got.logits_after - want.logits_after).abs().max()) <= TOL_EAGER * max(
        1.0, float(want.logits_after.abs().max())
    )
    assert float((want.logits_after - want.logits_before).abs().max()) > 1e-2
    wire = json.loads(json.dumps(steering_to_wire(clamp_steering(ts, ivs[:1]))))
    wire[0]["ops"][0]["encoder"] = [1.0] * 7
    headers = {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}
    ids = ref.to_tokens(PROMPT)
    r = httpx.post(f"{server}/v1/ie/capture", headers=headers, timeout=120,
                   content=json.dumps({"prompts": [ids], "addresses": ["resid_post.1"],
                                       "steering": wire}))  # fmt: skip
    assert r.status_code == 400 and "encoder" in r.json()["error"]["message"], r.text
    assert run(remote.stats())["registered"] == 0


def test_embedded_prompts_and_patchscope_reads_over_http_equal_eager(
    server: str, remote: Any, ref: Any
) -> None:
    ids = ref.to_tokens(PROMPT)
    params = SamplingParams(max_new_tokens=4, stop_at_eos=False)
    prompt = EmbeddedPrompt(ids, {2: _vector(ref.d_model, 3)})
    want = run(ref.generate(prompt, params)).token_ids
    assert run(remote.generate(prompt, params)).token_ids == want  # the plan carries the vectors
    assert run(remote.generate(ids, params)).token_ids != want  # control: the vectors matter
    body = {"source": ids, "position": -1, "layers": [0, 1], "sampling": sampling_to_wire(params)}
    r = httpx.post(
        f"{server}/v1/ie/patchscope", json=body, headers={"Authorization": f"Bearer {KEY}"},
        timeout=300,
    )  # fmt: skip
    assert r.status_code == 200, r.text
    reads = run(read_patchscopes(ref, ids, -1, [0, 1], sampling=params))
    assert [tuple(x["token_ids"]) for x in r.json()["reads"]] == [x.token_ids for x in reads]
    assert [x["layer"] for x in r.json()["reads"]] == [0, 1]
    assert run(remote.stats())["registered"] == 0
