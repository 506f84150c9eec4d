"""A plain-HF reference: forward hooks on the modules the nnsight table names.

Used as the reference only when this project's eager backend is not installed; it reads the same
module boundaries nnsight does, so it is a cross-check of the table, not independent evidence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ie_validator.engines.accessor import parse_accessor
from ie_validator.engines.base import Capture, CaptureFailure, ModelSpec, Request, canonical
from ie_validator.mappings import Gap, Hook, lookup
from ie_validator.scoring import Tier


def _first_input(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if args:
        return args[0]
    if "hidden_states" in kwargs:
        return kwargs["hidden_states"]
    return next(iter(kwargs.values()))


class HFHooksEngine:
    name = "hf-hooks"
    tier = Tier.RAW_HF

    def capture(self, model: ModelSpec, ids: Sequence[int], requests: Sequence[Request]) -> Capture:
        import torch
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(model.path, dtype=torch.float32).eval()
        out: Capture = {}
        handles = []
        for req in requests:
            entry = lookup("nnsight", model.family, req.address.name)
            if not isinstance(entry, Hook):
                out[req.key] = entry if isinstance(entry, Gap) else Gap("unmapped")
                continue
            acc = parse_accessor(entry.at(req.address.layer))
            try:
                module = hf.get_submodule(acc.module)
            except AttributeError:
                out[req.key] = Gap(f"no module {acc.module} on this model")
                continue

            def hook(
                _m: Any, args: Any, kwargs: Any, output: Any, key: str = req.key, acc: Any = acc
            ) -> None:
                value = _first_input(args, kwargs) if acc.io == "input" else output
                if acc.index is not None:
                    value = value[acc.index]
                try:
                    out[key] = canonical(key.split(".")[0], value)
                except TypeError as exc:
                    out[key] = CaptureFailure(f"hf-hooks: {exc}")

            handles.append(module.register_forward_hook(hook, with_kwargs=True))
        try:
            with torch.no_grad():
                hf(torch.tensor([list(ids)]))
        finally:
            for h in handles:
                h.remove()
        return out
