"""Declared sets, the buffer budget and load-time refusals: no engine needed."""

from __future__ import annotations

import pytest
from ie_core.errors import LayerOutOfRangeError, PointUnavailableError, UnsupportedOperationError
from ie_core.grammar import POINTS, Service, get_family
from ie_static.backend import load
from ie_static.declared import TAPPABLE, declared_sets, describe, unresolved
from ie_static.memory import MIN_ROWS, BufferBudgetError, plan_buffers
from ie_static.tables import TableShape, table_bytes
from ie_static.tap_info import TapInfo
from ie_vllm import vllm_serving

SHAPE = TableShape(slots=16, ops=4, masks=4, positions=2048)


def test_auto_reads_every_resid_post_and_writes_the_same() -> None:
    d = declared_sets("auto", "auto", 3)
    assert d.reads == ("resid_post.0", "resid_post.1", "resid_post.2")
    assert d.writes == d.reads


def test_explicit_lists_bare_names_and_narrowed_writes() -> None:
    d = declared_sets(["resid_pre", "attn_out.1"], ["attn_out.1"], 2)
    assert d.reads == ("resid_pre.0", "resid_pre.1", "attn_out.1")
    assert d.writes == ("attn_out.1",)
    assert d.named_reads == {"attn_out.1"}  # bare names expand and keep what the model has
    assert declared_sets("auto", [], 2).writes == ()


def test_tappable_set_comes_from_the_registry() -> None:
    hooked = {
        p.name
        for p in POINTS
        if vllm_serving(p).service is Service.HOOK and p.requires != "multi_stream"
    }
    assert hooked <= set(TAPPABLE)
    assert {"q", "k", "q_rot", "k_rot"} <= set(TAPPABLE)  # the qkv output, attention's arguments
    assert {"attn_scores", "attn_probs"} <= set(TAPPABLE)  # recomputed from tapped q and k
    assert not {"mlp_pre", "lm_head", "expert_indices", "resid_streams"} & set(TAPPABLE)


def test_all_follows_the_family_and_auto_writes_skip_capture_points() -> None:
    d = declared_sets("all", "auto", 2, get_family("mixtral"))
    names = {a.split(".")[0] for a in d.reads}
    assert {"router_logits", "z", "value", "attn_probs", "embeddings", "final_norm"} <= names
    assert "q_norm_in" not in names  # Mixtral has no QK-norm
    assert "router_logits.1" in d.reads and "router_logits.1" not in d.writes
    assert "attn_probs.0" not in d.writes and "z.1" in d.writes
    assert "mlp_act" not in names  # the family registry: sparse-only MLPs have no dense mlp_act
    assert not d.named_reads
    info = TapInfo.from_wire({"reads": ["z.1"], "writes": [], "refused": {"z.1": "why"}})
    named = declared_sets(["z.1", "embeddings"], ["z.1"], 2)
    assert unresolved(named, info) == {"embeddings": "not tapped", "z.1": "why"}


@pytest.mark.parametrize(
    ("points", "writes", "error", "match"),
    [
        (["mlp_pre.0"], "auto", PointUnavailableError, "fuses gate and up"),
        (["lm_head"], "auto", PointUnavailableError, "does not serve lm_head"),
        (["router_logits.0"], ["router_logits.0"], PointUnavailableError, "capture-only"),
        (["resid_post.9"], "auto", LayerOutOfRangeError, "out of range"),
        (["resid_post.0"], ["resid_post.1"], ValueError, "not among static_points"),
        ("resid_post", "auto", ValueError, "'auto', 'all' or a list"),
        ([], "auto", ValueError, "empty"),
        (["path.model.norm"], "auto", PointUnavailableError, "raw module path"),
    ],
)
def test_bad_declarations_are_refused(points, writes, error, match) -> None:
    with pytest.raises(error, match=match):
        declared_sets(points, writes, 4)


def test_describe_summarizes_ranges() -> None:
    assert describe([f"resid_post.{i}" for i in range(30)]) == "resid_post at layers 0..29"
    assert describe(["attn_out.1", "attn_out.5"]) == "attn_out at layers 1, 5"
    assert describe(["embeddings", "z.0"]) == "embeddings; z at layers 0"


def test_budget_fits_rows_or_refuses_with_numbers() -> None:
    per_row = 30 * 576 * 4
    tables = 30 * table_bytes(SHAPE, 576) + 16 * 4 * 2048
    plan = plan_buffers(
        read_widths=[576] * 30, write_widths=[576] * 30, dtype_bytes=4, shape=SHAPE,
        budget_bytes=2**30, requested_rows=None, default_rows=2048,
    )  # fmt: skip
    assert plan.rows == 2048 and plan.read_bytes == 2048 * per_row
    assert plan.table_bytes == tables
    small = plan_buffers(
        read_widths=[576] * 30, write_widths=[576] * 30, dtype_bytes=4, shape=SHAPE,
        budget_bytes=tables + 500 * per_row, requested_rows=None, default_rows=2048,
    )  # fmt: skip
    assert small.rows == 500  # the default shrinks to what fits
    with pytest.raises(BufferBudgetError, match=r"lower max_num_batched_tokens to 500"):
        plan_buffers(
            read_widths=[576] * 30, write_widths=[576] * 30, dtype_bytes=4, shape=SHAPE,
            budget_bytes=tables + 500 * per_row, requested_rows=1024, default_rows=2048,
        )  # fmt: skip
    with pytest.raises(BufferBudgetError, match=f"fewer than the {MIN_ROWS}"):
        plan_buffers(
            read_widths=[576] * 30, write_widths=[576] * 30, dtype_bytes=4, shape=SHAPE,
            budget_bytes=tables + 100 * per_row, requested_rows=None, default_rows=2048,
        )  # fmt: skip


def test_enforce_eager_is_refused_before_any_engine_starts() -> None:
    with pytest.raises(UnsupportedOperationError, match="backend='vllm'"):
        load("ie-synthetic/llama", enforce_eager=True)


def test_site_plan_shares_sites_and_maps_attention_maps_to_q_and_k() -> None:
    from ie_static.sites import plan_sites
    from ie_vllm import PointTable, SiteDef
    from torch import nn

    def site(name: str) -> SiteDef:
        return SiteDef(name, nn.Identity(), "post", lambda a, k, o: o, None, 4)

    table = PointTable(n_layers=1, d_model=4)
    for name in ("attn_out.0", "attn_q.0", "attn_k.0", "resid_mid.0"):
        table.sites[name] = site(name)
    table.addresses = {"attn_out.0": "attn_out.0", "attn_out_post.0": "attn_out.0",
                       "resid_mid.0": "resid_mid.0"}  # fmt: skip
    table.widths = {a: 4 for a in (*table.addresses, "attn_probs.0")}
    table.writable = {"attn_out.0", "attn_out_post.0"}
    table.refused = {"mlp_act.0": "fused MoE"}
    reads = ["attn_out.0", "attn_out_post.0", "attn_probs.0", "resid_mid.0", "mlp_act.0"]
    plan = plan_sites(table, reads, ["attn_out_post.0", "resid_mid.0"], "X")
    assert plan.reads["attn_out_post.0"] == ("attn_out.0",)  # one site, one buffer
    assert plan.reads["attn_probs.0"] == ("attn_q.0", "attn_k.0")
    assert plan.read_site_names() == ("attn_out.0", "attn_q.0", "attn_k.0", "resid_mid.0")
    assert plan.writes == {"attn_out_post.0": "attn_out.0"}
    assert plan.refused["mlp_act.0"] == "fused MoE"
    assert "read only" in plan.refused["resid_mid.0"]


def test_a_site_that_needs_another_modules_output_is_refused_with_its_reason() -> None:
    """Granite-4.0-H's mlp_out is read at the shared MLP plus a companion hook on the routed one;
    a static tap sits in one module's forward, so both the read and the write are refused."""
    from ie_static.sites import plan_sites
    from ie_vllm import PointTable, SiteDef
    from torch import nn

    companion = ((nn.Identity(), lambda m, a, o: None),)
    branch = SiteDef(
        "mlp_out.0", nn.Identity(), "post", lambda a, k, o: o, None, 4, companions=companion
    )
    plain = SiteDef("resid_post.0", nn.Identity(), "post", lambda a, k, o: o, None, 4)
    table = PointTable(n_layers=1, d_model=4, sites={"mlp_out.0": branch, "resid_post.0": plain})
    table.addresses = {"mlp_out.0": "mlp_out.0", "resid_post.0": "resid_post.0"}
    table.widths = dict.fromkeys(table.addresses, 4)
    table.writable = set(table.addresses)
    plan = plan_sites(table, ["mlp_out.0", "resid_post.0"], ["mlp_out.0", "resid_post.0"], "X")
    assert "backend='vllm'" in plan.refused["mlp_out.0"]
    assert plan.reads == {"resid_post.0": ("resid_post.0",)}
    assert plan.writes == {"resid_post.0": "resid_post.0"}


def test_a_model_with_no_map_is_an_unsupported_model_with_the_one_reason() -> None:
    """Every declared point refused for one reason (ie-vllm has no map of the architecture, as
    on Granite-4.0-H): the load is an UnsupportedModelError quoting it, so the capability sweep
    records the hooked backend's per-point reason; mixed reasons stay a PointUnavailableError."""
    from ie_core.errors import UnsupportedModelError
    from ie_static.declared import refuse_unresolved
    from ie_static.tap_info import TapInfo

    why = "ie-vllm has no map of XForCausalLM's modules on vLLM; use backend='eager' for this model"
    d = declared_sets("all", "auto", 2, get_family("granitemoehybrid"))
    refused = {a: why for a in d.reads}
    with pytest.raises(UnsupportedModelError) as caught:
        refuse_unresolved(d, TapInfo((), (), refused), "XForCausalLM")
    assert str(caught.value) == why
    refused["z.1"] = "another reason"
    with pytest.raises(PointUnavailableError, match="none of the declared static_points"):
        refuse_unresolved(d, TapInfo((), (), refused), "XForCausalLM")


def test_capture_attention_reads_the_declared_maps_or_names_the_reload() -> None:
    from types import SimpleNamespace

    from ie_static.backend import StaticModel

    declared = SimpleNamespace(reads=("resid_post.0", "attn_probs.2", "q_rot.2", "attn_probs.5"))
    assert list(StaticModel.attention_layers(declared)) == [2, 5]  # type: ignore[arg-type]
    with pytest.raises(PointUnavailableError, match=r"declared no attn_probs sites.*static_points"):
        StaticModel.attention_layers(SimpleNamespace(reads=("q_rot.2",)))  # type: ignore[arg-type]
