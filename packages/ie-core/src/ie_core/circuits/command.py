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
    p.add_argument("--batch-size", type=int, default=256, help="targets per backward pass")
    p.add_argument("--device", help="where the backward passes run (default: cpu; e.g. cuda)")
    p.add_argument("--slug", help="the graph's name in the viewer (default: --out's stem)")
    p.add_argument("--raw", type=Path, help="also save the raw graph (torch.save of its fields)")
    p.add_argument(
        "--heads", type=int, default=0,
        help="add the attention heads carrying the N largest kept cross-position edges "
        "(key head_flows; viewers ignore it)",
    )  # fmt: skip
    return p


def _write(
    graph: Any, out: Path, slug: str, raw: Path | None, options: dict[str, float], state: Any,
    heads: int,
) -> None:  # fmt: skip
    import torch

    from ie_core.circuits.graph_json import write_graph_json
    from ie_core.circuits.pruning import prune

    pruned = prune(graph, **options)
    write_graph_json(graph, out, slug=slug, pruned=pruned, **options)
    if state is not None:
        from ie_core.circuits.heads import heads_json

        data = json.loads(out.read_text())
        data["head_flows"] = heads_json(state, graph, heads, pruned.edge_mask)
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


def trace_command(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    from ie_core import load_model
    from ie_core.circuits.attribution import check_knobs, graph_of, prepare_many
    from ie_core.circuits.pruning import check_thresholds
    from ie_core.circuits.sources import load_transcoders
    from ie_core.runner import run

    check_thresholds(args.node_threshold, args.edge_threshold)
    check_knobs(args.max_feature_nodes, args.max_logits, args.logit_prob, args.batch_size)
    transcoders = load_transcoders(args.transcoders)  # a bad folder fails before the load
    prune_options = {"node_threshold": args.node_threshold, "edge_threshold": args.edge_threshold}
    model = load_model(args.model, backend=args.backend)
    try:
        states = prepare_many(
            model, args.prompt, transcoders, max_n_logits=args.max_logits,
            desired_logit_prob=args.logit_prob, weights=args.weights,
        )  # fmt: skip
        graphs = [
            graph_of(model, st, p, transcoders.scan, args.max_feature_nodes, args.batch_size,
                     args.device)
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
