"""SAELens parity record: SAELens writes a folder per architecture and encodes activations with
its own `SAE.encode`; `ie_core.experiments.saes.load_sae` reads the same folder and `sae_math.encode` encodes
the same activations; the record holds the max abs difference per architecture.

sae-lens pins a transformer-lens below the one this workspace locks, so it runs from a separate
virtual environment, as a subprocess of this script (`--saelens-python`):

    uv venv /tmp/saelens && uv pip install --python /tmp/saelens/bin/python sae-lens torch==2.13.0
    uv run --locked python packages/ie-core/scripts/saelens_parity.py --saelens-python /tmp/saelens/bin/python

The activations are SmolLM2-135M's `resid_post.10` (and `mlp_in.10` / `mlp_out.10` for the
transcoder) on a few prompts, captured on eager. Writes docs/notes/saelens_parity.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
OUT = ROOT / "docs" / "notes" / "saelens_parity"
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
PROMPTS = ["The capital of France is Paris, and the capital of Italy is", "def add(a, b): return"]
D_SAE = 1024
# (architecture, SAELens class, hook read, hook written or None)
ARCHS = [
    ("standard", "StandardSAE", "blocks.10.hook_resid_post", None),
    ("jumprelu", "JumpReLUSAE", "blocks.10.hook_resid_post", None),
    ("topk", "TopKSAE", "blocks.10.hook_resid_post", None),
    ("transcoder", "Transcoder", "blocks.10.ln2.hook_normalized", "blocks.10.hook_mlp_out"),
]


def saelens_side(work: Path) -> None:
    """Runs in the sae-lens environment: build, save and encode with SAELens itself."""
    import sae_lens
    import torch
    from safetensors.torch import load_file, save_file

    acts = load_file(str(work / "acts.safetensors"))
    out: dict[str, torch.Tensor] = {}
    for arch, cls_name, hook, hook_out in ARCHS:
        cls = getattr(sae_lens, cls_name)
        cfg_cls = getattr(sae_lens, cls_name + "Config")
        x = acts["in" if hook_out else "resid"]
        kw = {"d_in": x.shape[-1], "d_sae": D_SAE, "apply_b_dec_to_input": hook_out is None}
        if arch == "topk":
            kw["k"] = 32
        if hook_out:
            kw["d_out"] = x.shape[-1]
        cfg = cfg_cls(**kw)
        cfg.metadata.hook_name = hook
        if hook_out:
            cfg.metadata.hook_name_out = hook_out
        sae = cls(cfg)
        g = torch.Generator().manual_seed(len(arch))
        with torch.no_grad():
            d = x.shape[-1]
            sae.W_enc.copy_(torch.randn(d, D_SAE, generator=g) / d**0.5)
            sae.W_dec.copy_(torch.randn(D_SAE, sae.W_dec.shape[1], generator=g) / 4)
            sae.b_enc.copy_(torch.randn(D_SAE, generator=g) / 4)
            sae.b_dec.copy_(torch.randn(sae.b_dec.shape[0], generator=g) / 8)
            if arch == "jumprelu":
                sae.threshold.copy_(torch.rand(D_SAE, generator=g) * 0.5)
        sae.save_model(work / arch)
        loaded = cls.load_from_disk(work / arch)  # SAELens's own reader of what it wrote
        with torch.no_grad():
            out[arch] = loaded.encode(x.float()).contiguous()
    save_file(out, str(work / "saelens.safetensors"))
    (work / "versions.json").write_text(json.dumps({"sae_lens": sae_lens.__version__}))


def ours(work: Path, saelens_python: str) -> dict:
    import torch
    from ie_core.experiments.sae_math import encode
    from ie_core.experiments.saes import load_sae
    from ie_core.loading import load_model
    from ie_core.runner import run
    from safetensors.torch import load_file, save_file

    model = load_model(MODEL, backend="eager", dtype="float32")
    ids = [model.to_tokens(p)[:8] for p in PROMPTS]  # one length: eager does not pad
    cache = run(model.capture(ids, ["resid_post.10", "mlp_in.10"]))
    acts = {"resid": cache["resid_post.10"].reshape(-1, model.d_model).contiguous(),
            "in": cache["mlp_in.10"].reshape(-1, model.d_model).contiguous()}  # fmt: skip
    save_file(acts, str(work / "acts.safetensors"))
    cmd = [saelens_python, __file__, "--saelens-side", str(work)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    record: dict = {"command": " ".join(["uv run --locked python", *sys.argv]),
                    "model": MODEL, "point": "resid_post.10 (transcoder: mlp_in.10 -> mlp_out.10)",
                    "rows": int(acts["resid"].shape[0]), "d_sae": D_SAE}  # fmt: skip
    if done.returncode != 0:
        record["error"] = done.stderr.strip().splitlines()[-1] if done.stderr else "no output"
        return record
    theirs = load_file(str(work / "saelens.safetensors"))
    record["versions"] = json.loads((work / "versions.json").read_text())
    results = {}
    for arch, _, _, hook_out in ARCHS:
        sae = load_sae(work / arch)
        x = acts["in" if hook_out else "resid"]
        mine = encode(x, sae.weights, sae.meta)
        diff = float((mine - theirs[arch]).abs().max())
        active = float((theirs[arch] > 0).float().sum(-1).mean())
        results[arch] = {"address": sae.address, "out_address": sae.out_address,
                         "max_abs_diff": diff, "max_abs_activation": float(theirs[arch].abs().max()),
                         "mean_active_features": active,
                         "same_active_set": bool(torch.equal(mine > 0, theirs[arch] > 0))}  # fmt: skip
    record["results"] = results
    return record


def write(record: dict) -> None:
    record["when"] = datetime.now(UTC).isoformat(timespec="seconds")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    lines = ["# SAELens parity", "", f"Command: `{record['command']}`", "",
             f"{record['model']}, {record['point']}, {record['rows']} rows, d_sae {record['d_sae']}; "
             "SAELens writes each folder and encodes with its own `SAE.encode`; ie reads the "
             "folder with `load_sae` and encodes with `sae_math.encode` (fp32 CPU).", ""]  # fmt: skip
    if "error" in record:
        lines.append(f"Not run: sae-lens failed with `{record['error']}`.")
    else:
        lines.append(f"sae-lens {record['versions']['sae_lens']}.")
        lines += ["", "| architecture | ie address | max abs diff | max activation | same active set |",
                  "| --- | --- | ---: | ---: | --- |"]  # fmt: skip
        for arch, r in record["results"].items():
            where = r["address"] + (
                f" -> {r['out_address']}" if r["out_address"] != r["address"] else ""
            )
            lines.append(f"| {arch} | {where} | {r['max_abs_diff']:.3g} | "
                         f"{r['max_abs_activation']:.3g} | {r['same_active_set']} |")  # fmt: skip
    OUT.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--saelens-python", help="python of a virtual environment with sae-lens")
    ap.add_argument("--saelens-side", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.saelens_side is not None:
        saelens_side(args.saelens_side)
        return
    if not args.saelens_python:
        ap.error("--saelens-python is required (see the module docstring)")
    with tempfile.TemporaryDirectory() as tmp:
        write(ours(Path(tmp), args.saelens_python))


if __name__ == "__main__":
    main()
