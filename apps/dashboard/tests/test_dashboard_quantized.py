"""The cheat-sheet cards list the quantized schemes each backend was verified on, read from the
validator runs in the database (never hand-written)."""

from __future__ import annotations

from dashboard_fixtures import AUTH, make_result
from fastapi.testclient import TestClient


def _quantized(engine: str, scheme: str) -> dict:
    result = make_result(f"ie-synthetic/llama-{scheme}", engine)
    result.update(quantization=scheme, dtype="bfloat16", tier="fused")
    return result


def _card(client: TestClient, arch: str, point: str) -> str:
    html = client.get("/fragments/card", params={"arch": arch, "point": point}).text
    return html[html.index("<h3>Quantized checkpoints</h3>") : html.index("<h3>In other engines")]


def test_cards_list_the_schemes_each_backend_was_verified_on(client: TestClient) -> None:
    for engine, scheme in (("vllm", "w8a8"), ("vllm-static", "w8a8"), ("vllm", "w4a16")):
        assert client.post(
            "/api/validator", json=_quantized(engine, scheme), headers=AUTH
        ).is_success
    # Negative control: a full-precision run of the same family claims no scheme.
    assert client.post("/api/validator", json=make_result(), headers=AUTH).is_success
    card = _card(client, "llama", "resid_post")
    rows = card.split("<tr")[2:]
    assert [(r.split("<code>")[1].split("<")[0], "w8a8" in r) for r in rows] == [
        ("eager", False),  # the reference produced it on w4a16
        ("eager", True),  # and on w8a8
        ("vllm", False),
        ("vllm", True),
        ("vllm-static", True),  # w8a8 only
    ], rows
    assert "rel ≤ 1.00e-06 on <code>ie-synthetic/llama-w8a8</code>" in card
    assert "ie-synthetic/llama</code>" not in card  # the full-precision run
    # A point the runs did not compare, and a family without quantized runs, claim nothing.
    assert "No validator run of a quantized" in _card(client, "llama", "mlp_act")
    assert "No validator run of a quantized" in _card(client, "mistral", "resid_post")
