"""Checks of prompts given as embeddings and of patchscope reads, vLLM against eager, on the
engines the test modules already hold (SmolLM2's, the synthetic families'): greedy tokens equal,
captured rows at the injected position within 1e-4 of eager's, and a control with the vector one
position off. A module of its own so both test files call one body."""

from __future__ import annotations

from typing import Any

import torch
from ie_core import SamplingParams
from ie_core.embedded import EmbeddedPrompt
from ie_core.experiments.patchscopes import IDENTITY, read_patchscopes
from ie_core.runner import run

PROMPT = "The capital of France is Paris, and the capital of Japan is"
GREEDY = SamplingParams(max_new_tokens=6, stop_at_eos=False)


def vector(ref: Any, ids: list[int]) -> torch.Tensor:
    """Mostly " Germany"'s input embedding, a little of the token it replaces: no token's row."""
    other = ref.to_tokens(" Germany", prepend_bos=False)[0]
    with torch.no_grad():
        rows = ref.hf_model.get_input_embeddings()(torch.tensor([[other, ids[-2]]]))[0]
    return 0.9 * rows[0] + 0.1 * rows[1]


def scaled(got: torch.Tensor, want: torch.Tensor) -> float:
    return (got - want).abs().max().item() / max(1.0, want.abs().max().item())


def embedded_generation_and_rows_match(model: Any, ref: Any, tol: float) -> None:
    ids = ref.to_tokens(PROMPT)
    at = len(ids) - 2
    prompt = EmbeddedPrompt(ids, {at: vector(ref, ids)})
    want = run(ref.generate(prompt, GREEDY)).token_ids
    assert run(model.generate(prompt, GREEDY)).token_ids == want
    layers = sorted({0, model.n_layers // 2, model.n_layers - 2})
    addresses = ["embeddings", *(f"resid_post.{x}" for x in layers)]
    got = run(model.capture(prompt, addresses))
    ref_rows = run(ref.capture(prompt, addresses))
    for a in addresses:
        assert scaled(got[a][0, at], ref_rows[a][0, at]) <= tol, a
        assert scaled(got[a][0, -1], ref_rows[a][0, -1]) <= tol, a
    # Generation with a capture over prompt + generated tokens reads the same injected row.
    both = run(model.capture_generation(prompt, addresses[-1:], GREEDY))
    assert both.generation.token_ids == want
    assert scaled(both.cache[addresses[-1]][0, at], ref_rows[addresses[-1]][0, at]) <= tol
    # Controls: one position earlier, and no vector, each change what vLLM reads and writes.
    off = EmbeddedPrompt(ids, {at - 1: vector(ref, ids)})
    assert run(model.generate(off, GREEDY)).token_ids == run(ref.generate(off, GREEDY)).token_ids
    moved = run(model.capture(off, addresses[-1:]))[addresses[-1]]
    assert scaled(moved[0, -1], ref_rows[addresses[-1]][0, -1]) > 100 * tol


def all_layer_reads_in_one_batch_match_eager(model: Any, ref: Any) -> None:
    """Every layer's patchscope read sent at once to vLLM equals eager's reads one by one."""
    source = ref.to_tokens(PROMPT)
    sampling = SamplingParams(max_new_tokens=4, stop_at_eos=False)
    got = run(read_patchscopes(model, source, -1, None, IDENTITY, sampling=sampling))
    for read in got:
        (want,) = run(read_patchscopes(ref, source, -1, [read.layer], IDENTITY, sampling=sampling))
        assert read.token_ids == want.token_ids, read.layer
    assert len({r.token_ids for r in got}) > 1  # the reads differ by layer: each read its state
