"""Run circuit-tracer's attribute() on one model folder and transcoder folder, in circuit-tracer's
own environment (not the workspace's): `python circuit_tracer_child.py MODEL TC TOKENS OUT`.
Called by circuit_tracer_parity.py; TOKENS is a JSON list of ids, OUT a torch file. TC is a
per-layer folder (layer_<L>.safetensors) or a cross-layer transcoder's (W_enc_<L> / W_dec_<L>).
TOKENS as a list of id lists (circuit_tracing_bench.py) times each prompt's graph one by one after
one warm-up graph of the first, and writes only the times, node counts and peak RSS."""

import json
import resource
import sys
import time
from pathlib import Path

import circuit_tracer
import torch
from circuit_tracer import ReplacementModel, attribute
from circuit_tracer.transcoder.cross_layer_transcoder import load_clt
from circuit_tracer.transcoder.single_layer_transcoder import load_transcoder_set

HOOKS = {"feature_input_hook": "mlp.hook_in", "feature_output_hook": "mlp.hook_out"}


def _transcoders(tc_dir: str, cpu: torch.device):
    if (Path(tc_dir) / "W_enc_0.safetensors").is_file():
        return load_clt(
            tc_dir, scan="parity", device=cpu, dtype=torch.float32, lazy_decoder=False, **HOOKS
        )
    n = len(list(Path(tc_dir).glob("layer_*.safetensors")))
    paths = {i: str(Path(tc_dir) / f"layer_{i}.safetensors") for i in range(n)}
    return load_transcoder_set(
        paths, scan="parity", device=cpu, dtype=torch.float32, lazy_encoder=False,
        lazy_decoder=False, **HOOKS,
    )  # fmt: skip


def _graph(model, ids: list[int]):
    return attribute(
        torch.tensor(ids), model, max_n_logits=10, desired_logit_prob=0.95, batch_size=256
    )


def _one_by_one(model, prompts: list[list[int]], out: str) -> None:
    """Each prompt's graph timed in turn, after a warm-up graph; peak RSS after the first."""
    _graph(model, prompts[0])
    seconds, nodes, rss = [], [], []
    for ids in prompts:
        start = time.perf_counter()
        g = _graph(model, ids)
        seconds.append(time.perf_counter() - start)
        nodes.append(int(g.adjacency_matrix.shape[0]))
        rss.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    torch.save({"seconds": seconds, "nodes": nodes, "peak_rss_mib": rss}, out)


def main() -> None:
    model_dir, tc_dir, tokens, out = sys.argv[1:5]
    cpu = torch.device("cpu")
    ts = _transcoders(tc_dir, cpu)
    model = ReplacementModel.from_pretrained_and_transcoders(
        model_dir, ts, backend="nnsight", device=cpu, dtype=torch.float32
    )
    if isinstance(json.loads(tokens)[0], list):
        _one_by_one(model, json.loads(tokens), out)
        return
    ids = torch.tensor(json.loads(tokens))
    start = time.perf_counter()
    g = attribute(ids, model, max_n_logits=10, desired_logit_prob=0.95, batch_size=256)
    seconds = time.perf_counter() - start
    torch.save(
        {
            "adjacency": g.adjacency_matrix.float(),
            "active_features": g.active_features,
            "selected_features": g.selected_features,
            "activation_values": g.activation_values.float(),
            "logit_ids": [t.vocab_idx for t in g.logit_targets],
            "logit_probabilities": g.logit_probabilities.float(),
            "version": circuit_tracer.__version__ if hasattr(circuit_tracer, "__version__") else "",
            "seconds": seconds,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        },
        out,
    )


if __name__ == "__main__":
    main()
