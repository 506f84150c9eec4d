"""The SAEDashboard 0.8.0 cell of `atlas_throughput.py`, run by that script with the python of a
separate environment (sae-dashboard pins its own sae-lens and transformer-lens). Same work: the
same SmolLM2 folder (through TransformerLens, unprocessed weights), the same dictionary (the
SAELens-layout folder's weights loaded into a SAELens `StandardSAE`), the same windows, every
feature of the dictionary (`SaeVisRunner`: top activations, quantile intervals, histograms,
logits). Windows shorter than the first are left out (SAEDashboard takes one `[batch, seq]`
tensor); the tokens counted are those it read. `saedashboard_features` (a subset, features 0..n-1)
keeps the run to minutes: its time is scaled linearly to the whole dictionary (recorded as an
estimate beside the measured subset). Prints one JSON object.

    /path/to/saedash-env/bin/python atlas_saedashboard.py --config JSON
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path
from typing import Any


def load_sae(folder: Path, hook: str) -> Any:
    from sae_lens import StandardSAE, StandardSAEConfig
    from sae_lens.saes.sae import SAEMetadata
    from safetensors.torch import load_file

    cfg = json.loads((folder / "cfg.json").read_text())
    sae = StandardSAE(StandardSAEConfig(
        d_in=cfg["d_in"], d_sae=cfg["d_sae"], apply_b_dec_to_input=False, dtype="float32",
        device="cpu", metadata=SAEMetadata(hook_name=hook),
    ))  # fmt: skip
    sae.load_state_dict(load_file(str(folder / "sae_weights.safetensors")))
    return sae


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    cfg = json.loads(ap.parse_args().config)
    import torch
    import transformer_lens.loading_from_pretrained as loading
    from sae_dashboard.sae_vis_data import SaeVisConfig
    from sae_dashboard.sae_vis_runner import SaeVisRunner
    from sae_lens import HookedSAETransformer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_grad_enabled(False)
    # TransformerLens loads only the models it lists by name; SmolLM2 is a Llama it converts from
    # the local folder's config (logits checked against HF's: 6.5e-5 of 31 on SmolLM2-135M).
    loading.OFFICIAL_MODEL_NAMES.append(cfg["model"])
    hf = AutoModelForCausalLM.from_pretrained(cfg["model"], dtype=torch.float32)
    model = HookedSAETransformer.from_pretrained_no_processing(
        cfg["model"], hf_model=hf, tokenizer=AutoTokenizer.from_pretrained(cfg["model"]),
        device="cpu", dtype=torch.float32,
    )  # fmt: skip
    del hf
    hook = f"blocks.{cfg['layer']}.hook_resid_post"
    sae = load_sae(Path(cfg["dictionary"]), hook)
    windows = json.loads(Path(cfg["windows"]).read_text())
    tokens = torch.tensor([w for w in windows if len(w) == len(windows[0])])
    batch = cfg.get("saedashboard_feature_batch", 1024)

    def dashboard(features: range, rows: torch.Tensor) -> None:
        vis = SaeVisConfig(hook_point=hook, features=features, minibatch_size_features=batch,
                           minibatch_size_tokens=64, device="cpu", dtype="float32")  # fmt: skip
        SaeVisRunner(vis).run(encoder=sae, model=model, tokens=rows)

    features = min(cfg["width"], cfg.get("saedashboard_features") or cfg["width"])
    dashboard(range(8), tokens[:2])  # warm
    began = time.perf_counter()
    dashboard(range(features), tokens)
    seconds = time.perf_counter() - began
    n = int(tokens.numel())
    # Its work grows with the features asked for (a forward per feature batch, then each
    # feature's sequences): a subset's time scaled to the whole dictionary, marked as such.
    scaled = seconds * cfg["width"] / features
    print(json.dumps({
        "tokens": n, "windows": int(tokens.shape[0]), "features": features,
        "seconds": seconds, "seconds_every_feature_estimated": scaled,
        "tokens_per_s": n / scaled, "tokens_per_s_measured_subset": n / seconds,
        "feature_batch": batch,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "peak_rss_child_mib": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
