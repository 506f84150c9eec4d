"""`attribute_many(model, prompts, transcoders)`: attribution graphs of several prompts from one
batched capture. The forward goes through `capture_ragged`: prompts of one length share one
`capture` call, and the length groups run concurrently, so vLLM schedules them as one batch; a
prompt's rows are exactly what a capture of it alone returns (padding never enters a forward).
The backward passes then run prompt by prompt: each prompt has its own patterns and norm scales,
and a batch of one prompt's rows already fills the matrix products."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ie_core.circuits.attribution import attribute_state, check_knobs, state_of
from ie_core.circuits.errors import AttributionInputError
from ie_core.circuits.graph import Graph
from ie_core.circuits.prompt_state import addresses, check_prompt
from ie_core.circuits.sources import load_transcoders
from ie_core.circuits.transcoders import TranscoderSet
from ie_core.circuits.weights import ReplacementWeights, weights_for
from ie_core.experiments.ragged import capture_ragged
from ie_core.sync import unwrap


def attribute_many(
    model: Any,
    prompts: Sequence[str | Sequence[int]],
    transcoders: TranscoderSet | str | Path | Sequence[Any],
    *,
    max_feature_nodes: int | None = None,
    max_n_logits: int = 10,
    desired_logit_prob: float = 0.95,
    batch_size: int = 256,
    zero_first_position: bool = True,
    weights: ReplacementWeights | str | Path | None = None,
    device: torch.device | str | None = None,
) -> list[Graph]:
    """The graph of each prompt, in order, each the one `attribute(model, prompt, ...)` gives,
    with the forwards of all prompts captured together (see the module docstring). The knobs
    are `attribute`'s."""

    check_knobs(max_feature_nodes, max_n_logits, desired_logit_prob, batch_size)
    if isinstance(prompts, str) or not isinstance(prompts, Sequence) or not prompts:
        raise AttributionInputError("attribute_many takes a non-empty list of prompts")
    inner = unwrap(model)
    ts = load_transcoders(transcoders)
    ts.check(inner.n_layers, inner.d_model)  # widths and layers before any forward
    w = weights_for(inner, weights)
    rows = [inner.to_tokens(p) if isinstance(p, str) else [int(t) for t in p] for p in prompts]
    for tokens in rows:  # every prompt checked before the one forward
        check_prompt(tokens, getattr(inner, "max_positions", None))
    points = addresses(inner.n_layers)
    cache = capture_ragged(model, rows, points)
    per_prompt = {a: cache.unpadded(a) for a in points}
    knobs = (max_n_logits, desired_logit_prob, zero_first_position)
    graphs = []
    for i, (prompt, tokens) in enumerate(zip(prompts, rows, strict=True)):
        one = {a: per_prompt[a][i][None] for a in points}  # this prompt as a batch of one
        st = state_of(tokens, one, ts, w, inner.to_string, *knobs)
        text = prompt if isinstance(prompt, str) else inner.to_string(list(st.tokens))
        strings = tuple(inner.to_string([t]) for t in st.tokens)
        g = attribute_state(
            st, max_feature_nodes=max_feature_nodes, batch_size=batch_size, prompt=text,
            token_strings=strings, scan=ts.scan, device=device,
        )  # fmt: skip
        graphs.append(g)
    return graphs


__all__ = ["attribute_many"]
