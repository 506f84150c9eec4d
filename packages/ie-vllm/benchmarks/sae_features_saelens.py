"""The SAELens + TransformerLens cell of `sae_features.py`, run by that script as a subprocess
with the python of a separate environment holding sae-lens (it pins a transformer-lens below the
workspace's). Same work: generate `concurrency` greedy continuations of one prompt as a batch,
run the generated ids with a cache, and take the top-k of each TopK SAE's `encode` at every
token. Prints one JSON object of median seconds per cell ("plain" is the generation alone).

    /path/to/saelens-env/bin/python sae_features_saelens.py --model-folder DIR --config JSON
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any


def dictionaries(d: int, width: int, layers: list[int], k: int) -> dict[str, Any]:
    import torch
    from sae_lens import TopKSAE, TopKSAEConfig

    out = {}
    for i, layer in enumerate(layers):
        sae = TopKSAE(TopKSAEConfig(d_in=d, d_sae=width, k=k, apply_b_dec_to_input=True))
        g = torch.Generator().manual_seed(i)
        with torch.no_grad():
            sae.W_enc.copy_(torch.randn(d, width, generator=g) / d**0.5)
            sae.W_dec.copy_(torch.randn(width, d, generator=g) / 4)
        out[f"blocks.{layer}.hook_out"] = sae  # TransformerBridge's name for resid_post
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-folder", required=True)
    ap.add_argument("--config", required=True, help="JSON: prompt, sets, width, k, ...")
    args = ap.parse_args()
    cfg = json.loads(args.config)
    import torch
    from sae_lens import SAETransformerBridge

    torch.set_grad_enabled(False)
    model = SAETransformerBridge.boot_transformers(
        args.model_folder, device="cpu", dtype=torch.float32
    )
    d = int(model.cfg.d_model)
    sets = {n: dictionaries(d, cfg["width"], layers, cfg["k"]) for n, layers in cfg["sets"].items()}
    tokens = model.to_tokens([cfg["prompt"]] * cfg["concurrency"])

    def generate() -> Any:
        return model.generate(tokens, max_new_tokens=cfg["new_tokens"], do_sample=False,
                              verbose=False, stop_at_eos=False)  # fmt: skip

    def with_features(saes: dict[str, Any]) -> None:
        ids = generate()[:, :-1]
        _, cache = model.run_with_cache(ids, names_filter=list(saes))
        for hook, sae in saes.items():
            sae.encode(cache[hook]).topk(cfg["k"], dim=-1)

    def timed(fn: Any) -> float:
        fn()  # warm
        runs = []
        for _ in range(cfg["repeats"]):
            t0 = time.perf_counter()
            fn()
            runs.append(time.perf_counter() - t0)
        return statistics.median(runs)

    cells = {"plain": timed(generate)}
    for name, saes in sets.items():
        cells[name] = timed(lambda s=saes: with_features(s))
    print(json.dumps(cells))


if __name__ == "__main__":
    main()
