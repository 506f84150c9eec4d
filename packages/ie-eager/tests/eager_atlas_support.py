"""Helpers for the atlas tests: dictionaries written in SAELens's and circuit-tracer's formats,
and a brute-force reference written independently of `ie_core.atlas` (a plain Hugging Face
forward per window, the encode spelled out, `torch.topk` over every token of the corpus)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
D_MODEL = 576


def write_saelens(folder: Path, *, layer: int, d_sae: int, seed: int, d_in: int = D_MODEL) -> Path:
    """A ReLU SAE at resid_post.`layer` in SAELens's folder layout (cfg.json + weights)."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    weights = {
        "W_enc": torch.randn(d_in, d_sae, generator=g) / d_in**0.5,
        "b_enc": torch.randn(d_sae, generator=g) * 0.2 - 0.6,
        "W_dec": torch.randn(d_sae, d_in, generator=g) / d_sae**0.5,
        "b_dec": torch.randn(d_in, generator=g) * 0.01,
    }
    save_file(weights, str(folder / "sae_weights.safetensors"))
    cfg = {"architecture": "standard", "d_in": d_in, "d_sae": d_sae,
           "hook_name": f"blocks.{layer}.hook_resid_post", "apply_b_dec_to_input": False,
           "activation_fn_str": "relu"}  # fmt: skip
    (folder / "cfg.json").write_text(json.dumps(cfg))
    return folder


def write_circuit_tracer(folder: Path, *, layer: int, d_tc: int, seed: int) -> Path:
    """A JumpReLU transcoder in circuit-tracer's per-layer file (W_enc / W_dec [d_tc, d_model])."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"layer_{layer}.safetensors"
    save_file({
        "W_enc": torch.randn(d_tc, D_MODEL, generator=g) / D_MODEL**0.5 * 4,
        "W_dec": torch.randn(d_tc, D_MODEL, generator=g) / d_tc**0.5,
        "b_enc": torch.randn(d_tc, generator=g) * 0.2 - 0.3,
        "b_dec": torch.zeros(D_MODEL),
        "activation_function.threshold": torch.rand(d_tc, generator=g) * 0.2,
    }, str(path))  # fmt: skip
    return path


def reference_windows(tokenizer: Any, documents: list[str], context: int) -> list[list[int]]:
    """Packed windows of `context` tokens, no BOS (SmolLM2's tokenizer adds none), last one short."""
    ids = [t for d in documents for t in tokenizer(d, add_special_tokens=False).input_ids]
    return [ids[i : i + context] for i in range(0, len(ids), context)]


def reference_rows(hf: Any, windows: list[list[int]], where: tuple[str, int]) -> torch.Tensor:
    """Rows `[n_tokens, d_model]` at resid_post.L (a block's output) or mlp_in.L (the
    post-attention norm's output), one plain forward per window, in corpus order."""
    kind, layer = where
    rows: list[torch.Tensor] = []
    seen: list[torch.Tensor] = []
    hook = None
    if kind == "mlp_in":
        norm = hf.model.layers[layer].post_attention_layernorm
        hook = norm.register_forward_hook(lambda _m, _i, out: seen.append(out[0]))
    try:
        with torch.no_grad():
            for w in windows:
                out = hf(torch.tensor([w]), output_hidden_states=True)
                rows.append(out.hidden_states[layer + 1][0] if kind == "resid_post" else seen.pop())
    finally:
        if hook is not None:
            hook.remove()
    return torch.cat(rows).float()


def encode(
    rows: torch.Tensor, w: dict[str, torch.Tensor], threshold: torch.Tensor | None
) -> torch.Tensor:
    pre = rows @ w["W_enc"] + w["b_enc"]
    acts = torch.relu(pre)
    return acts if threshold is None else acts * (pre > threshold)


def brute_force(acts: torch.Tensor, windows: list[list[int]], k: int) -> dict[str, Any]:
    """Per feature: `torch.topk` over every token, with each value's (window, position)."""
    seq = torch.cat([torch.full((len(w),), i) for i, w in enumerate(windows)])
    pos = torch.cat([torch.arange(len(w)) for w in windows])
    values, index = torch.topk(acts, k, dim=0)  # [k, d_sae]
    return {"values": values.T, "sequence": seq[index].T, "position": pos[index].T,
            "count": (acts > 0).sum(0), "seq": seq, "pos": pos}  # fmt: skip
