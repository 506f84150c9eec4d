"""What `ie_eager.load` refuses, by name: non-causal models, folders that are not models, weights
that are missing, and a model used after `shutdown()`.

The checkpoints are tiny random-weight folders written here, each with a working tokenizer, so
the only thing that can stop them loading is the check under test.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from eager_support import PROMPT
from ie_core.errors import InterpError
from ie_core.runner import run
from ie_eager.backend import load
from ie_eager.synthetic import build
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertModel,
    T5Config,
    T5ForConditionalGeneration,
)

_BERT: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
}


def _with_tokenizer(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    source = build("llama")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    out = {
        "bert_mlm": _with_tokenizer(root / "bert_mlm"),
        "bert_base": _with_tokenizer(root / "bert_base"),
        "t5": _with_tokenizer(root / "t5"),
        "not_a_model": root / "not_a_model",
        "config_only": _with_tokenizer(root / "config_only"),
    }
    BertForMaskedLM(BertConfig(**_BERT)).save_pretrained(out["bert_mlm"])
    BertModel(BertConfig(**_BERT)).save_pretrained(out["bert_base"])
    t5 = T5Config(vocab_size=512, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=2)
    T5ForConditionalGeneration(t5).save_pretrained(out["t5"])
    out["not_a_model"].mkdir()
    (out["not_a_model"] / "notes.txt").write_text("not a checkpoint")
    shutil.copy(build("llama") / "config.json", out["config_only"] / "config.json")
    return out


def _refused(folder: Path, error: str, match: str) -> None:
    with pytest.raises(InterpError, match=match) as info:
        load(str(folder), device="cpu")
    assert type(info.value).__name__ == error


def test_a_bert_masked_lm_is_refused_naming_what_is_supported(folders) -> None:  # type: ignore[no-untyped-def]
    _refused(folders["bert_mlm"], "UnsupportedModelError", r"BertForMaskedLM.*decoder-only causal")


def test_a_plain_bert_model_is_refused_as_not_causal(folders) -> None:  # type: ignore[no-untyped-def]
    # transformers wraps it in BertLMHeadModel; the probe sees position 0 depend on later tokens.
    _refused(folders["bert_base"], "UnsupportedModelError", r"attends in both directions")


def test_an_encoder_decoder_is_refused(folders) -> None:  # type: ignore[no-untyped-def]
    _refused(folders["t5"], "UnsupportedModelError", r"encoder-decoder model \(t5\)")


def test_a_folder_without_a_config_is_not_a_model(folders) -> None:  # type: ignore[no-untyped-def]
    _refused(folders["not_a_model"], "ModelNotFoundError", r"holds no config\.json")


def test_a_config_without_weights_is_refused(folders) -> None:  # type: ignore[no-untyped-def]
    _refused(folders["config_only"], "ModelNotFoundError", r"weights could not be read")


def test_an_hf_object_that_is_not_causal_is_refused(folders) -> None:  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folders["bert_mlm"])
    with pytest.raises(InterpError, match="not a causal language model"):
        load(BertForMaskedLM(BertConfig(**_BERT)), tokenizer=tok, device="cpu")


def test_a_causal_model_still_loads_and_is_probed_without_side_effects() -> None:
    # Negative control for the probe: a real causal LM passes it.
    model = load(str(build("gpt2")), device="cpu")
    assert run(model.generate(model.to_tokens(PROMPT))).token_ids


def test_a_model_used_after_shutdown_raises_a_named_error() -> None:
    model = load(str(build("llama")), device="cpu")  # its own copy: the shared one stays open
    ids = model.to_tokens(PROMPT)
    run(model.shutdown())
    calls = [
        lambda: run(model.capture(ids, ["resid_post.1"])),
        lambda: run(model.generate(ids)),
        lambda: run(model.decode_residuals_topk([[0.0] * 128], 3)),
        lambda: model.forward_with_cache(ids, ["resid_post.1"]),
        lambda: model.to_tokens(PROMPT),
    ]
    for call in calls:
        with pytest.raises(InterpError, match="shut down") as info:
            call()
        assert type(info.value).__name__ == "ModelClosedError"
    run(model.shutdown())  # a second shutdown is harmless
