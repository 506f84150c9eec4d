"""`attribute(model, prompt, transcoders)` and `attribute_many(model, prompts, transcoders)`: the
forward half captures every prompt together on the model's own backend (`capture_ragged`: prompts
of one length share a `capture` call, the length groups run concurrently, so vLLM batches them;
a prompt's rows are what a capture of it alone returns), then the backward half computes each
prompt's graph rows through its frozen linear replacement (`backward.py`), prompt by prompt.

A row is the gradient of one target's input (a feature's pre-activation, a logit target's
demeaned logit) with respect to every source coefficient. Features are taken in order of their
influence on the logits when `max_feature_nodes` caps them (circuit-tracer's scheme).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypedDict, Unpack

import torch

from ie_core.circuits.backward import AutogradRows, TransposedRows, biases, row_engine, row_width
from ie_core.circuits.errors import AttributionInputError
from ie_core.circuits.graph import Graph
from ie_core.circuits.influence import chunk_rows, partial_influence
from ie_core.circuits.prompt_state import (
    PromptState,
    addresses,
    build_state,
    check_prompt,
    logit_targets,
    moved,
    unembed,
)
from ie_core.circuits.sources import load_transcoders
from ie_core.circuits.transcoders import TranscoderSet
from ie_core.circuits.weights import ReplacementWeights, weights_for
from ie_core.experiments.ragged import capture_ragged
from ie_core.sync import unwrap


def check_knobs(
    max_feature_nodes: int | None, max_n_logits: int, prob: float, batch: int,
    chunk: int | None = None,
) -> None:  # fmt: skip
    if max_feature_nodes is not None and max_feature_nodes < 0:
        raise AttributionInputError(f"max_feature_nodes is {max_feature_nodes}; give >= 0 or None")
    if max_n_logits < 1:
        raise AttributionInputError(f"max_n_logits is {max_n_logits}; give at least 1")
    if not 0.0 < prob <= 1.0:
        raise AttributionInputError(f"desired_logit_prob is {prob}; give a value in (0, 1]")
    if batch < 1:
        raise AttributionInputError(f"batch_size is {batch}; give at least 1")
    if chunk is not None and chunk < 1:
        raise AttributionInputError(f"chunk is {chunk}; give at least 1 row, or None")


class ForwardKnobs(TypedDict, total=False):
    """`prepare`'s keywords: `prepare_many`'s."""

    max_n_logits: int
    desired_logit_prob: float
    zero_first_position: bool
    weights: ReplacementWeights | str | Path | None


class GraphKnobs(ForwardKnobs, total=False):
    """`attribute`'s keywords: `attribute_many`'s."""

    max_feature_nodes: int | None
    batch_size: int
    device: torch.device | str | None
    chunk: int | None


def prepare_many(
    model: Any,
    prompts: Sequence[str | Sequence[int]],
    transcoders: TranscoderSet | str | Path | Sequence[Any],
    *,
    max_n_logits: int = 10,
    desired_logit_prob: float = 0.95,
    zero_first_position: bool = True,
    weights: ReplacementWeights | str | Path | None = None,
) -> list[PromptState]:
    """The forward half of each prompt, in order: every check first, then one batched capture,
    then each prompt's frozen constants."""
    check_knobs(None, max_n_logits, desired_logit_prob, 1)
    if isinstance(prompts, str) or not isinstance(prompts, Sequence) or not prompts:
        raise AttributionInputError("give a non-empty list of prompts")
    inner = unwrap(model)
    ts = load_transcoders(transcoders)
    ts.check(inner.n_layers, inner.d_model)  # widths and layers before any forward
    w = weights_for(inner, weights)
    rows = [inner.to_tokens(p) if isinstance(p, str) else [int(t) for t in p] for p in prompts]
    for tokens in rows:
        check_prompt(tokens, getattr(inner, "max_positions", None))
    points = addresses(inner.n_layers)
    cache = capture_ragged(model, rows, points)
    per_prompt = {a: cache.unpadded(a) for a in points}
    knobs = (max_n_logits, desired_logit_prob, zero_first_position)
    return [
        state_of(tokens, {a: per_prompt[a][i][None] for a in points}, ts, w, inner.to_string,
                 *knobs)
        for i, tokens in enumerate(rows)
    ]  # fmt: skip


def prepare(
    model: Any,
    prompt: str | Sequence[int],
    transcoders: TranscoderSet | str | Path | Sequence[Any],
    **knobs: Unpack[ForwardKnobs],
) -> PromptState:
    """The forward half of one prompt (`prepare_many`'s keywords): keep it to attribute again,
    or for `head_flows` and `attention_shares`."""
    return prepare_many(model, [prompt], transcoders, **knobs)[0]


def state_of(
    tokens: Sequence[int], cache: Any, ts: TranscoderSet, w: ReplacementWeights, to_string: Any,
    max_n_logits: int, desired_logit_prob: float, zero_first: bool,
) -> PromptState:  # fmt: skip
    """One prompt's state from its capture of `addresses()` (a batch of one)."""
    logits = unembed(w, cache["final_norm"][0, -1].detach().float().cpu())
    targets = logit_targets(logits, max_n_logits, desired_logit_prob, to_string)
    return build_state(tokens, cache, ts, w, targets, zero_first=zero_first)


def _select(
    rows: TransposedRows | AutogradRows, st: PromptState, logit_rows: torch.Tensor, limit: int,
    batch: int, chunk: int | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """Feature rows up to `limit`, most influential first, written once into one table (the
    logit rows first, then features as computed): (selected ids ascending, the table, each
    selected id's row in it). Ranking reads the table in place (`partial_influence`'s chunks)."""
    n_feat, n_logit = st.active_features.shape[0], len(st.logit_targets)
    table = torch.empty(n_logit + limit, logit_rows.shape[1])
    table[:n_logit] = logit_rows
    nodes = torch.full((n_logit + limit,), -1, dtype=torch.long)
    weights = torch.zeros(n_logit + limit)
    weights[:n_logit] = torch.tensor([t.probability for t in st.logit_targets])
    done = torch.zeros(n_feat, dtype=torch.bool)
    filled = n_logit
    while filled < n_logit + limit:
        score = partial_influence(table[:filled], nodes[:filled], weights[:filled], chunk)
        order = torch.argsort(score[:n_feat], descending=True)
        pending = order[~done[order]][: min(4 * batch, n_logit + limit - filled)]  # re-rank
        for start in range(0, len(pending), batch):  # every 4 batches
            ids = pending[start : start + batch]
            rows.rows(ids, out=table[filled : filled + len(ids)])
            nodes[filled : filled + len(ids)] = ids
            done[ids] = True
            filled += len(ids)
    selected, slots = torch.sort(nodes[n_logit:])
    return selected, table, slots + n_logit


def _fill_selected(
    adjacency: torch.Tensor, table: torch.Tensor, slots: torch.Tensor, cols: torch.Tensor,
    chunk: int | None,
) -> None:  # fmt: skip
    """The selected features' rows, at the kept columns, into the adjacency's first rows, a
    chunk of rows at a time (no copy of the table)."""
    step = chunk_rows(table.shape[1]) if chunk is None else chunk
    for start in range(0, len(slots), step):
        part = slots[start : start + step]
        adjacency[start : start + len(part), : len(cols)] = table[part[:, None], cols[None]]


def _all_rows(
    rows: TransposedRows | AutogradRows, st: PromptState, batch: int, out: torch.Tensor
) -> None:
    """Every feature's row into `out`'s first rows, in batches of features at one position where
    possible: under causal patterns a batch's pass then stops at that position."""
    af = st.active_features.cpu()
    order = torch.argsort(af[:, 1] * (st.n_layers + 1) + af[:, 0], stable=True)
    width = row_width(st)
    for start in range(0, len(order), batch):
        ids = order[start : start + batch]
        out[ids, :width] = rows.rows(ids)


def attribute_state(
    st: PromptState, *, max_feature_nodes: int | None = None, batch_size: int = 256,
    prompt: str = "", token_strings: tuple[str, ...] = (), scan: str = "",
    device: torch.device | str | None = None, chunk: int | None = None,
) -> Graph:  # fmt: skip
    """The backward half: the graph's rows through the frozen replacement of `st`, computed on
    `device` (default: the CPU); the graph's tensors are on the CPU. Under a feature cap the
    kept rows are ranked and copied `chunk` rows at a time (default: about 64 MiB a chunk)."""
    check_knobs(max_feature_nodes, 1, 1.0, batch_size, chunk)
    on = st if device is None else moved(st, device)
    rows = row_engine(on)
    n_feat, n_logit = st.active_features.shape[0], len(st.logit_targets)
    limit = n_feat if max_feature_nodes is None else min(max_feature_nodes, n_feat)
    logit_rows = rows.rows(torch.arange(n_feat, n_feat + n_logit))
    # Columns: the selected features, then every error and token node (the row layout's tail).
    if limit == n_feat:  # every feature: rows go straight into the adjacency, no copies
        selected, cols = torch.arange(n_feat), torch.arange(row_width(st))
        adjacency = torch.zeros(len(cols) + n_logit, len(cols) + n_logit)
        _all_rows(rows, st, batch_size, adjacency)
    else:
        selected, table, slots = _select(rows, st, logit_rows, limit, batch_size, chunk)
        cols = torch.cat([selected, torch.arange(n_feat, row_width(st))])
        adjacency = torch.zeros(len(cols) + n_logit, len(cols) + n_logit)
        _fill_selected(adjacency, table, slots, cols, chunk)
        del table  # the row set goes before the graph's other buffers
    n_sel, n_cols, n_nodes = len(selected), len(cols), len(cols) + n_logit
    adjacency[n_cols:, :n_cols] = logit_rows[:, cols]
    inputs, bias = torch.zeros(n_nodes), torch.zeros(n_nodes)
    target_ids = torch.cat([selected, torch.arange(n_feat, n_feat + n_logit)])
    where = torch.cat([torch.arange(n_sel), torch.arange(n_cols, n_nodes)])
    inputs[where] = torch.cat([st.pre_activations[selected], st.demeaned_logits])
    bias[where] = biases(on)[target_ids]
    return Graph(
        prompt=prompt,
        tokens=st.tokens,
        token_strings=token_strings,
        n_layers=st.n_layers,
        active_features=st.active_features,
        activation_values=st.activation_values,
        selected_features=selected,
        logit_targets=st.logit_targets,
        adjacency=adjacency,
        node_inputs=inputs,
        node_bias=bias,
        scan=scan,
    )


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
    chunk: int | None = None,
) -> list[Graph]:
    """The attribution graph of each prompt's next-token prediction through `transcoders`, in
    order, from one batched forward on `model`'s backend (see the module docstring).

    The backward passes run on the CPU through the frozen linear replacement (patterns and norm
    scales at each prompt's values). `max_feature_nodes` caps feature nodes (most influential
    first); logit targets are the fewest top tokens reaching `desired_logit_prob` (at most
    `max_n_logits`); `zero_first_position` leaves position 0's features and error out of the
    graph as circuit-tracer does (its MLP output then counts as bias); `weights` is the model's
    HF folder where the backend keeps weights in other processes; `device` is where the backward
    passes run (default: the CPU; e.g. "cuda" for large models); `chunk` is how many kept rows
    the feature cap ranks and copies at a time (default: about 64 MiB of them)."""
    check_knobs(max_feature_nodes, max_n_logits, desired_logit_prob, batch_size, chunk)
    ts = load_transcoders(transcoders)
    states = prepare_many(
        model, prompts, ts, max_n_logits=max_n_logits, desired_logit_prob=desired_logit_prob,
        zero_first_position=zero_first_position, weights=weights,
    )  # fmt: skip
    return [
        graph_of(model, st, prompt, ts.scan, max_feature_nodes, batch_size, device, chunk)
        for st, prompt in zip(states, prompts, strict=True)
    ]


def attribute(
    model: Any,
    prompt: str | Sequence[int],
    transcoders: TranscoderSet | str | Path | Sequence[Any],
    **knobs: Unpack[GraphKnobs],
) -> Graph:
    """The attribution graph of `prompt`'s next-token prediction through `transcoders`
    (`attribute_many`'s keywords: `max_feature_nodes`, `max_n_logits`, `desired_logit_prob`,
    `batch_size`, `zero_first_position`, `weights`, `device`, `chunk`)."""
    return attribute_many(model, [prompt], transcoders, **knobs)[0]


def graph_of(
    model: Any, st: PromptState, prompt: str | Sequence[int], scan: str = "",
    max_feature_nodes: int | None = None, batch_size: int = 256,
    device: torch.device | str | None = None, chunk: int | None = None,
) -> Graph:  # fmt: skip
    """`attribute_state` of a prepared prompt, with the prompt's text and token strings."""
    inner = unwrap(model)
    strings = tuple(inner.to_string([t]) for t in st.tokens)
    text = prompt if isinstance(prompt, str) else inner.to_string(list(st.tokens))
    return attribute_state(
        st, max_feature_nodes=max_feature_nodes, batch_size=batch_size, prompt=text,
        token_strings=strings, scan=scan, device=device, chunk=chunk,
    )  # fmt: skip


__all__ = [
    "ForwardKnobs",
    "GraphKnobs",
    "attribute",
    "attribute_many",
    "attribute_state",
    "check_knobs",
    "graph_of",
    "prepare",
    "prepare_many",
    "state_of",
]
