"""An atlas as delphi's latent cache (EleutherAI's `delphi`, PyPI `eai-delphi` 0.1.3), so its
`LatentDataset`, explainers and scorers read it as a cache of their own.

The layout (facts read from the released package's loader and cache writer): a folder per
module under the cache folder (delphi's `latents/`), holding `config.json` (the cache's
settings plus `model_name`) and one safetensors file per range of features, named
`<first>_<last>.safetensors` (both inclusive), with `locations` `[n, 3]` (batch row, position,
feature minus the file's first), `activations` `[n]` and `tokens` `[batch, ctx_len]`.

What it holds: the windows the atlas kept (every feature's top contexts and band samples), and
for each feature its activations at every token of the windows it kept, so its activating
examples are exactly the atlas's (the top contexts and the quantile samples). A feature's
firings in windows kept for other features are not in the atlas, so they are absent here: a
non-activating example delphi draws from the other windows may hold an unrecorded firing, and
delphi's per-token frequency counts the kept windows only (the atlas's density is in
`config.json`'s `ie_atlas` block). docs/HARVEST.md, "Atlas", says when to prefer a full cache.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import torch

from ie_core.atlas.errors import AtlasError
from ie_core.atlas.reader import AtlasData, open_atlas
from ie_core.harvest.storage import write_atomic

__all__ = ["export_delphi"]


def _entries(data: AtlasData) -> tuple[torch.Tensor, torch.Tensor]:
    """Every (feature, window row, position) where a feature fired in a window it kept, and the
    activation there: `[n, 3]` int64 sorted by feature, and `[n]` fp32."""
    s, c = data.state, data.contexts
    d = s.d_sae
    seqs = torch.cat([s.top_sequence.reshape(d, -1), s.sample_sequence.reshape(d, -1)], dim=1)
    context = c["top_acts"].shape[-1]
    acts = torch.cat([c["top_acts"], c["sample_acts"].reshape(d, -1, context)], dim=1)
    order = torch.argsort(c["window_sequence"])
    known = c["window_sequence"][order]
    slot = torch.searchsorted(known, seqs.clamp_min(0)).clamp_max(known.numel() - 1)
    rows = order[slot]
    kept = (seqs >= 0) & (known[slot] == seqs)
    feature, which, position = ((acts > 0) & kept.unsqueeze(-1)).nonzero(as_tuple=True)
    window = rows[feature, which]
    # A window kept twice for one feature (a top context and a band sample) holds the same
    # activations; one copy of each (feature, window, position).
    width = int(c["window_tokens"].shape[1])
    key = (feature * (known.numel() + 1) + window) * width + position
    unique, inverse = torch.unique(key, return_inverse=True)
    values = torch.zeros(unique.numel(), dtype=torch.float32)
    values[inverse] = acts[feature, which, position].float()
    locations = torch.stack([
        (unique // width) % (known.numel() + 1), unique % width, unique // width // (known.numel() + 1),
    ], dim=1)  # fmt: skip
    return locations, values


def _config(data: AtlasData, module: str, splits: int, model: str) -> dict[str, Any]:
    spec = data.manifest.spec
    files = spec.get("files") or []
    tokens = data.contexts["window_tokens"]
    return {
        # delphi's CacheConfig fields; the dataset ones name the atlas's corpus (delphi reads
        # them only when a file lacks `tokens`, which these never do).
        "dataset_repo": ", ".join(str(f) for f in files) if isinstance(files, list) else str(files),
        "dataset_split": "", "dataset_name": "", "dataset_column": str(spec.get("column") or "text"),
        "batch_size": int(tokens.shape[0]), "cache_ctx_len": int(tokens.shape[1]),
        "ctx_len": int(tokens.shape[1]), "n_tokens": int(tokens.numel()), "n_splits": splits,
        "model_name": model,
        "ie_atlas": {"module": module, "d_sae": data.d_sae, "corpus_tokens": int(data.state.tokens),
                     "top_k": data.state.k, "samples": data.state.samples,
                     "density": (data.state.count.double() / max(1, data.state.tokens)).tolist()},
    }  # fmt: skip


def export_delphi(
    folder: str | Path, out: str | Path, *, module: str | None = None, splits: int = 5,
    model: str | None = None, pad_token: int = 0,
) -> Path:  # fmt: skip
    """Write the atlas at `folder` as delphi's latent cache under `out` (delphi's `latents`
    folder): `out/<module>/config.json` and `splits` files of features. `module` defaults to the
    dictionary's address, `model` (the tokenizer delphi loads unless given one) to the atlas's
    model; positions past a short window's end hold `pad_token`."""
    from safetensors.torch import save

    data = open_atlas(folder)
    if splits < 1 or splits > data.d_sae:
        raise AtlasError(f"--splits {splits} must be 1 to {data.d_sae} (the dictionary's width)")
    spec = data.manifest.spec
    name = module or str((spec.get("dictionary") or {}).get("address") or "atlas")
    if not name or "/" in name or name.startswith("."):
        raise AtlasError(f"module name {name!r} is not a folder name; pass --module NAME")
    target = Path(out) / name
    if target.exists() and any(target.iterdir()):
        raise AtlasError(
            f"{target} is not empty; pass another --out (delphi reads every file there)"
        )
    target.mkdir(parents=True, exist_ok=True)
    locations, values = _entries(data)
    tokens = data.contexts["window_tokens"].clone()
    tokens[tokens < 0] = pad_token
    bounds = torch.linspace(0, data.d_sae, splits + 1).long().tolist()
    for first, stop in itertools.pairwise(bounds):
        mask = (locations[:, 2] >= first) & (locations[:, 2] < stop)
        part = locations[mask].clone()
        part[:, 2] -= first
        body = {"locations": part.contiguous(), "activations": values[mask].contiguous(),
                "tokens": tokens.contiguous()}  # fmt: skip
        write_atomic(target / f"{first}_{stop - 1}.safetensors", save(body))
    config = _config(data, name, splits, model or str(spec.get("model") or ""))
    write_atomic(target / "config.json", (json.dumps(config, indent=1) + "\n").encode())
    return target
