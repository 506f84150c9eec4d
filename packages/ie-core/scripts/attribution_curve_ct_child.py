"""circuit-tracer's side of attribution_memory_curve.py, run in circuit-tracer 0.5.0's own
environment: `python attribution_curve_ct_child.py MODEL TC IDS_JSON MAX_FEATURE_NODES BATCH`.
One graph of the ids (then its pruning at circuit-tracer's defaults, 0.8 / 0.98); prints one
JSON line: seconds, node counts, peak RSS (this process's) after attribution and after pruning."""

import json
import resource
import sys
import time

import torch
from circuit_tracer import ReplacementModel, attribute
from circuit_tracer_child import _transcoders


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    model_dir, tc_dir, ids_file, cap, batch = sys.argv[1:6]
    cpu = torch.device("cpu")
    with open(ids_file) as f:
        ids = json.load(f)
    model = ReplacementModel.from_pretrained_and_transcoders(
        model_dir, _transcoders(tc_dir, cpu), backend="nnsight", device=cpu, dtype=torch.float32
    )
    loaded = _rss_mib()
    start = time.perf_counter()
    g = attribute(
        torch.tensor(ids), model, max_n_logits=10, desired_logit_prob=0.95,
        batch_size=int(batch), max_feature_nodes=None if cap == "none" else int(cap),
    )  # fmt: skip
    out = {
        "seconds_attribute": time.perf_counter() - start,
        "nodes": int(g.adjacency_matrix.shape[0]),
        "active_features": int(g.active_features.shape[0]),
        "peak_rss_mib_loaded": loaded,
        "peak_rss_mib_attribute": _rss_mib(),
    }
    try:
        from circuit_tracer.graph import prune_graph
    except ImportError:
        out["prune"] = "circuit_tracer.graph.prune_graph not found"
    else:
        start = time.perf_counter()
        prune_graph(g, node_threshold=0.8, edge_threshold=0.98)
        out["seconds_prune"] = time.perf_counter() - start
    out["peak_rss_mib"] = _rss_mib()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
