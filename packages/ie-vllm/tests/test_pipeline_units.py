"""The pipeline pieces without an engine: which sites a stage keeps, and the host's merge of the
stages' `ie_setup` and `ie_stats` answers (the engine test is test_vllm_pipeline_parallel.py)."""

from __future__ import annotations

import pytest
from ie_core.model_info import ModelInfo
from ie_vllm.pipeline import merge_infos, merge_stats
from ie_vllm.worker.access import post_out
from ie_vllm.worker.point_table import PointTable, SiteDef
from ie_vllm.worker.stage import Stage, keep_stage, layer_range
from torch import nn

pytest.importorskip("vllm")


def _table(norm: nn.Module, embed: nn.Module) -> PointTable:
    from vllm.model_executor.models.utils import PPMissingLayer

    table = PointTable(n_layers=4, d_model=8)
    read, write = post_out()
    modules = {"embeddings": embed, "final_norm": norm, "resid_post.2": nn.Identity()}
    modules["resid_post.3"] = PPMissingLayer()  # a placeholder vLLM left in a layer slot
    for name, module in modules.items():
        table.sites[name] = SiteDef(name, module, "post", read, write, 8)
        table.addresses[name] = name
        table.widths[name] = 8
        table.writable.add(name)
    return table


def test_a_stage_keeps_only_what_it_runs() -> None:
    from vllm.model_executor.models.utils import PPMissingLayer

    last = _table(norm=nn.LayerNorm(8), embed=nn.Embedding(4, 8))  # tied: weights, never run
    keep_stage(last, Stage(1, 2))
    assert set(last.widths) == set(last.addresses) == {"final_norm", "resid_post.2"}
    assert last.writable == {"final_norm", "resid_post.2"}
    assert layer_range(last) == (2, 3)
    first = _table(norm=PPMissingLayer(), embed=nn.Embedding(4, 8))
    keep_stage(first, Stage(0, 2))
    assert set(first.sites) == {"embeddings", "resid_post.2"}
    alone = _table(norm=nn.LayerNorm(8), embed=nn.Embedding(4, 8))
    keep_stage(alone, Stage())  # one stage keeps every real module
    assert set(alone.sites) == {"embeddings", "final_norm", "resid_post.2"}


def test_merge_takes_each_address_from_its_stage_and_drops_served_refusals() -> None:
    stage0 = {
        "n_layers": 4, "d_model": 8, "widths": {"embeddings": 8, "resid_post.0": 8},
        "writable": ["resid_post.0"], "attn_heads": {0: 2},
        "refused": {"final_norm": "no module", "q_norm_in": "qk norm", "attn_probs.1": "x"},
        "stage": {"rank": 0, "layers": (0, 2)},
    }  # fmt: skip
    stage1 = {
        "n_layers": 4, "d_model": 8, "widths": {"final_norm": 8, "resid_post.2": 8},
        "writable": ["final_norm", "resid_post.2"], "attn_heads": {2: 2},
        "refused": {"q_norm_in": "qk norm (stage 1)"}, "stage": {"rank": 1, "layers": (2, 4)},
    }  # fmt: skip
    merged = merge_infos([stage0, stage1])
    assert set(merged.widths) == {"embeddings", "resid_post.0", "final_norm", "resid_post.2"}
    assert merged.writable == ("final_norm", "resid_post.0", "resid_post.2")
    assert merged.refused == {"q_norm_in": "qk norm", "attn_probs.1": "x"}
    assert merged.attn_heads == {0: 2, 2: 2}
    assert [s.layers for s in merged.stages] == [(0, 2), (2, 4)]
    assert merge_infos([stage0]) == ModelInfo.from_wire(stage0)  # one rank: its answer as it is
    # TP=2 x PP=2: ranks come stage by stage, each stage's two tensor ranks report it each.
    four = merge_infos([stage0, stage0, stage1, stage1])
    assert [(s.rank, s.layers) for s in four.stages] == [(0, (0, 2)), (1, (2, 4))]
    assert four.widths == merged.widths


def test_stats_merge_is_what_any_rank_still_holds() -> None:
    idle = {"registered": 0, "keys": [], "hooks": {}, "forwards": 3}
    busy = {"registered": 1, "keys": ["r7"], "hooks": {"resid_post.2": 1}, "forwards": 3}
    assert merge_stats([idle, busy]) == {
        "registered": 1,
        "keys": ["r7"],
        "hooks": {"resid_post.2": 1},
        "forwards": 3,
    }
    assert merge_stats([idle, idle])["registered"] == 0
    # Tensor-parallel ranks repeat a key: named once; a rank without keys (older worker) adds none.
    assert merge_stats([busy, busy, {"registered": 0}])["keys"] == ["r7"]
