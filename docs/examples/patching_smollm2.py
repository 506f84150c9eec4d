"""Worked example: which layers and positions of SmolLM2-135M carry a factual-recall answer.

Activation patching of resid_pre at every (layer, position) of the pair
    clean   "The Eiffel Tower is in the city of"  -> " Paris"
    corrupt "The Colosseum is in the city of"     -> " Rome"
with the metric logit(" Paris") - logit(" Rome"), normalized so 1 = the clean answer restored.
Attribution patching (one forward and backward, eager) estimates the same grid; the script
reports their agreement. Writes docs/img/patching_smollm2.png and docs/notes/patching_smollm2.json.

    uv run --with matplotlib python docs/examples/patching_smollm2.py [--backend vllm]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from ie_core import load_model
from ie_core.experiments.patching import logit_diff, patch_sweep
from ie_core.experiments.user_hooks import attribution_patch
from ie_core.runner import run

ROOT = Path(__file__).resolve().parents[2]
CLEAN = "The Eiffel Tower is in the city of"
CORRUPT = "The Colosseum is in the city of"
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def draw(grid: torch.Tensor, labels: list[str], title: str, ax: object) -> None:
    im = ax.imshow(grid.numpy(), aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1, origin="lower")  # type: ignore[attr-defined]
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right")  # type: ignore[attr-defined]
    ax.set_ylabel("layer (resid_pre)")  # type: ignore[attr-defined]
    ax.set_title(title)  # type: ignore[attr-defined]
    return im


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="eager")
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    model = load_model(MODEL, backend=args.backend, dtype="float32")
    metric = logit_diff(" Paris", " Rome")
    sweep = patch_sweep(model, CLEAN, CORRUPT, metric=metric)
    eager = model if args.backend == "eager" else load_model(MODEL, backend="eager")
    attr = attribution_patch(eager, CLEAN, CORRUPT, metric=metric)
    true, est = sweep.normalized(), attr.normalized()
    corr = float(torch.corrcoef(torch.stack([true.flatten(), est.flatten()]))[0, 1])
    per_layer = [
        float(torch.corrcoef(torch.stack([true[i], est[i]]))[0, 1]) for i in range(true.shape[0])
    ]
    labels = [model.to_string([t]) for t in model.to_tokens(CORRUPT)]
    fig, axes = plt.subplots(1, 2, figsize=(11, 6), sharey=True)
    im = draw(true, labels, "activation patching (normalized logit diff)", axes[0])
    draw(est, labels, f"attribution patching (r = {corr:.2f})", axes[1])
    fig.colorbar(im, ax=axes, shrink=0.8)
    fig.savefig(ROOT / "docs" / "img" / "patching_smollm2.png", dpi=110, bbox_inches="tight")
    record = {
        "model": MODEL,
        "backend": args.backend,
        "clean": CLEAN,
        "corrupt": CORRUPT,
        "metric": "logit_diff(' Paris', ' Rome')",
        "clean_score": sweep.clean,
        "corrupt_score": sweep.corrupt,
        "positions": labels,
        "normalized": [[round(float(v), 4) for v in row] for row in true],
        "attribution_normalized": [[round(float(v), 4) for v in row] for row in est],
        "attribution_correlation": round(corr, 4),
        "attribution_correlation_per_layer": [round(v, 4) for v in per_layer],
    }
    out = ROOT / "docs" / "notes" / "patching_smollm2.json"
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(
        json.dumps(
            {k: record[k] for k in ("clean_score", "corrupt_score", "attribution_correlation")}
        )
    )
    run(model.shutdown())


if __name__ == "__main__":
    main()
