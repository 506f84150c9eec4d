"""The hand-written transposed backward (ie_core.circuits.backward.TransposedRows) against an
independent computation, autograd through the replacement's own forward (AutogradRows), on
per-layer sets (llama with grouped-query heads, gpt2's LayerNorms) and a cross-layer set; and
`attribute_many` against `attribute` prompt by prompt. fp32 on the CPU, 1e-5 relative. Negative
controls: rows of other targets, a non-causal pattern with the causal cut forced, swapped graphs.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from eager_support import PROMPT, synthetic_model
from ie_core.circuits import (
    TranscoderSet,
    attribute,
    attribute_many,
    prepare,
    random_transcoder,
    write_layer_file,
)
from ie_core.circuits.backward import AutogradRows, TransposedRows
from ie_core.circuits.clt import random_clt
from ie_core.circuits.graph import Graph
from ie_core.circuits.prompt_state import PromptState

TOL = 1e-5
CASES = (("llama", "per-layer"), ("gpt2", "per-layer"), ("llama", "clt"))


def _set(slug: str, kind: str) -> TranscoderSet:
    m = synthetic_model(slug)
    if kind == "clt":
        return random_clt(m.d_model, 24, m.n_layers, seed=3)
    act = "jumprelu" if slug == "gpt2" else "relu"
    layers = [
        random_transcoder(m.d_model, 32, i, seed=20 + i, activation=act) for i in range(m.n_layers)
    ]
    return TranscoderSet(layers)


def _gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def _ids(st: PromptState, n: int = 96) -> torch.Tensor:
    """Random feature targets and every logit target, in no particular order."""
    n_feat, g = st.active_features.shape[0], torch.Generator().manual_seed(0)
    ids = torch.cat(
        [torch.randperm(n_feat, generator=g)[:n], n_feat + torch.arange(len(st.logit_targets))]
    )
    return ids[torch.randperm(len(ids), generator=g)]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: "-".join(c))
def state(request: pytest.FixtureRequest) -> PromptState:
    slug, kind = request.param
    return prepare(synthetic_model(slug), PROMPT, _set(slug, kind), max_n_logits=4)


def test_transposed_rows_equal_autograd_rows(state: PromptState) -> None:
    ids = _ids(state)
    fast, ref = TransposedRows(state), AutogradRows(state)
    assert fast.causal
    assert _gap(fast.rows(ids), ref.rows(ids)) <= TOL
    # Negative control: the rows of other targets are not these.
    assert _gap(fast.rows(ids.roll(1)), ref.rows(ids)) > 1e-2


def _non_causal(st: PromptState) -> PromptState:
    """`st` with layer 0's pattern letting every query read the last key too (rows renormalised):
    still a fixed linear map, but an earlier target now reaches later positions."""
    p = st.frozen.patterns[0].clone()
    p[:, :, -1] += 0.5
    p = p / p.sum(-1, keepdim=True)
    frozen = dataclasses.replace(st.frozen, patterns=(p, *st.frozen.patterns[1:]))
    return dataclasses.replace(st, frozen=frozen)


def test_a_non_causal_pattern_disables_the_position_cut() -> None:
    st = _non_causal(prepare(synthetic_model("llama"), PROMPT, _set("llama", "per-layer")))
    early = (st.active_features[:, 1] < st.n_pos // 2).nonzero()[:, 0][:48]
    fast, ref = TransposedRows(st), AutogradRows(st)
    assert not fast.causal
    assert _gap(fast.rows(early), ref.rows(early)) <= TOL
    fast.causal = True  # Negative control: the cut where a later position does matter.
    assert _gap(fast.rows(early), ref.rows(early)) > 1e-3


def _same_graph(got: Graph, want: Graph) -> bool:
    same_nodes = (
        torch.equal(got.active_features, want.active_features)
        and torch.equal(got.selected_features, want.selected_features)
        and [t.token_id for t in got.logit_targets] == [t.token_id for t in want.logit_targets]
        and got.adjacency.shape == want.adjacency.shape
    )
    return same_nodes and _gap(got.adjacency, want.adjacency) <= TOL


def test_attribute_many_equals_attribute_one_by_one() -> None:
    m = synthetic_model("llama")
    ts = _set("llama", "per-layer")
    # Two prompts of one length (one capture) and one of another (a second, concurrent one).
    ids = m.to_tokens("The capital of France is")
    prompts: list[str | list[int]] = [ids, [*ids[:-1], ids[1]], PROMPT]
    got = attribute_many(m, prompts, ts, max_n_logits=3)
    want = [attribute(m, p, ts, max_n_logits=3) for p in prompts]
    assert [g.tokens for g in got] == [w.tokens for w in want]
    assert len(got[0].tokens) == len(got[1].tokens) != len(got[2].tokens)
    assert all(_same_graph(g, w) for g, w in zip(got, want, strict=True))
    assert not _same_graph(got[0], want[1]), "negative control: another prompt's graph differs"
    capped = attribute_many(m, prompts[:1], ts, max_n_logits=3, max_feature_nodes=10)[0]
    assert _same_graph(capped, attribute(m, prompts[0], ts, max_n_logits=3, max_feature_nodes=10))


def test_ie_trace_with_several_prompts_writes_one_graph_each(tmp_path: Path) -> None:
    from ie_core.circuits.command import trace_command

    m = synthetic_model("llama")
    folder = tmp_path / "tc"
    folder.mkdir()
    for layer, tc in enumerate(_set("llama", "per-layer").transcoders):
        write_layer_file(tc, folder / f"layer_{layer}.safetensors")
    prompts = ["Paris is", "The capital of Japan is"]
    argv = ["ie-synthetic/llama", "--backend", "eager", "--transcoders", str(folder)]
    argv += ["--prompt", prompts[0], "--prompt", prompts[1], "--out", str(tmp_path / "graphs")]
    assert trace_command([*argv, "--raw", str(tmp_path / "raw"), "--heads", "2"]) == 0
    for i, prompt in enumerate(prompts):
        data = json.loads((tmp_path / "graphs" / f"graph_{i}.json").read_text())
        assert data["metadata"]["prompt"] == prompt and data["metadata"]["slug"] == f"graphs-{i}"
        assert "head_flows" in data  # each prompt's own forward state
        raw = torch.load(tmp_path / "raw" / f"graph_{i}.pt", weights_only=False)
        want = attribute(m, prompt, folder)
        assert _gap(raw["adjacency"], want.adjacency) <= TOL
