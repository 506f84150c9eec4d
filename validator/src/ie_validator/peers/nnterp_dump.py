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


# Forward order of nnterp's standardized names inside one layer.
_IN_LAYER = (
    "layers_input",
    "attentions_input",
    "attention_probabilities",
    "attentions_output",
    "mlps_input",
    "mlps_output",
    "layers_output",
)


def _order(accessor: str) -> tuple[int, int, int]:
    m = _ITEM.fullmatch(accessor)
    name = m.group("name") if m else accessor
    if name == "token_embeddings":
        return (0, 0, 0)
    if name in _IN_LAYER and m and m.group("index") is not None:
        return (1, int(m.group("index")), _IN_LAYER.index(name))
    return (2, 0 if name == "ln_final" else 1, 0)


def _clone(node):
    return (node[0] if isinstance(node, tuple) else node).clone()


def _tensor(value) -> torch.Tensor:
    return value.detach().to(torch.float32).contiguous().clone()


def main(request_path: str, out_path: str) -> int:
    torch.set_num_threads(int(os.environ.get("IE_TORCH_THREADS", "1")))
    torch.set_grad_enabled(False)
    with open(request_path) as fh:
        request = json.load(fh)
    needs_probs = any(a.startswith("attention_probabilities") for a in request["requests"].values())
    # Eager attention like every other engine (sdpa drops Gemma 2's attention softcap);
    # enable_attention_probs selects eager attention itself and refuses a second setting.
    extra = {} if needs_probs else {"attn_implementation": "eager"}
    extra.update(request.get("kwargs", {}))
    model = StandardizedTransformer(
        request["model"], enable_attention_probs=needs_probs, dtype=torch.float32, **extra
    )
    batch = torch.tensor([request["ids"]])
    tensors, errors = {}, {}
    items = sorted(request["requests"].items(), key=lambda kv: _order(kv[1]))
    try:
        # One forward for every request, asked for in execution order (nnsight requires it).
        # Clone inside the trace: HF code may later modify a module's output in place (Falcon
        # adds attention into the MLP output), and save() keeps a reference.
        with model.trace(batch):
            saved = {key: _clone(_resolve(model, accessor)).save() for key, accessor in items}
        tensors = {key: _tensor(value) for key, value in saved.items()}
    except Exception:
        tensors = {}
        for key, accessor in items:  # one trace per request, so one bad accessor is isolated
            try:
                with model.trace(batch):
                    value = _clone(_resolve(model, accessor)).save()
                tensors[key] = _tensor(value)
            except Exception as exc:
                text = str(exc).splitlines()[0] if str(exc) else ""
                errors[key] = f"{type(exc).__name__}: {text}"[:400]
    save_file(tensors, out_path)
    from importlib.metadata import version

    packages = ("nnterp", "nnsight", "torch", "transformers")
    meta = {"errors": errors, "versions": {name: version(name) for name in packages}}
    with open(out_path + ".json", "w") as fh:
        json.dump(meta, fh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], sys.argv[2]))
