"""`ie trace MODEL --transcoders SRC --prompt TEXT --out graph.json`: one attribution graph,
pruned and written as the viewer's JSON (and the raw graph beside it with --raw). Several
`--prompt`s are captured in one batch (`attribute_many`) and written one JSON per prompt into
the folder `--out` names (`graph_<i>.json`, `graph_<i>.pt` with --raw)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["trace_command"]


def _parser() -> argparse.ArgumentParser:
    from ie_core.tooling.cli import DefaultsHelpFormatter

    p = argparse.ArgumentParser(
        prog="ie trace",
        description="Attribution graph of a prompt's next token through per-layer transcoders "
        "or a cross-layer transcoder (circuit-tracer's folder formats), written as "
        "circuit-tracer / Neuronpedia graph JSON.",
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument("model", help="model id or folder")
    p.add_argument(
        "--transcoders",
        required=True,
        help="folder of layer_<L>.safetensors files, or a CLT's W_enc_<L> / W_dec_<L> files",
    )
    p.add_argument(
        "--prompt", required=True, action="append", help="the text whose next token is traced "
        "(repeat it for several graphs from one batched capture)",
    )  # fmt: skip
    p.add_argument(
        "--out", required=True, type=Path,
        help="the graph JSON file to write (a folder for several --prompt)",
    )  # fmt: skip
    p.add_argument("--backend", default="auto", help="eager, vllm, vllm-static, remote")
    p.add_argument("--weights", help="the model's HF folder, for backends that keep weights away")
    p.add_argument("--max-feature-nodes", type=int, help="cap on feature nodes (default: all)")
    p.add_argument("--max-logits", type=int, default=10, help="at most this many logit targets")
    p.add_argument("--logit-prob", type=float, default=0.95, help="logit targets' probability mass")
    p.add_argument("--node-threshold", type=float, default=0.8, help="influence share of nodes")
    p.add_argument("--edge-threshold", type=float, default=0.98, help="influence share of edges")
    p.add_argument(
        "--no-bos", action="store_true",
        help="a text prompt as the tokenizer encodes it; the default puts its BOS token first and "
        "the text without special tokens after it, as circuit-tracer does",
    )  # fmt: skip
    p.add_argument("--batch-size", type=int, default=256, help="targets per backward pass")
    p.add_argument("--device", help="where the backward passes run (default: cpu; e.g. cuda)")
    p.add_argument("--chunk", type=int, help="kept rows a feature cap ranks at a time "
                   "(default: about 64 MiB of them; lower it to bound memory further)")  # fmt: skip
    p.add_argument("--slug", help="the graph's name in the viewer (default: --out's stem)")
    p.add_argument("--raw", type=Path, help="also save the raw graph (torch.save of its fields)")
    p.add_argument(
        "--heads", type=int, default=0,
        help="add the attention heads carrying the N largest kept cross-position edges "
        "(key head_flows; viewers ignore it)",
    )  # fmt: skip
    return p


def _write(
    graph: Any, out: Path, slug: str, raw: Path | None, options: dict[str, Any], state: Any,
    heads: int,
) -> None:  # fmt: skip
    import torch

    from ie_core.circuits.graph_json import graph_json
    from ie_core.circuits.pruning import prune

    thresholds = {k: options[k] for k in ("node_threshold", "edge_threshold")}
    pruned = prune(graph, **thresholds)
    data = graph_json(graph, slug=slug, pruned=pruned, **options)
    if state is not None:
        from ie_core.circuits.heads import heads_json

        data["head_flows"] = heads_json(state, graph, heads, pruned.edge_mask)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1))
    if raw:
        raw.parent.mkdir(parents=True, exist_ok=True)
        torch.save({k: getattr(graph, k) for k in graph.__dataclass_fields__}, raw)
    print(
        f"{out}: {int(pruned.node_mask.sum())} of {graph.n_nodes} nodes, "
        f"{int(pruned.edge_mask.sum())} edges kept ({graph.n_features} feature nodes, "
        f"{len(graph.logit_targets)} logit targets)",
        file=sys.stdout,
    )
    _fit_hint(graph, out, data, options, slug)


def _fit_hint(graph: Any, out: Path, data: dict, options: dict[str, Any], slug: str) -> None:
    """When the JSON is over the dashboard graph page's limits, say so and which thresholds
    bring it under (`ie_core.circuits.fitting`)."""
    from ie_core.circuits.fitting import fitting_thresholds
    from ie_core.graph_limits import over_limits

    over = over_limits(len(data["nodes"]), len(data["links"]), out.stat().st_size)
    if not over:
        return
    print(f"{out}: over what the dashboard's graph page accepts ({', '.join(over)}); looking "
          "for node / edge thresholds that fit (a few more prunings)", file=sys.stdout)  # fmt: skip
    fit = fitting_thresholds(
        graph, options["node_threshold"], options["edge_threshold"], slug=slug,
        transcoder_kind=options["transcoder_kind"],
    )  # fmt: skip
    if fit is None:
        advice = ("no node / edge thresholds down to 0.3 bring it under: cap the features "
                  "(--max-feature-nodes) or shorten the prompt")  # fmt: skip
    else:
        advice = (f"{fit.flags()} keeps {fit.nodes:,} nodes and {fit.links:,} edges "
                  f"({fit.size:,} bytes)")  # fmt: skip
    print(f"{out}: for the dashboard's graph page: {advice}", file=sys.stdout)


def _attributed_ids(model: Any, prompt: str, bos: bool) -> list[int]:
    """circuit-tracer's convention for a text prompt (0.5.0's `ensure_tokenized`): the text without
    special tokens, after one special token (the tokenizer's BOS here; the graph leaves position 0
    out). With `bos` False, or a tokenizer without a BOS, the tokenizer's own special tokens."""
    from ie_core.errors import BadPromptError

    if bos:
        try:
            return model.to_tokens(prompt, prepend_bos=True)
        except BadPromptError:
            pass
    return model.to_tokens(prompt)


def trace_command(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    from ie_core import load_model
    from ie_core.circuits.attribution import check_knobs, graph_of, prepare_many
    from ie_core.circuits.graph_json import transcoder_kind_of
    from ie_core.circuits.pruning import check_thresholds
    from ie_core.circuits.sources import load_transcoders
    from ie_core.runner import run

    check_thresholds(args.node_threshold, args.edge_threshold)
    check_knobs(
        args.max_feature_nodes, args.max_logits, args.logit_prob, args.batch_size, args.chunk
    )
    transcoders = load_transcoders(args.transcoders)  # a bad folder fails before the load
    prune_options = {"node_threshold": args.node_threshold, "edge_threshold": args.edge_threshold,
                     "transcoder_kind": transcoder_kind_of(transcoders)}  # fmt: skip
    model = load_model(args.model, backend=args.backend)
    try:
        ids = [_attributed_ids(model, p, not args.no_bos) for p in args.prompt]
        for p, row in zip(args.prompt, ids, strict=True):
            print(f"attributing {p!r} as ids {row} ({[model.to_string([t]) for t in row]})")
        states = prepare_many(
            model, ids, transcoders, max_n_logits=args.max_logits,
            desired_logit_prob=args.logit_prob, weights=args.weights,
        )  # fmt: skip
        graphs = [
            graph_of(model, st, p, transcoders.scan, args.max_feature_nodes, args.batch_size,
                     args.device, args.chunk)
            for st, p in zip(states, args.prompt, strict=True)
        ]  # fmt: skip
    finally:
        run(model.shutdown())
    if len(graphs) > 1:
        args.out.mkdir(parents=True, exist_ok=True)
    for i, (graph, state) in enumerate(zip(graphs, states, strict=True)):
        out, raw, slug = args.out, args.raw, args.slug or args.out.stem
        if len(graphs) > 1:
            out, slug = args.out / f"graph_{i}.json", f"{slug}-{i}"
            raw = args.raw and args.raw / f"graph_{i}.pt"
        _write(graph, out, slug, raw, prune_options, state if args.heads else None, args.heads)
    return 0
