"""Pages and fragments: what the cheat sheet, compare, throughput and validation pages show."""

from __future__ import annotations

import re

import pytest
from dashboard_fixtures import AUTH, make_cell, make_result
from fastapi.testclient import TestClient
from ie_core.capabilities import BACKENDS as CAP_BACKENDS
from ie_core.capabilities import cell
from ie_core.grammar import FAMILIES, POINTS, get_family, get_point

MARKS = {"served": "✓", "refused": "✗", "not verified": "·"}
EVIL = 'org/<script>alert("x")</script>'


def _absent_points(html: str) -> set[str]:
    return set(re.findall(r'id="pt-([a-z_]+)" class="pt [a-z]+ [a-z_]+ absent', html))


def _diagram_points(html: str) -> set[str]:
    return set(re.findall(r'id="pt-([a-z_]+)" class="pt ', html))


def test_diagram_shows_every_point_and_marks_what_the_family_lacks(client: TestClient) -> None:
    for family in FAMILIES:
        html = client.get("/", params={"arch": family.slug}).text
        assert _diagram_points(html) == {p.name for p in POINTS}, family.slug
        assert _absent_points(html) == {p.name for p in POINTS if not family.has_point(p)}, (
            family.slug
        )
        # Parallel blocks have no residual between attention and MLP: one join instead of two.
        parallel = "parallel_block" in {t.value for t in family.traits}
        assert html.count('class="join"') == (1 if parallel else 2), family.slug


def test_deep_link_renders_the_card_for_that_layer(client: TestClient) -> None:
    html = client.get("/", params={"arch": "llama", "point": "resid_post.9"}).text
    card = html[html.index('<section id="card"') :]
    assert 'data-point="resid_post"' in card
    assert "resid_post.9" in card
    assert "blocks.9.hook_resid_post" in card
    assert "model.layers[9].output" in card and "layers_output[9]" in card
    assert 'class="pt spine read_write selected"' in html
    # One snippet per backend; vllm-generate's is the refusal, not code.
    assert card.count('<pre id="code-') == 4
    assert "# refused on vllm-generate" in card


def _serving_marks(card: str) -> list[str]:
    table = card[card.index('<table class="serving">') : card.index("</table>")]
    return re.findall(r"<td>(✓|✗|·) ", table)


def test_card_fragment_explains_absent_and_refused_points(client: TestClient) -> None:
    neox = client.get("/fragments/card", params={"arch": "gpt-neox", "point": "resid_mid"}).text
    assert not neox.lstrip().startswith("<!doctype")  # a fragment, not a page
    # Eager refuses it with the family's reason; each backend's mark is its committed answer.
    assert get_family("gpt-neox").missing_reason(get_point("resid_mid")) in neox
    assert "✗ refused" in neox
    expected = [MARKS[cell(b, "gpt-neox", "resid_mid").split(":")[0]] for b in CAP_BACKENDS]
    assert _serving_marks(neox) == [*expected, "✗"]  # vllm-generate never captures
    lm_head = client.get("/fragments/card", params={"arch": "llama", "point": "lm_head"}).text
    assert _serving_marks(lm_head)[0] == "✓"  # the eager sweep captured it
    assert "capture only" in lm_head


def test_cards_show_a_refused_family_with_the_backends_reason(client: TestClient) -> None:
    """DeepSeek-V4 serves resid_streams on eager; vLLM CPU cannot build it, so both vLLM
    backends show a cross with vLLM's own error, never a check mark or a blank."""
    card = client.get("/fragments/card", params={"arch": "deepseek-v4", "point": "resid_streams.0"})
    marks = _serving_marks(card.text)
    assert marks[0] == "✓" and set(marks[1:]) == {"✗"}
    assert "cannot run DeepseekV4ForCausalLM" in card.text


def test_multi_stream_trunks_address_residual_points_with_a_stream(client: TestClient) -> None:
    card = client.get(
        "/fragments/card", params={"arch": "deepseek-v4", "point": "resid_post.3"}
    ).text
    assert "resid_post.3.stream-0" in card and ".stream-N" in card
    plain = client.get("/fragments/card", params={"arch": "llama", "point": "resid_post.3"}).text
    assert "stream-0" not in plain


def test_a_stream_deep_link_renders_that_stream(client: TestClient) -> None:
    page = client.get("/", params={"arch": "deepseek-v4", "point": "resid_post.3.stream-1"}).text
    assert '<code class="addr">resid_post.3.stream-1</code>' in page
    assert '"resid_post.3.stream-0"' not in page  # the copied address is stream 1 too
    one = client.get("/", params={"arch": "llama", "point": "resid_post.3.stream-1"})
    assert one.status_code == 404 and "one residual stream" in one.text


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"arch": "nope"}, "unknown architecture"),
        ({"arch": "llama", "point": "bogus.1"}, "unknown point"),
        ({"arch": "llama", "point": "resid_post.x"}, "bad point"),
        ({"arch": "llama", "point": "final_norm.3"}, "trunk point"),
    ],
)
def test_bad_deep_links_are_404_with_the_reason(client: TestClient, params, needle) -> None:
    r = client.get("/", params=params)
    assert r.status_code == 404 and needle in r.text


def test_compare_marks_the_differing_points(client: TestClient) -> None:
    llama, neox = get_family("llama"), get_family("gpt-neox")
    expected = {p.name for p in POINTS if llama.has_point(p) != neox.has_point(p)}
    html = client.get("/compare", params={"a": "llama", "b": "gpt-neox"}).text
    marked = set(re.findall(r'<tr class="differs presence">\s*<td><code>([a-z_]+)</code>', html))
    assert marked == expected and "resid_mid" in marked
    assert f"{len(expected)} of {len(POINTS)} points exist on one side only" in html


def test_compare_marks_same_name_different_tensor(client: TestClient) -> None:
    """Llama and Gemma 2 have the same 34-point set, but Gemma 2's *_out_post are normed tensors."""
    llama, gemma2 = get_family("llama"), get_family("gemma2")
    assert [p.name for p in llama.points] == [p.name for p in gemma2.points]
    html = client.get("/compare", params={"a": "llama", "b": "gemma2"}).text
    meaning = set(re.findall(r'<tr class="differs meaning">\s*<td><code>([a-z_]+)</code>', html))
    assert {"attn_out_post", "mlp_out_post", "embeddings", "attn_scores", "lm_head"} <= meaning
    assert "resid_post" not in meaning and "differs presence" not in html
    card = client.get("/fragments/card", params={"arch": "gemma2", "point": "attn_out_post"}).text
    assert "a different tensor from attn_out" in card
    card = client.get("/fragments/card", params={"arch": "llama", "point": "attn_out_post"}).text
    assert "the same values as attn_out" in card


def test_throughput_shows_multipliers_over_eager(client: TestClient) -> None:
    for variant, one, conc in (
        ("eager", 20.0, 16.0),
        ("vllm", 30.0, 120.0),
        ("vllm-generate", 45.0, 200.0),
    ):
        cell = make_cell(variant=variant, decode=one, aggregate=conc)
        assert client.post("/api/benchmarks", json=cell, headers=AUTH).status_code == 201
    figures = {f["variant"]: f for f in client.get("/api/throughput").json()[0]["figures"]}
    assert figures["vllm"]["one_mult"] == pytest.approx(1.5, abs=1e-12)
    assert figures["vllm"]["concurrent_mult"] == pytest.approx(7.5, abs=1e-12)
    assert figures["vllm-generate"]["concurrent_mult"] == pytest.approx(12.5, abs=1e-12)
    html = client.get("/throughput").text
    assert "7.5x" in html and "12x" in html
    assert "Test CPU (2 threads), float32, profile cpu" in html
    assert html.count('class="bar one"') == 3 and html.count('class="bar conc"') == 3


def test_throughput_keeps_profiles_apart(client: TestClient) -> None:
    """A GPU sweep and a CPU sweep of one model are two cards; multipliers never cross them."""
    for profile, eager, vllm in (("cpu", 10.0, 40.0), ("gpu", 30.0, 900.0)):
        for variant, rate in (("eager", eager), ("vllm", vllm)):
            cell = make_cell(variant=variant, decode=rate, aggregate=rate, profile=profile)
            assert client.post("/api/benchmarks", json=cell, headers=AUTH).status_code == 201
    cards = {c["profile"]: c for c in client.get("/api/throughput").json()}
    assert set(cards) == {"cpu", "gpu"} and cards["cpu"]["concurrency"] == 8
    mult = {
        p: next(f for f in c["figures"] if f["variant"] == "vllm")["one_mult"]
        for p, c in cards.items()
    }
    assert mult == {"cpu": pytest.approx(4.0, abs=1e-12), "gpu": pytest.approx(30.0, abs=1e-12)}
    assert "8 concurrent tok/s" in client.get("/throughput").text


def test_throughput_flags_a_baseline_from_another_environment(client: TestClient) -> None:
    client.post("/api/benchmarks", json=make_cell(variant="eager", cpu="CPU A"), headers=AUTH)
    client.post("/api/benchmarks", json=make_cell(variant="vllm", cpu="CPU B"), headers=AUTH)
    html = client.get("/throughput").text
    assert "eager baseline from another environment" in html
    assert "These figures come from 2 environments" in html


def test_throughput_marks_cells_measured_under_load(client: TestClient) -> None:
    quiet = make_cell(variant="eager")
    quiet["environment"]["loadavg"] = [0.4, 0.3, 0.2]
    loaded = make_cell(variant="vllm")
    loaded["environment"]["loadavg_during"] = {"max_1m": 6.5, "min_1m": 2.0, "samples": 30}
    for stored in (quiet, loaded):
        assert client.post("/api/benchmarks", json=stored, headers=AUTH).status_code == 201
    figures = {f["variant"]: f for f in client.get("/api/throughput").json()[0]["figures"]}
    assert (
        figures["vllm"]["loaded"] and figures["vllm"]["load_label"] == "1-min load 6.5 on 2 cores"
    )
    assert (
        not figures["eager"]["loaded"]
        and figures["eager"]["load_label"] == "1-min load 0.4 on 2 cores"
    )
    assert "Not a headline: measured under load" in client.get("/throughput").text


def test_throughput_of_a_quiet_sweep_carries_no_load_warning(client: TestClient) -> None:
    for variant in ("eager", "vllm"):
        quiet = make_cell(variant=variant)
        quiet["environment"]["loadavg"] = [0.5, 0.4, 0.3]
        client.post("/api/benchmarks", json=quiet, headers=AUTH)
    assert "Not a headline" not in client.get("/throughput").text


def test_failed_workloads_show_their_status_not_a_number(client: TestClient) -> None:
    client.post("/api/benchmarks", json=make_cell(variant="eager"), headers=AUTH)
    client.post("/api/benchmarks", json=make_cell(variant="vllm", decode=None), headers=AUTH)
    figures = client.get("/api/throughput").json()[0]["figures"]
    vllm = next(f for f in figures if f["variant"] == "vllm")
    assert vllm["one_stream"] is None and vllm["one_status"] == "error" and vllm["one_mult"] is None


def test_validation_matrix_and_drill_down(client: TestClient) -> None:
    client.post("/api/validator", json=make_result(engine="nnsight"), headers=AUTH)
    warn = make_result(engine="transformer_lens", verdict="warn")
    client.post("/api/validator", json=warn, headers=AUTH)
    fail = make_result(hf_id="ie-synthetic/gpt2", engine="nnsight", verdict="fail")
    client.post("/api/validator", json=fail, headers=AUTH)
    html = client.get("/validation").text
    assert html.count('<td class="g pass">') == 1 and html.count('<td class="g warn">') == 1
    assert html.count('<td class="g fail">') == 1
    assert html.count('<td class="g not_run"') == 1  # gpt2 has no transformer_lens result
    params = {"model": "ie-synthetic/llama", "engine": "nnsight"}
    run = client.get("/fragments/run", params=params).text
    assert "layer 3" in run and "trunk" in run and "llama has no QK-norm" in run
    assert "0.999999" in run  # cosines keep their digits
    assert "model.layers[3].output" in run  # the peer's own hook name
    assert 'href="/?arch=llama&amp;point=resid_post"' in run  # drill-down reaches the point's card
    page = client.get("/validation/run", params=params)
    assert page.status_code == 200 and "validation matrix" in page.text
    assert client.get("/validation/run", params={"model": "x", "engine": "y"}).status_code == 404


def test_stored_strings_are_escaped_in_pages(client: TestClient) -> None:
    cell = make_cell(model_id=EVIL, cpu="<img src=x onerror=alert(1)>")
    assert client.post("/api/benchmarks", json=cell, headers=AUTH).status_code == 201
    result = make_result(hf_id=EVIL)
    result["points"][0]["reason"] = "<b>bold</b>"
    result["error"] = "<iframe src=evil>"
    assert client.post("/api/validator", json=result, headers=AUTH).status_code == 201
    pages = [
        client.get("/throughput").text,
        client.get("/validation").text,
        client.get("/validation/run", params={"model": EVIL, "engine": "nnsight"}).text,
        client.get("/", params={"arch": EVIL}).text,  # the 404 page echoes the bad input
    ]
    for html in pages:
        assert "<script>alert" not in html and "<img src=x" not in html
        assert "<b>bold" not in html and "<iframe" not in html
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in pages[0]
    assert "&lt;iframe src=evil&gt;" in pages[2]


def test_read_api_matches_the_registry(client: TestClient) -> None:
    points = client.get("/api/points").json()
    assert [p["name"] for p in points] == [p.name for p in POINTS]
    archs = {a["slug"]: a for a in client.get("/api/architectures").json()}
    assert set(archs) == {f.slug for f in FAMILIES}
    for f in FAMILIES:
        assert archs[f.slug]["points"] == [p.name for p in f.points]
        assert set(archs[f.slug]["missing"]) == {p.name for p in POINTS if not f.has_point(p)}
    assert client.get("/api/architectures/nope").status_code == 404
    assert client.get("/healthz").json()["schema_versions"] == [1, 2, 3, 4, 5, 6, 7, 8, 9]
