"""`ie serve`'s command line and plugin allowlist (no engine started)."""

from __future__ import annotations

import importlib.util
import json

import pytest
from ie_core.errors import (
    EngineDeadError,
    LayerOutOfRangeError,
    PointUnavailableError,
    SteeringSpecError,
)
from ie_vllm.server.http_errors import BadRequest, declared_length, status_for
from ie_vllm.server.serve_command import PLUGIN, cpu_thread_binding, plugins_allowlist, serve_argv


def test_serve_argv_runs_vllm_serve_hooked_with_the_extension() -> None:
    argv = serve_argv("ie-synthetic/llama", "vllm", ["--port", "9", "--api-key", "k"])
    assert argv[0] == "serve" and argv[1].endswith("llama-v1")
    assert (
        argv[argv.index("--worker-extension-cls") + 1]
        == "ie_vllm.worker.extension.IEWorkerExtension"
    )
    assert "--enforce-eager" in argv and argv[-4:] == ["--port", "9", "--api-key", "k"]
    assert argv[argv.index("--served-model-name") + 1] == "ie-synthetic/llama"
    assert "--enforce-eager" not in serve_argv("ie-synthetic/llama", "vllm-generate", [])


def test_vllm_static_is_served_with_its_worker_and_declared_sites() -> None:
    pytest.importorskip("ie_static")
    argv = serve_argv("ie-synthetic/llama", "vllm-static", ["--static-points", "resid_post"])
    assert argv[argv.index("--worker-cls") + 1].startswith("ie_static.worker_")
    extra = json.loads(argv[argv.index("--additional-config") + 1])
    assert extra["ie_static"]["reads"] == [f"resid_post.{i}" for i in range(4)]
    assert "--enforce-eager" not in argv and "--static-points" not in argv
    assert "--max-num-batched-tokens" in argv


def test_vllm_static_refuses_enforce_eager_and_unknown_backends_are_named() -> None:
    pytest.importorskip("ie_static")
    with pytest.raises(Exception, match="enforce-eager is refused"):
        serve_argv("ie-synthetic/llama", "vllm-static", ["--enforce-eager"])
    with pytest.raises(SystemExit, match="served backends: vllm, vllm-generate"):
        serve_argv("ie-synthetic/llama", "no-such-backend", [])


def test_cpu_ranks_get_their_own_cpus() -> None:
    assert cpu_thread_binding([], [0, 1]) is None
    assert cpu_thread_binding(["--tensor-parallel-size", "2"], [0, 1]) == "0|1"
    assert cpu_thread_binding(["-tp=2", "-pp", "2"], list(range(8))) == "0,1|2,3|4,5|6,7"
    assert cpu_thread_binding(["--tensor-parallel-size", "4"], [0, 1]) == "nobind"


def test_refusals_map_to_4xx_and_engine_failures_to_503() -> None:
    assert status_for(BadRequest("x", 413)) == 413
    assert status_for(LayerOutOfRangeError("resid_post.99")) == 400
    assert status_for(SteeringSpecError("NaN")) == 400
    assert status_for(PointUnavailableError("tp")) == 422
    assert status_for(EngineDeadError("gone")) == 503
    assert status_for(RuntimeError("bug")) == 500
    with pytest.raises(BadRequest) as info:
        declared_length({"content-length": str(10**12)})
    assert info.value.status == 413
    with pytest.raises(BadRequest):
        declared_length({"content-length": "-5"})


def test_the_endpoint_plugin_is_allowlisted_without_dropping_other_plugins() -> None:
    assert plugins_allowlist("a, b") == f"a,b,{PLUGIN}"
    assert plugins_allowlist(f"{PLUGIN}") == PLUGIN
    assert plugins_allowlist(None).split(",")[-1] == PLUGIN


def test_data_parallel_is_served_on_hooked_vllm_and_refused_elsewhere() -> None:
    for rest in (["--data-parallel-size", "2"], ["-dp=2"]):
        assert rest[-1] in serve_argv("ie-synthetic/llama", "vllm", rest)
        with pytest.raises(SystemExit, match="not served on backend 'vllm-generate'"):
            serve_argv("ie-synthetic/llama", "vllm-generate", rest)
    with pytest.raises(SystemExit, match="ie serve: an externally balanced data-parallel rank"):
        serve_argv("ie-synthetic/llama", "vllm", ["--data-parallel-rank", "0"])
    if importlib.util.find_spec("ie_static") is not None:
        with pytest.raises(SystemExit, match="data_parallel_size=2 is not served on backend "):
            serve_argv("ie-synthetic/llama", "vllm-static", ["-dp", "2"])


def test_data_parallel_replicas_get_their_own_cpus() -> None:
    # vLLM reads one CPU list per rank, replica-major ([DP, PP, TP]).
    assert cpu_thread_binding(["-dp", "2"], [0, 1]) == "0|1"
    assert cpu_thread_binding(["-dp", "2", "-tp", "2"], list(range(8))) == "0,1|2,3|4,5|6,7"
    assert cpu_thread_binding(["-dp", "2", "-pp", "2"], [0, 1]) == "nobind"


def test_the_server_mounts_exactly_the_routes_the_remote_backend_calls() -> None:
    """One table (`ie_core.wire.ROUTES`) for both sides: a route added to the server and not to
    the table, or renamed on one side, fails here."""
    from ie_core.wire import ROUTES
    from ie_vllm.server.http_features import features_router
    from ie_vllm.server.http_patchscopes import patchscope_router
    from ie_vllm.server.http_routes import router

    mounted = {
        (method, route.path)
        for r in (router, features_router, patchscope_router)
        for route in r.routes
        for method in getattr(route, "methods", ())
    }
    assert mounted == {(r.method, r.url) for r in ROUTES.values()}
    assert len(mounted) == 13  # not two empty sets agreeing


class _Gone:
    """A request whose client disconnects after `after_s`, on a server whose engine reports
    `stop` (None: healthy) from `stop_after_s` on."""

    def __init__(self, after_s: float, stop: Exception | None, stop_after_s: float) -> None:
        import time
        from types import SimpleNamespace

        self._after_s, self._t0 = after_s, time.monotonic()
        model = SimpleNamespace(
            stop_reason=lambda: stop if time.monotonic() - self._t0 >= stop_after_s else None
        )
        self.app = SimpleNamespace(state=SimpleNamespace(ie_model=model))

    async def receive(self) -> dict[str, str]:
        import asyncio

        await asyncio.sleep(self._after_s)
        return {"type": "http.disconnect"}


def _abandoned(request: _Gone) -> tuple[BaseException | None, float, bool]:
    """Run 10 s of work under `_unless_gone`: (what it raised, seconds until the work was
    cancelled, whether the work was cancelled)."""
    import asyncio
    import time

    from ie_vllm.server.http_routes import _unless_gone

    seen: dict[str, float] = {}

    async def work() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            seen["cancelled"] = time.monotonic()
            raise
        return "done"

    async def main() -> BaseException | None:
        try:
            await _unless_gone(request, work())  # type: ignore[arg-type]
        except Exception as exc:
            return exc
        return None

    t0 = time.monotonic()
    raised = asyncio.run(main())
    return raised, seen.get("cancelled", float("inf")) - t0, "cancelled" in seen


def test_a_gone_clients_work_is_aborted_at_once_then_a_499(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ie_vllm.server.http_routes.DISCONNECT_GRACE_S", 2.0)
    raised, cancelled_after, cancelled = _abandoned(_Gone(0.05, None, 0.0))
    assert cancelled and cancelled_after < 0.5, cancelled_after  # not held for the grace
    assert isinstance(raised, BadRequest) and raised.status == 499, raised


def test_a_disconnect_from_a_dying_engine_gets_the_engines_error() -> None:
    """The server stops when its engine dies, disconnecting the request before the engine's
    death shows: the work is aborted at once, and the answer waits for the engine's reason."""
    dead = EngineDeadError("the engine process died")
    raised, cancelled_after, _ = _abandoned(_Gone(0.05, dead, 1.0))
    assert cancelled_after < 0.5, cancelled_after
    assert raised is dead, raised


def test_generate_stream_lines_are_tokens_only() -> None:
    """A chunk's `reduced` (a streamed plan's per-step outputs) stays off `/generate_stream`'s
    lines: each is byte for byte the line written before chunks carried reductions."""
    from dataclasses import asdict

    from ie_core.logprobs import StepLogprobs
    from ie_core.protocol import StreamChunk
    from ie_vllm.server.http_routes import _chunk_line

    step = StepLogprobs(5, -0.5, (5, 7), (-0.5, -1.0))
    want = (
        b'{"token_id": 5, "text": " a", "logprobs": {"token_id": 5, "logprob": -0.5, '
        b'"top_ids": [5, 7], "top_logprobs": [-0.5, -1.0]}}\n'
    )
    assert _chunk_line(StreamChunk(5, " a", step)) == want
    assert _chunk_line(StreamChunk(5, " a", step, {"x": {"ids": [1]}})) == want
    assert _chunk_line(StreamChunk(6, "b")) == b'{"token_id": 6, "text": "b", "logprobs": null}\n'
    assert "reduced" in asdict(StreamChunk(6, "b"))  # control: the plain form would carry it
