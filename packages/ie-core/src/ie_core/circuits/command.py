"""`ie trace MODEL --transcoders SRC --prompt TEXT --out graph.json`: one attribution graph,
pruned and written as the viewer's JSON (and the raw graph beside it with --raw)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

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
    p.add_argument("--prompt", required=True, help="the text whose next token is traced")
    p.add_argument("--out", required=True, type=Path, help="the graph JSON file to write")
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


def trace_command(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    import torch

    from ie_core import load_model
    from ie_core.circuits.attribution import attribute, prepare
    from ie_core.circuits.graph_json import write_graph_json
    from ie_core.circuits.heads import heads_json
    from ie_core.circuits.pruning import check_thresholds, prune
    from ie_core.circuits.sources import load_transcoders
    from ie_core.runner import run

    check_thresholds(args.node_threshold, args.edge_threshold)
    transcoders = load_transcoders(args.transcoders)  # a bad folder fails before the load
    prune_options = {"node_threshold": args.node_threshold, "edge_threshold": args.edge_threshold}
    model = load_model(args.model, backend=args.backend)
    try:
        graph = attribute(
            model, args.prompt, transcoders, max_feature_nodes=args.max_feature_nodes,
            max_n_logits=args.max_logits, desired_logit_prob=args.logit_prob,
            batch_size=args.batch_size, weights=args.weights, device=args.device,
        )  # fmt: skip
        # The head flows need the forward half's state, which attribute() does not return.
        state = None if not args.heads else prepare(
            model, args.prompt, transcoders, max_n_logits=args.max_logits,
            desired_logit_prob=args.logit_prob, weights=args.weights,
        )  # fmt: skip
    finally:
        run(model.shutdown())
    pruned = prune(graph, **prune_options)
    write_graph_json(
        graph, args.out, slug=args.slug or args.out.stem, pruned=pruned, **prune_options
    )
    if state is not None:
        data = json.loads(args.out.read_text())
        data["head_flows"] = heads_json(state, graph, args.heads, pruned.edge_mask)
        args.out.write_text(json.dumps(data, indent=1))
    if args.raw:
        torch.save({k: getattr(graph, k) for k in graph.__dataclass_fields__}, args.raw)
    print(
        f"{args.out}: {int(pruned.node_mask.sum())} of {graph.n_nodes} nodes, "
        f"{int(pruned.edge_mask.sum())} edges kept ({graph.n_features} feature nodes, "
        f"{len(graph.logit_targets)} logit targets)",
        file=sys.stdout,
    )
    return 0
