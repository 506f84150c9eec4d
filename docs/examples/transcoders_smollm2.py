"""Worked example: train a per-layer transcoder set for SmolLM2-135M-Instruct on a shipped corpus,
then trace a factual prompt's attribution graph through it (issue #45; docs/USAGE.md, "Worked
example: transcoders for SmolLM2").

1. harvest `mlp_in.L` and `mlp_out.L` of all 30 layers over Newton's Opticks (eager backend);
2. train one ReLU transcoder per layer (mlp_in.L -> mlp_out.L) in plain torch, the last shard held
   out for the fraction of variance explained (FVE) and mean L0, and write the set in
   circuit-tracer's layout (`layer_<L>.safetensors` + config.yaml) to OUT/transcoders;
3. `ie_core.circuits.attribute` on the prompt: OUT/graph.json (the viewers' JSON), the answer, the
   error nodes' share of its influence and its most influential features;
   then one intervention that tests it (`ie_core.circuits.intervene`): every feature the graph
   found at " France" set to minus its activation, over all layers and per third of them;
4. the dashboard's graph page in headless Chromium -> OUT/graph_smollm2.png, the numbers ->
   OUT/transcoders_smollm2.json.

Everything it writes goes under --out; `--update-docs` also copies the picture and the numbers
over the committed docs/img/graph_smollm2.png and docs/notes/transcoders_smollm2.json. Each stage
prints a line when it starts and ends, terminal or not; `IE_PROGRESS=1` adds the harvest's
progress line when stderr is not a terminal.

    uv run --locked python docs/examples/transcoders_smollm2.py --out /tmp/tc-example-out

The set also works from the command line: `ie trace HuggingFaceTB/SmolLM2-135M-Instruct
--transcoders OUT/transcoders --prompt "The capital of France is" --out graph.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from ie_core import load_model
from ie_core.circuits import (
    FeatureIntervention,
    Graph,
    TranscoderSet,
    attribute,
    intervene,
    load_transcoders,
    prune,
    write_graph_json,
    write_layer_file,
)
from ie_core.circuits.influence import normalized, path_influence
from ie_core.experiments.saes import SAE, from_tensors
from ie_core.harvest import harvest, open_harvest
from ie_core.harvest.shards import load_shard

ROOT = Path(__file__).resolve().parents[2]
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
PROMPT = "The capital of France is"  # " Paris" is SmolLM2-135M-Instruct's top-1 (p ~0.77)
OPTICKS = "tvm_ffi/3rdparty/libbacktrace/Isaac.Newton-Opticks.txt"
Params = dict[str, torch.Tensor]
STARTED = time.perf_counter()


def stage(message: str) -> None:
    """One line per stage on stdout, flushed, whatever the terminal (the harvest's own progress
    line is drawn only on a terminal, so a log would otherwise stay silent for minutes)."""
    print(f"[{time.perf_counter() - STARTED:6.0f} s] {message}", flush=True)


@dataclass(frozen=True)
class Outputs:
    """Every path the example writes: all under --out, and the committed records only with
    --update-docs (copies made at the end)."""

    out: Path
    update_docs: bool

    @property
    def harvest(self) -> Path:
        return self.out / "harvest"

    @property
    def transcoders(self) -> Path:
        return self.out / "transcoders"

    @property
    def graph(self) -> Path:
        return self.out / "graph.json"

    @property
    def picture(self) -> Path:
        return self.out / "graph_smollm2.png"

    @property
    def summary(self) -> Path:
        return self.out / "transcoders_smollm2.json"

    def committed(self) -> list[tuple[Path, Path]]:
        """(written under --out, committed copy) pairs that --update-docs replaces."""
        if not self.update_docs:
            return []
        return [
            (self.picture, ROOT / "docs/img/graph_smollm2.png"),
            (self.summary, ROOT / "docs/notes/transcoders_smollm2.json"),
        ]


def shipped_corpus() -> Path:
    """Newton's Opticks, a public-domain text the apache-tvm-ffi wheel (a vLLM dependency) ships."""
    import tvm_ffi

    return Path(tvm_ffi.__file__).parent / OPTICKS.split("/", 1)[1]


def harvest_mlps(model: Any, folder: Path, tokens: int) -> dict[str, Any]:
    """Every layer's MLP input and output, in bfloat16, 8 shards (a rerun resumes)."""
    points = [f"{kind}.{n}" for n in range(model.n_layers) for kind in ("mlp_in", "mlp_out")]
    result = harvest(
        model, folder, points, files=[shipped_corpus()], context=128, max_tokens=tokens,
        shard_tokens=tokens // 8, dtype="bfloat16",
    )  # fmt: skip
    stage(f"harvested {result.tokens} tokens x {len(points)} points in {result.seconds:.0f} s")
    return {"tokens": result.tokens, "harvested_now": result.harvested_tokens,
            "shards": result.shards, "seconds": round(result.seconds, 1)}  # fmt: skip


def layer_rows(shards: list[Path], layer: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(mlp_in.L, mlp_out.L) rows in float32 and how many were left out: position 0 (the graph
    leaves it out too) and the attention-sink rows whose MLP output is over 20x the median norm
    (in layer 11, 3 such rows of 57k hold 92% of the variance; 944 rows in layer 2)."""
    names = [f"mlp_in.{layer}", f"mlp_out.{layer}"]
    parts = [load_shard(path, names) for path in shards]
    x, y = (torch.cat([p[n][p["position"] > 0] for p in parts]).float() for n in names)
    norm = y.norm(dim=1)
    keep = norm < 20 * norm.median()
    return x[keep], y[keep], sum(len(p["position"]) for p in parts) - int(keep.sum())


def encode(p: Params, x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ p["W_enc"].T + p["b_enc"])


def train_transcoder(
    x: torch.Tensor, y: torch.Tensor, width: int, steps: int, l1: float, seed: int,
    lr: float = 3e-3, batch: int = 512,
) -> Params:  # fmt: skip
    """A ReLU transcoder fitted by Adam to MSE + l1 * sum_i f_i ||W_dec[i]||, the penalty ramped
    up over the first tenth of the steps, the learning rate decayed over the last fifth."""
    g = torch.Generator().manual_seed(seed)
    d = x.shape[1]
    dec = torch.randn(width, d, generator=g)
    p = {
        "W_enc": torch.randn(width, d, generator=g) / d**0.5,
        "b_enc": torch.zeros(width),
        "W_dec": 0.1 * dec / dec.norm(dim=1, keepdim=True),
        "b_dec": y.mean(0),
    }
    for t in p.values():
        t.requires_grad_(True)
    opt = torch.optim.Adam(p.values(), lr=lr)
    for step in range(steps):
        idx = torch.randint(len(x), (batch,), generator=g)
        f = encode(p, x[idx])
        mse = (f @ p["W_dec"] + p["b_dec"] - y[idx]).pow(2).sum(-1).mean()
        sparsity = (f * p["W_dec"].norm(dim=1)).sum(-1).mean()
        loss = mse + l1 * min(1.0, 10 * step / steps) * sparsity
        opt.param_groups[0]["lr"] = lr * min(1.0, 5 * (1 - step / steps))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k: v.detach() for k, v in p.items()}


def evaluate(p: Params, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """FVE, mean number of active features and the share of never-active features."""
    with torch.no_grad():
        f = encode(p, x)
        fvu = (f @ p["W_dec"] + p["b_dec"] - y).pow(2).sum() / (y - y.mean(0)).pow(2).sum()
    active = f > 0
    return {
        "fve": round(1 - float(fvu), 4),
        "l0": round(float(active.sum(-1).float().mean()), 1),
        "dead": round(float((~active.any(0)).float().mean()), 3),
    }


def as_sae(p: Params, s_in: float, s_out: float, layer: int) -> SAE:
    """The transcoder on the model's own rows (the training scales folded into the weights: the
    set reads raw `mlp_in.L`), in SAELens layout (W_enc [d_model, width])."""
    weights = {
        "W_enc": (p["W_enc"] / s_in).T.contiguous(), "b_enc": p["b_enc"],
        "W_dec": p["W_dec"] * s_out, "b_dec": p["b_dec"] * s_out,
    }  # fmt: skip
    return from_tensors(weights, address=f"mlp_in.{layer}", out_address=f"mlp_out.{layer}")


def train_all(data: Path, out: Path, n_layers: int, args: argparse.Namespace) -> list[dict]:
    """One transcoder per layer on all shards but the last, evaluated on the last; writes
    out/layer_<L>.safetensors and a config.yaml naming circuit-tracer's hooks."""
    shards = open_harvest(data).shard_paths()
    out.mkdir(parents=True, exist_ok=True)
    report = []
    for layer in range(n_layers):
        start = time.perf_counter()
        x, y, left_out = layer_rows(shards[:-1], layer)
        # Inputs to unit mean norm, outputs to unit total variance: one l1 fits every layer.
        s_in, s_out = (
            float(x.norm(dim=1).mean()),
            float((y - y.mean(0)).pow(2).sum(1).mean()) ** 0.5,
        )
        p = train_transcoder(x / s_in, y / s_out, args.width, args.steps, args.l1, seed=layer)
        hx, hy, _ = layer_rows(shards[-1:], layer)
        stats = evaluate(p, hx / s_in, hy / s_out)
        write_layer_file(as_sae(p, s_in, s_out, layer), out / f"layer_{layer}.safetensors")
        seconds = time.perf_counter() - start
        report.append(
            {"layer": layer, **stats, "rows_left_out": left_out, "seconds": round(seconds, 1)}
        )
        stage(f"layer {layer:2d}: FVE {stats['fve']:.3f}  L0 {stats['l0']:5.1f}  "
              f"dead {stats['dead']:.2f}  {seconds:.0f} s")  # fmt: skip
    files = "".join(f"- layer_{layer}.safetensors\n" for layer in range(n_layers))
    (out / "config.yaml").write_text(
        f"model_kind: transcoder_set\nmodel_name: {MODEL}\nscan: smollm2-135m-opticks-relu"
        f"{args.width}\nfeature_input_hook: mlp.hook_in\nfeature_output_hook: mlp.hook_out\n"
        f"transcoders:\n{files}"
    )
    return report


def describe(graph: Graph, top: int) -> dict[str, Any]:
    """The answer, the error nodes' share of its influence (error / (error + token), influence
    along |normalised| edges, circuit-tracer's replacement score is 1 minus it) and the features
    with most influence on it."""
    start = torch.zeros(graph.n_nodes)
    start[graph.logit_offset] = 1.0  # the top logit alone
    influence = path_influence(normalized(graph.adjacency.float()), start)
    errors = float(influence[graph.error_offset : graph.token_offset].sum())
    tokens = float(influence[graph.token_offset : graph.logit_offset].sum())
    features = []
    for i in torch.argsort(influence[: graph.n_features], descending=True)[:top].tolist():
        n = graph.node(i)
        features.append({
            "layer": n.layer, "position": n.pos, "feature": n.index,
            "token": graph.token_strings[n.pos], "activation": round(n.activation or 0.0, 3),
            "influence": round(float(influence[i]), 4),
        })  # fmt: skip
    answer = graph.logit_targets[0]
    return {
        "nodes": graph.n_nodes, "feature_nodes": graph.n_features, "answer": answer.token,
        "answer_probability": round(answer.probability, 4),
        "error_share": round(errors / (errors + tokens), 4), "top_features": features,
    }  # fmt: skip


def clamp_answer(
    model: Any, transcoders: TranscoderSet, graph: Graph, token: str, factor: float
) -> dict[str, Any]:
    """Test the graph with one intervention: every feature it found at `token`'s position set to
    `factor` times its activation there (in the live forward, `ie_core.circuits.intervene`),
    then the same for each third of the layers alone, to see where the answer is carried."""
    pos = graph.token_strings.index(token)
    at = [graph.node(i) for i in range(graph.n_features) if graph.node(i).pos == pos]
    answer = graph.logit_targets[0].token_id

    def run(nodes: list[Any]) -> dict[str, Any]:
        ivs = [FeatureIntervention.at_node(n, factor * (n.activation or 0.0)) for n in nodes]
        r = intervene(model, graph.prompt, transcoders, ivs)
        top = [{"token": t.token, "p": round(t.probability, 4)} for t in r.top_after[:3]]
        return {"features": len(ivs), "moved": r.moved, "top_after": top,
                "answer_p_change": round(r.probability_change(answer), 4)}  # fmt: skip

    thirds = [
        (lo, lo + graph.n_layers // 3) for lo in range(0, graph.n_layers, graph.n_layers // 3)
    ]
    by_layers = {f"layers {lo}-{hi - 1}": run([n for n in at if lo <= n.layer < hi])
                 for lo, hi in thirds}  # fmt: skip
    return {"token": token, "position": pos, "factor": factor, "all_layers": run(at),
            "by_layers": by_layers}  # fmt: skip


def screenshot(graph_file: Path, png: Path) -> None:
    """The dashboard's graph page in headless Chromium (as `ie dashboard screenshots` takes its
    pages), from the title to the drawing's bottom, saved as a palette PNG."""
    import tempfile

    from ie_dashboard.app import create_app
    from ie_dashboard.db import Database
    from ie_dashboard.ingest import upsert_graph
    from ie_dashboard.screenshots import CHROMIUM_ARGS, chromium_path
    from ie_dashboard.serve import background_server
    from PIL import Image
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        db = Database(f"sqlite:///{tmp}/dashboard.sqlite")
        db.migrate()
        with db.write() as session:
            graph_id, _ = upsert_graph(session, json.loads(graph_file.read_text()), str(graph_file))
        with background_server(create_app(db, token=None)) as base, sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
            # A laptop's width: the page draws the graph across it.
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.goto(f"{base}/graphs/{graph_id}", wait_until="networkidle")
            top, box = page.locator("h1").bounding_box(), page.locator("svg.graph").bounding_box()
            assert top is not None and box is not None
            y, height = top["y"] - 16, box["y"] + box["height"] - top["y"] + 24
            png.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(
                path=str(png),
                full_page=True,
                clip={"x": 0, "y": y, "width": 1280, "height": height},
            )
            browser.close()
        db.dispose()
    # 128 colours, the page's node and edge colours first, no dithering: about a third the bytes.
    rgb = Image.open(png).convert("RGB")
    ui = ["68d391", "b794f4", "f6ad55", "a0aec0", "2b6cb0", "c53030", "ffffff", "000000"]
    palette = Image.new("P", (1, 1))
    own = rgb.quantize(120, method=Image.Quantize.FASTOCTREE).getpalette() or []
    palette.putpalette([c for h in ui for c in bytes.fromhex(h)] + own[: 3 * 120])
    rgb.quantize(palette=palette, dither=Image.Dither.NONE).save(png, optimize=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/tc-example-out"),
                    help="the folder everything is written to")  # fmt: skip
    ap.add_argument("--tokens", type=int, default=65536, help="tokens harvested (8 shards)")
    ap.add_argument("--width", type=int, default=1024, help="features per transcoder")
    ap.add_argument("--steps", type=int, default=240, help="Adam steps of 512 rows per layer")
    ap.add_argument("--l1", type=float, default=2e-2, help="sparsity penalty")
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--clamp-token", default=" France", help="the position whose features flip")
    ap.add_argument("--clamp-factor", type=float, default=-1.0, help="value / own activation")
    # circuit-tracer's 0.8 / 0.98 keep 1,784 nodes and 668k edges here: over the dashboard's
    # 50k-edge limit, and unreadable drawn.
    ap.add_argument("--node-threshold", type=float, default=0.5)
    ap.add_argument("--edge-threshold", type=float, default=0.8)
    ap.add_argument(
        "--update-docs", action="store_true",
        help="also copy the picture and the numbers over the committed docs/img/graph_smollm2.png "
        "and docs/notes/transcoders_smollm2.json",
    )  # fmt: skip
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    paths = Outputs(args.out, args.update_docs)
    load = {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()}
    stage(f"loading {MODEL} (eager); everything goes under {args.out}")
    model = load_model(MODEL, backend="eager")

    stage(f"harvesting {args.tokens} tokens x {2 * model.n_layers} points into {paths.harvest} "
          "(about 3 minutes on 2 cores; IE_PROGRESS=1 draws a progress line off a terminal)")  # fmt: skip
    harvested = harvest_mlps(model, paths.harvest, args.tokens)
    stage(f"training {model.n_layers} transcoders ({args.steps} steps each) into "
          f"{paths.transcoders}")  # fmt: skip
    start = time.perf_counter()
    layers = train_all(paths.harvest, paths.transcoders, model.n_layers, args)
    timings = {"harvest": harvested["seconds"], "train": round(time.perf_counter() - start, 1)}

    transcoders: TranscoderSet = load_transcoders(paths.transcoders)
    stage(f"attributing {args.prompt!r} through every active feature")
    start = time.perf_counter()
    graph = attribute(model, args.prompt, transcoders)  # every active feature, no cap
    timings["attribute"] = round(time.perf_counter() - start, 1)
    thresholds = {"node_threshold": args.node_threshold, "edge_threshold": args.edge_threshold}
    kept = prune(graph, **thresholds)
    graph_file = write_graph_json(
        graph, paths.graph, slug="smollm2-capital", pruned=kept,
        transcoder_kind="per-layer transcoder", **thresholds,
    )  # fmt: skip
    traced = describe(graph, top=10)
    print(f"{graph.n_nodes} nodes ({graph.n_features} features), {int(kept.node_mask.sum())} kept "
          f"in {graph_file}; answer {traced['answer']!r} p={traced['answer_probability']:.3f}; "
          f"error share of its influence {traced['error_share']:.3f}")  # fmt: skip
    for f in traced["top_features"]:
        print(f"  layer {f['layer']:2d} position {f['position']} ({f['token']!r}) feature "
              f"{f['feature']:4d}: activation {f['activation']:.3f}, influence {f['influence']:.4f}")  # fmt: skip
    stage(f"clamping the features at {args.clamp_token!r} (intervene, 4 runs)")
    clamped = clamp_answer(model, transcoders, graph, args.clamp_token, args.clamp_factor)
    every = clamped["all_layers"]
    print(f"features at {args.clamp_token!r} set to {args.clamp_factor:g} x their activation: "
          f"top {every['top_after']}, answer p {every['answer_p_change']:+.3f}")  # fmt: skip
    stage(f"drawing the graph page in headless Chromium -> {paths.picture}")
    start = time.perf_counter()
    screenshot(graph_file, paths.picture)
    timings["screenshot"] = round(time.perf_counter() - start, 1)

    fves, l0s = [r["fve"] for r in layers], [r["l0"] for r in layers]
    summary = {
        "model": MODEL, "backend": "eager", "corpus": OPTICKS, "harvest": harvested,
        "points": "mlp_in.L and mlp_out.L, L = 0..29, bfloat16", "width": args.width,
        "steps_per_layer": args.steps, "batch_rows": 512, "l1": args.l1,
        "held_out": "the last shard, positions > 0, no attention-sink rows",
        "fve_range": [min(fves), max(fves)],
        "l0_range": [min(l0s), max(l0s)], "layers": layers, "prompt": args.prompt,
        "graph": traced, "graph_json": {"nodes_kept": int(kept.node_mask.sum()),
                                        "edges_kept": int(kept.edge_mask.sum()), **thresholds},
        "clamp": clamped, "timings_s": timings, "machine": {**load, "load_average_at_end": os.getloadavg()},
    }  # fmt: skip
    paths.summary.write_text(json.dumps(summary, indent=1) + "\n")
    stage(f"train {timings['train']:.0f} s; wrote {paths.summary} and {paths.picture}")
    for written, committed in paths.committed():
        shutil.copyfile(written, committed)
        stage(f"--update-docs: copied {written} over {committed}")

    return {"model": model, "transcoders": transcoders, "graph": graph, "summary": summary}


if __name__ == "__main__":
    main()
