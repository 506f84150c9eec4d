"""Worked example: harvest ~100k tokens of a shipped corpus at `resid_post.LAYER` of SmolLM2 on the
eager backend, train a tiny sparse autoencoder on them with plain torch, and report how well it
reconstructs held-out rows. docs/HARVEST.md walks through it.

    uv run --locked python docs/examples/harvest_sae.py --tokens 100000 --out /tmp/opticks-h
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import torch
from ie_core import load_model
from ie_core.harvest import harvest, open_harvest
from safetensors.torch import load_file

OPTICKS = "tvm_ffi/3rdparty/libbacktrace/Isaac.Newton-Opticks.txt"


def shipped_corpus() -> Path:
    """Newton's Opticks, a public-domain text the apache-tvm-ffi wheel (a vLLM dependency) ships."""
    import tvm_ffi

    return Path(tvm_ffi.__file__).parent / OPTICKS.split("/", 1)[1]


class SparseAutoencoder(torch.nn.Module):
    def __init__(self, width: int, features: int) -> None:
        super().__init__()
        self.encoder = torch.nn.Linear(width, features)
        self.decoder = torch.nn.Linear(features, width)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        codes = torch.relu(self.encoder(x - self.decoder.bias))
        return self.decoder(codes), codes


def train(data_dir: Path, point: str, steps: int, l1: float) -> tuple[SparseAutoencoder, dict]:
    every = open_harvest(data_dir)
    if len(every.manifest.shards) < 2:
        raise SystemExit("need at least two shards (one is held out); raise --tokens")
    # Train on every shard but the last, which is held out for the reconstruction figures.
    data = replace(every, manifest=replace(every.manifest, shards=every.manifest.shards[:-1]))
    width = data.manifest.spec["widths"][point]
    held_out = every.shard_paths()[-1]
    sae = SparseAutoencoder(width, 4 * width)
    optimizer = torch.optim.Adam(sae.parameters(), lr=1e-3)
    # Scale rows to unit mean norm (a constant from the first shard) so one l1 works across layers.
    scale = next(data.iter_shards([point]))[point].float().norm(dim=-1).mean()
    step = 0
    while step < steps:
        for batch in data.shuffled(point, 512, buffer_tokens=32768, seed=step):
            if len(batch) < 512 or step >= steps:
                continue
            x = batch.float() / scale
            recon, codes = sae(x)
            loss = (recon - x).pow(2).sum(-1).mean() + l1 * codes.abs().sum(-1).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
    rows = load_file(str(held_out))  # plain safetensors: no ie code needed to read a shard
    x = rows[point].float()[rows["position"] > 0] / scale  # position 0 is SmolLM2's outlier row
    with torch.no_grad():
        recon, codes = sae(x)
    fvu = float((recon - x).pow(2).sum() / (x - x.mean(0)).pow(2).sum())
    return sae, {
        "held_out_rows": len(x),
        "fraction_of_variance_unexplained": round(fvu, 4),
        "mean_active_features": round(float((codes > 0).float().sum(-1).mean()), 1),
        "features": 4 * width,
        "steps": steps,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=100_000)
    p.add_argument("--layer", type=int, default=10)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--l1", type=float, default=3e-3)
    p.add_argument("--out", type=Path, default=Path("opticks-harvest"))
    args = p.parse_args()
    model = load_model("HuggingFaceTB/SmolLM2-135M-Instruct", backend="eager")
    point = f"resid_post.{args.layer}"
    result = harvest(
        model, args.out, [point], files=[shipped_corpus()], context=128, max_tokens=args.tokens,
        shard_tokens=16384,
    )  # fmt: skip
    print(
        f"harvested {result.tokens} tokens into {result.shards} shards, {result.tokens_per_s:,.0f} tok/s"
    )
    _, report = train(args.out, point, args.steps, args.l1)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
