"""Synthetic families: each builds offline, loads with eager attention, runs, and is deterministic."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from ie_core.errors import ModelNotFoundError
from ie_core.models import resolve_model_path
from ie_eager import synthetic
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

PROMPT = "The capital of France is Paris, and the capital of Japan is Tokyo."
ALL = sorted(synthetic.FAMILIES)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """Every family built once into a private cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("IE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield {family: synthetic.build(family) for family in ALL}


def _digests(folder: Path) -> dict[str, str]:
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.iterdir())
    }


def _head_dim(config) -> int:
    explicit = getattr(config, "head_dim", None)
    return explicit or config.hidden_size // config.num_attention_heads


def test_required_families_are_present() -> None:
    required = {
        "gpt2", "gpt-neox", "gpt-j", "opt", "bloom", "llama", "mistral", "qwen2", "qwen3",
        "qwen3-moe", "mixtral", "gemma", "gemma2", "gemma3", "olmo2", "phi3", "phi", "granite",
        "starcoder2", "cohere",
    }  # fmt: skip
    assert required <= set(synthetic.FAMILIES)


def test_recipes_are_exactly_the_registrys_synthetic_families() -> None:
    """One family list: every recipe has a registry entry (so a cheat-sheet page) and every
    registry family marked synthetic has a recipe, in the same order (sweeps follow it)."""
    from ie_core.grammar import FAMILIES

    assert list(synthetic.FAMILIES) == [f.slug for f in FAMILIES if f.synthetic]
    for f in FAMILIES:
        if f.synthetic:
            assert synthetic.FAMILIES[f.slug].architecture in f.hf_classes, f.slug


@pytest.mark.parametrize("family", ALL)
def test_family_loads_eager_and_runs(built: dict[str, Path], family: str) -> None:
    folder = built[family]
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    config = model.config
    assert config.architectures == [synthetic.FAMILIES[family].architecture]
    assert type(model).__name__ == synthetic.FAMILIES[family].architecture
    assert config.vocab_size == len(tokenizer) == synthetic.VOCAB_SIZE
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (
        tokenizer.bos_token_id,
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
    )
    assert config.hidden_size == 128
    assert _head_dim(config) in {32, 64}
    assert all(p.dtype == torch.float32 for p in model.parameters())
    inputs = tokenizer(PROMPT, return_tensors="pt")
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape == (1, inputs.input_ids.shape[1], synthetic.VOCAB_SIZE)
    assert torch.isfinite(logits).all()
    assert logits.std() > 0.05  # not a flat distribution


def test_every_parameter_is_non_constant(built: dict[str, Path]) -> None:
    # Constant norm gains and zero biases would hide bugs that drop or double-apply them.
    for family, folder in built.items():
        for name, tensor in load_file(folder / "model.safetensors").items():
            flat = tensor.flatten()
            assert flat.numel() == 1 or not bool((flat == flat[0]).all()), (family, name)


def test_build_is_deterministic(
    built: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IE_CACHE_DIR", str(tmp_path))
    for family in ALL:
        again = synthetic.build(family)
        assert again != built[family]
        assert _digests(again) == _digests(built[family]), family
        first = load_file(built[family] / "model.safetensors")
        second = load_file(again / "model.safetensors")
        assert first.keys() == second.keys()
        assert all(torch.equal(first[key], second[key]) for key in first), family


def test_different_families_get_different_weights(built: dict[str, Path]) -> None:
    # llama and mistral have identical shapes: only the per-family seed tells them apart.
    llama = load_file(built["llama"] / "model.safetensors")
    mistral = load_file(built["mistral"] / "model.safetensors")
    assert llama.keys() == mistral.keys()
    assert not any(torch.equal(llama[key], mistral[key]) for key in llama)


def test_tokenizer_round_trips_and_has_a_chat_template(built: dict[str, Path]) -> None:
    tokenizer = AutoTokenizer.from_pretrained(built["llama"])
    ids = tokenizer(PROMPT).input_ids
    assert ids[0] == synthetic.BOS_ID
    assert len(ids) < len(PROMPT) // 2  # merges learned, not byte by byte
    assert tokenizer.decode(ids, skip_special_tokens=True) == PROMPT
    assert tokenizer.convert_ids_to_tokens(list(range(4))) == list(synthetic.SPECIAL_TOKENS)
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "<bos><|user|>\nhi<eos>\n<|assistant|>\n"


@pytest.mark.parametrize(
    ("family", "settings"),
    [
        ("gpt-neox", {"use_parallel_residual": True}),
        ("mistral", {"sliding_window": 8}),
        ("gemma2", {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}),
        ("qwen3-moe", {"mlp_only_layers": [0], "decoder_sparse_step": 1}),
        ("granite", {"embedding_multiplier": 6.0, "residual_multiplier": 0.5}),
        (
            "granitemoehybrid",
            {"residual_multiplier": 0.5, "num_local_experts": 4, "logits_scaling": 2.0},
        ),
    ],
)
def test_family_quirks_survive_in_config(
    built: dict[str, Path], family: str, settings: dict[str, object]
) -> None:
    config = AutoConfig.from_pretrained(built[family])
    assert {key: getattr(config, key) for key in settings} == settings


def test_gemma3_mixes_sliding_and_global_layers(built: dict[str, Path]) -> None:
    config = AutoConfig.from_pretrained(built["gemma3"])
    assert set(config.layer_types) == {"sliding_attention", "full_attention"}
    assert type(config).__name__ == "Gemma3TextConfig"


def test_unknown_family_names_the_known_ones() -> None:
    with pytest.raises(ModelNotFoundError, match="llama") as caught:
        synthetic.source("ie-synthetic/not-a-family")
    assert "not-a-family" in str(caught.value)


def test_resolves_through_the_entry_point(built: dict[str, Path]) -> None:
    assert resolve_model_path("ie-synthetic/llama") == built["llama"]


def test_concurrent_builders_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IE_CACHE_DIR", str(tmp_path))
    with ThreadPoolExecutor(4) as pool:
        folders = set(pool.map(synthetic.build, ["qwen3"] * 4))
    assert folders == {synthetic.family_dir("qwen3")}
    assert [p.name for p in (tmp_path / "synthetic").iterdir()] == ["qwen3-v1"]  # no temp left
