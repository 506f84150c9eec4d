"""Run inside the nnterp environment: capture the requested accessors, write one safetensors dump.

usage: python nnterp_dump.py REQUEST.json OUT.safetensors
REQUEST.json: {"model": folder, "ids": [...], "requests": {"resid_post.3": "layers_output[3]", ...}}
Errors per key go to OUT.safetensors.errors.json, so one bad accessor does not sink the rest.
"""

from __future__ import annotations

import json
import os
import re
import sys

import torch
from nnterp import StandardizedTransformer
from safetensors.torch import save_file

_ITEM = re.compile(r"^(?P<name>\w+)(?:\[(?P<index>\d+)\])?(?:\.(?P<io>input|output))?$")


def _resolve(model, accessor: str):
    m = _ITEM.fullmatch(accessor)
    if m is None:
        raise ValueError(f"bad nnterp accessor {accessor!r}")
    node = getattr(model, m.group("name"))
    if m.group("index") is not None:
        node = node[int(m.group("index"))]
    if m.group("io"):
        node = getattr(node, m.group("io"))
    return node


def main(request_path: str, out_path: str) -> int:
    torch.set_num_threads(int(os.environ.get("IE_TORCH_THREADS", "1")))
    torch.set_grad_enabled(False)
    with open(request_path) as fh:
        request = json.load(fh)
    needs_probs = any(a.startswith("attention_probabilities") for a in request["requests"].values())
    # Eager attention like every other engine (sdpa drops Gemma 2's attention softcap);
    # enable_attention_probs selects eager attention itself and refuses a second setting.
    extra = {} if needs_probs else {"attn_implementation": "eager"}
    model = StandardizedTransformer(
        request["model"], enable_attention_probs=needs_probs, dtype=torch.float32, **extra
    )
    batch = torch.tensor([request["ids"]])
    tensors, errors = {}, {}
    for key, accessor in request["requests"].items():
        try:
            # Clone inside the trace: HF code may later modify a module's output in place
            # (Falcon adds attention into the MLP output), and save() keeps a reference.
            with model.trace(batch):
                node = _resolve(model, accessor)
                saved = (node[0] if isinstance(node, tuple) else node).clone().save()
            value = saved
            tensors[key] = value.detach().to(torch.float32).contiguous().clone()
        except Exception as exc:  # one bad accessor is reported, not fatal
            errors[key] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[
                :400
            ]
    save_file(tensors, out_path)
    import nnsight
    import nnterp
    import transformers

    meta = {
        "errors": errors,
        "versions": {
            "nnterp": getattr(nnterp, "__version__", "?"),
            "nnsight": getattr(nnsight, "__version__", "?"),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
    }
    with open(out_path + ".json", "w") as fh:
        json.dump(meta, fh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], sys.argv[2]))
